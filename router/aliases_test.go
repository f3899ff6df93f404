package router

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"testing"

	"github.com/switchyard-dev/switchyard/router/httpfront"
	"github.com/switchyard-dev/switchyard/services/enginesim"
)

// hfID is a model id with a slash and dots, as vLLM serves it.
const hfID = "meta-llama/Llama-3.1-8B-Instruct"

// serveAliased serves hfID under the alias "llama-8b" on two simulated
// engines: "plain" answers to hfID, "renamed" only to "llama" (as vLLM
// started with --served-model-name llama), which its table entry says.
func serveAliased(t *testing.T, kind httpfront.ServerKind) string {
	t.Helper()
	var engines []enginesim.Options
	for _, e := range []struct{ name, served string }{{"plain", ""}, {"renamed", "llama"}} {
		engines = append(engines, enginesim.Options{Name: e.name, ServedModel: e.served, MaxBatch: 8, BaseTBTMs: 1,
			OutputTokens: 4, PromptTokens: 8, Seed: 1})
	}
	tables := simTables(t, hfID, engines...)
	h, err := NewHandler(Options{Tables: tables, Aliases: map[string]string{"llama-8b": hfID}})
	if err != nil {
		t.Fatal(err)
	}
	return serveFront(t, kind, h, httpfront.ServerOptions{})
}

// TestAliasesAndServedNames checks that requests under the model id and
// under an alias reach both engines, each under the name it serves (the
// simulator answers 404 to any other name, as vLLM does), that the answer
// is the engine's, and that /v1/models lists the id and the alias as they
// are, /v1/models/{id} taking the id's slash escaped or not.
func TestAliasesAndServedNames(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		base := serveAliased(t, kind)
		c := testClient(t)
		seen := map[string]int{}
		for i := range 24 {
			model := hfID
			if i%2 == 1 {
				model = "llama-8b"
			}
			body := `{"model":"` + model + `","messages":[{"role":"user","content":"hi ` + string(rune('a'+i)) + `"}]}`
			status, engine, out := call(t, c, http.MethodPost, base+"/v1/chat/completions", body)
			if status != http.StatusOK {
				t.Fatalf("model %q: status %d %s", model, status, out)
			}
			seen[engine]++
		}
		if seen["plain"] == 0 || seen["renamed"] == 0 {
			t.Errorf("engines that answered %v; want both", seen)
		}
		status, _, out := call(t, c, http.MethodPost, base+"/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"x"}]}`)
		if status != http.StatusNotFound {
			t.Errorf("a request for an engine's own name (not a model or alias of the router): status %d %s, want 404", status, out)
		}

		status, _, out = call(t, c, http.MethodGet, base+"/v1/models", "")
		var list struct {
			Data []modelEntry `json:"data"`
		}
		if err := json.Unmarshal(out, &list); err != nil || status != http.StatusOK || len(list.Data) != 2 ||
			list.Data[0].ID != "llama-8b" || list.Data[1].ID != hfID || list.Data[0].Root != hfID || list.Data[1].Object != "model" {
			t.Fatalf("GET /v1/models: %d %s", status, out)
		}
		for _, path := range []string{hfID, url.PathEscape(hfID), "llama-8b"} {
			status, _, out := call(t, c, http.MethodGet, base+"/v1/models/"+path, "")
			var m modelEntry
			if err := json.Unmarshal(out, &m); err != nil || status != http.StatusOK || (m.ID != hfID && m.ID != "llama-8b") || m.Root != hfID {
				t.Errorf("GET /v1/models/%s: %d %s", path, status, out)
			}
		}
	})
}

func TestCheckAliases(t *testing.T) {
	for _, bad := range []map[string]string{
		{"a b": "m"}, {"a": ""}, {"m": "m"}, {"a": "b", "b": "m"}, {"a\x00": "m"},
	} {
		if err := CheckAliases(bad); !errors.Is(err, ErrBadOption) {
			t.Errorf("CheckAliases(%q) = %v, want ErrBadOption", bad, err)
		}
	}
	if err := CheckAliases(map[string]string{"llama-8b": hfID, "gpt-4o": hfID}); err != nil {
		t.Errorf("CheckAliases of two aliases of one model: %v", err)
	}
}
