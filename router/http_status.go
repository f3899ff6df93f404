package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/protocol"
)

// writeJSON writes v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		protocol.WriteError(w, protocol.NewAPIError(http.StatusInternalServerError, protocol.ErrTypeServer, "", "", "encoding response: "+err.Error()))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// modelEntry is one model of GET /v1/models, in OpenAI's shape; Root is
// the model id an alias stands for (the model's own id for a model), as
// vLLM names it.
type modelEntry struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	Root    string `json:"root"`
}

// servedModels returns the models that have a table and the aliases of
// those models, sorted.
func (h *Handler) servedModels() []string {
	var out []string
	served := map[string]bool{}
	for _, m := range h.opts.Tables.Models() {
		if _, _, ok := h.opts.Tables.Table(m); ok {
			out = append(out, m)
			served[m] = true
		}
	}
	for alias, m := range h.opts.Aliases {
		if served[m] && !served[alias] {
			out = append(out, alias)
		}
	}
	sort.Strings(out)
	return out
}

// CheckAliases returns nil when every alias (key) and the model id it
// stands for (value) are model ids (messages.CheckModelName) and no alias
// names itself or another alias: aliases resolve in one step.
func CheckAliases(aliases map[string]string) error {
	for alias, model := range aliases {
		if err := messages.CheckModelName(alias); err != nil {
			return fmt.Errorf("%w: alias: %w", ErrBadOption, err)
		}
		if err := messages.CheckModelName(model); err != nil {
			return fmt.Errorf("%w: alias %q: %w", ErrBadOption, alias, err)
		}
		if alias == model {
			return fmt.Errorf("%w: alias %q stands for itself", ErrBadOption, alias)
		}
		if _, chained := aliases[model]; chained {
			return fmt.Errorf("%w: alias %q stands for %q, which is an alias too: name the model id", ErrBadOption, alias, model)
		}
	}
	return nil
}

func (h *Handler) serveModels(w http.ResponseWriter, r *http.Request) {
	if !getOnly(w, r, "/v1/models") {
		return
	}
	list := struct {
		Object string       `json:"object"`
		Data   []modelEntry `json:"data"`
	}{Object: "list", Data: []modelEntry{}}
	for _, m := range h.servedModels() {
		list.Data = append(list.Data, h.modelEntry(m))
	}
	writeJSON(w, http.StatusOK, list)
}

// getOnly answers 405 to a request to path that is not a GET or HEAD and
// reports whether the request may go on.
func getOnly(w http.ResponseWriter, r *http.Request, path string) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", "GET, HEAD")
	protocol.WriteError(w, protocol.NewAPIError(http.StatusMethodNotAllowed, protocol.ErrTypeInvalidRequest, "method_not_allowed", "",
		"method "+r.Method+" not allowed on "+path+"; use GET"))
	return false
}

// modelEntry returns the /v1/models entry of the served model or alias m.
func (h *Handler) modelEntry(m string) modelEntry {
	root := m
	if to, ok := h.opts.Aliases[m]; ok {
		root = to
	}
	return modelEntry{ID: m, Object: "model", Created: h.model(root).created, OwnedBy: "switchyard", Root: root}
}

// serveModel answers GET /v1/models/{id}: the model object, or a 404
// model_not_found (OpenAI's answer) when the router serves no such model.
// A model id may hold slashes (org/name), so id is the rest of the path.
func (h *Handler) serveModel(w http.ResponseWriter, r *http.Request) {
	if !getOnly(w, r, "/v1/models/{model}") {
		return
	}
	id := r.PathValue("id")
	served := id
	if to, ok := h.opts.Aliases[id]; ok {
		served = to
	}
	if _, _, ok := h.opts.Tables.Table(served); !ok || id == "" {
		protocol.WriteError(w, protocol.NewAPIError(http.StatusNotFound, protocol.ErrTypeInvalidRequest, "model_not_found", "model",
			fmt.Sprintf("the model %q does not exist or is not served by this router", id)))
		return
	}
	writeJSON(w, http.StatusOK, h.modelEntry(id))
}

func (h *Handler) serveHealth(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// ModelReadiness is one model's entry in the /readyz detail.
type ModelReadiness struct {
	// Mode is "snapshot" or "local-policy".
	Mode control.Mode `json:"mode"`
	// Generation is the installed snapshot's generation.
	Generation uint64 `json:"generation"`
	// SnapshotAgeSeconds is the snapshot's age, absent when unknown.
	SnapshotAgeSeconds *float64 `json:"snapshot_age_seconds,omitempty"`
	// Engines is the number of engines with positive weight.
	Engines int `json:"engines"`
	// Shed is the snapshot's shed fraction, 1 − Σ weights.
	Shed float64 `json:"shed"`
}

// Readiness is the /readyz detail.
type Readiness struct {
	// Ready is true when at least one model can be routed and the router
	// is not starting.
	Ready bool `json:"ready"`
	// Starting is true while the router waits to hear from the engines
	// after its start (Options.Settled); requests wait meanwhile.
	Starting bool `json:"starting,omitempty"`
	// Mode is "snapshot" when every model routes on a snapshot, else
	// "local-policy".
	Mode control.Mode `json:"mode"`
	// Cluster is the router's frontend cluster.
	Cluster string `json:"cluster,omitempty"`
	// Router is the router's name.
	Router string `json:"router,omitempty"`
	// Models holds the per-model detail.
	Models map[string]ModelReadiness `json:"models"`
}

// Readiness returns the router's readiness detail, as served on /readyz.
func (h *Handler) Readiness() Readiness {
	now := h.opts.Now()
	rd := Readiness{Mode: control.ModeSnapshot, Cluster: h.opts.Cluster, Router: h.opts.Router, Models: map[string]ModelReadiness{}}
	for _, m := range h.opts.Tables.Models() {
		t, info, ok := h.opts.Tables.Table(m)
		if !ok {
			continue
		}
		mr := ModelReadiness{Mode: info.Mode, Generation: info.Generation, Engines: len(t.Active()), Shed: 1 - t.Weight()}
		if !info.Created.IsZero() {
			age := now.Sub(info.Created).Seconds()
			mr.SnapshotAgeSeconds = &age
		}
		if info.Mode != control.ModeSnapshot {
			rd.Mode = control.ModeLocalPolicy
		}
		if t.Slots() > 0 {
			rd.Ready = true
		}
		rd.Models[m] = mr
	}
	if len(rd.Models) == 0 {
		rd.Mode = control.ModeLocalPolicy
	}
	if h.opts.Settled != nil {
		select {
		case <-h.opts.Settled:
		default:
			rd.Starting, rd.Ready = true, false
		}
	}
	return rd
}

func (h *Handler) serveReady(w http.ResponseWriter, _ *http.Request) {
	rd := h.Readiness()
	status := http.StatusOK
	if !rd.Ready {
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, rd)
}
