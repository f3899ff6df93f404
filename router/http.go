package router

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/kvindex"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/guard"
	"github.com/switchyard-dev/switchyard/router/httpfront"
	"github.com/switchyard-dev/switchyard/router/live"
	"github.com/switchyard-dev/switchyard/router/prefix"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/router/tenant"
	"github.com/switchyard-dev/switchyard/router/upstream"
)

// Limits on client-supplied header values.
const (
	maxRequestIDLen = 128
	maxSessionIDLen = 256
)

// Options configures a Handler. Tables is required.
type Options struct {
	// Tables gives the selection table per model.
	Tables control.Tables
	// Transport forwards requests to engines (default: an HTTPTransport with
	// default options).
	Transport upstream.Transport
	// Cluster is the router's frontend cluster, for logs and /readyz.
	Cluster string
	// Router is the router's name, for logs and /readyz.
	Router string
	// Logger receives the handler's logs; component=router and cluster are
	// added. The zero Logger discards.
	Logger zerolog.Logger
	// Registry receives the handler's metrics (default: a new registry). It
	// may be shared or wrapped (prometheus.WrapRegistererWith, e.g. with a
	// cluster label) when one process serves several routers' metrics.
	Registry prometheus.Registerer
	// Metrics is what /metrics serves (default: Registry, when it is a
	// prometheus.Gatherer as a *prometheus.Registry is; required otherwise).
	Metrics prometheus.Gatherer
	// MaxBodyBytes bounds request bodies (default 8 MiB); larger ones get 413.
	MaxBodyBytes int64
	// BodyReadTimeout bounds reading a request body (default 30s).
	BodyReadTimeout time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Observer is told about every routed request and every forwarding
	// outcome, e.g. a Reporter (default: none). When it is a GuardObserver
	// it is also told about priorities, shed requests and retries.
	Observer control.Observer
	// Protection tunes ejection of failing engines, retries, the retry
	// budget and load shedding (default: the defaults of each).
	Protection live.ProtectionOptions
	// Regions, when set, gives engines' regions: a retry goes to the
	// failed engine's region first.
	Regions live.RegionResolver
	// Endpoints, when set, gives engines' live endpoints (the router's
	// Signals): the handler then never picks an engine for which neither
	// its table entry nor Endpoints has an address, and SetEngineEndpoints
	// must be called as they change. Nil: every engine of a table is
	// selectable (tables that carry addresses, or a Transport that needs
	// none).
	Endpoints control.EndpointResolver
	// Aliases maps other public names of a model to the model id it is
	// served and routed under (see CheckAliases): a request for an alias
	// routes on the model's table, and the model field the engine gets is
	// the name that engine serves (selection.Engine.ServedModel, else the
	// model id). /v1/models lists the aliases of served models too.
	Aliases map[string]string
	// Settled, when set, holds requests until it is closed (each within its
	// own context): the router's start-up, until the engines' signals were
	// heard (Signals.Settled), so that a snapshot stored by an earlier run
	// is not routed on before the engines' addresses are known.
	Settled <-chan struct{}
	// Tenants, when set, is the front door both fronts apply: API keys,
	// tenants' priority ceilings and rate limits (nil: open, every request
	// at the priority it asks for, its Authorization forwarded).
	Tenants *tenant.Gate
	// KV, when set, gives each model's engine-exact prefix index, kept from
	// the engines' KV events: a request with token keys (a token-id
	// prompt, or a prompt Tokenizer tokenized) goes by the engines that
	// report holding its prefix, and by what this router routed when none
	// does (prefix.Index.PickExact). Nil: by what this router routed only.
	KV KVIndexes
	// Tokenizer, when set, gives requests' token ids as the engines compute
	// them, so that chat, responses and text completions get token keys
	// too (for both indexes); a request it cannot tokenize gets text keys.
	// Nil: only token-id prompts have token keys.
	Tokenizer protocol.Tokenizer
	// NoMetrics leaves /metrics off the handler (404 there): the Service
	// serves it on its own address (ServiceOptions.MetricsAddr).
	NoMetrics bool
}

// Handler is the router's request pipeline, which both fronts run, and its
// net/http mux: the OpenAI inference endpoints (served through
// router/httpfront), /v1/models, /healthz, /readyz and /metrics.
type Handler struct {
	opts     Options
	log      zerolog.Logger
	metrics  *metrics
	mux      *http.ServeMux
	models   sync.Map // model → *modelState
	seq      atomic.Uint64
	bufs     sync.Pool
	promHTTP http.Handler
	prot     live.ProtectionOptions
	budget   *guard.RetryBudget
	amp      *guard.AmpWindow
	tokens   tokenPool // Tokenizer's buffers
}

// modelState is the router's live state for one model.
type modelState struct {
	live   *live.LiveSet
	recent *selection.RecentKeys         // where this router sent each affinity key lately
	prefix *prefix.Index                 // which engine holds which blocks of the prompts this router routed
	kv     atomic.Pointer[kvindex.Index] // the engines' KV events' index of the model (Options.KV), once it has one
	bound  atomic.Pointer[live.Bound]
	adm    *live.Admission
	// met holds the model's metric children, made on first use.
	met atomic.Pointer[modelMetrics]
	// created is when the router first saw the model (Unix seconds): the
	// created of its /v1/models entry, stable for the process's life.
	created int64
}

// NewHandler returns a Handler for opts. It fails when Tables is nil or the
// metrics cannot be registered in opts.Registry.
func NewHandler(opts Options) (*Handler, error) {
	if opts.Tables == nil {
		return nil, errors.New("router: new handler: Options.Tables is nil")
	}
	if err := CheckAliases(opts.Aliases); err != nil {
		return nil, fmt.Errorf("router: new handler: Options.Aliases: %w", err)
	}
	if opts.Transport == nil {
		opts.Transport = upstream.NewHTTPTransport(upstream.HTTPTransportOptions{})
	}
	if opts.Registry == nil {
		reg := prometheus.NewRegistry()
		opts.Registry = reg
		if opts.Metrics == nil {
			opts.Metrics = reg
		}
	}
	if opts.Metrics == nil {
		g, ok := opts.Registry.(prometheus.Gatherer)
		if !ok {
			return nil, errors.New("router: new handler: Options.Metrics is nil and Options.Registry is no prometheus.Gatherer: say what /metrics serves")
		}
		opts.Metrics = g
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 8 << 20
	}
	if opts.BodyReadTimeout <= 0 {
		opts.BodyReadTimeout = 30 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Observer == nil {
		opts.Observer = nopObserver{}
	}
	prot := opts.Protection.WithDefaults()
	budget := guard.NewRetryBudget(prot.Budget, opts.Now)
	amp := guard.NewAmpWindow(opts.Now)
	m, err := newMetrics(opts.Registry, opts.Tables, opts.Now, budget.Tokens, amp.Ratio)
	if err != nil {
		return nil, fmt.Errorf("router: new handler: register metrics: %w", err)
	}
	h := &Handler{
		opts:    opts,
		log:     opts.Logger.With().Str("component", "router").Str("cluster", opts.Cluster).Logger(),
		metrics: m,
		mux:     http.NewServeMux(),
		bufs:    sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }},
		prot:    prot,
		budget:  budget,
		amp:     amp,
	}
	h.promHTTP = promhttp.HandlerFor(opts.Metrics, promhttp.HandlerOpts{Registry: opts.Registry})
	for _, ep := range [...]protocol.Endpoint{protocol.EndpointChat, protocol.EndpointCompletions,
		protocol.EndpointResponses, protocol.EndpointEmbeddings} {
		h.mux.Handle(ep.Path(), httpfront.InferenceHandler(httpPipeline{h}, ep))
	}
	h.mux.HandleFunc("/v1/models", h.serveModels)
	h.mux.HandleFunc("/v1/models/{id...}", h.serveModel)
	h.mux.HandleFunc("/healthz", h.serveHealth)
	h.mux.HandleFunc("/readyz", h.serveReady)
	if !opts.NoMetrics {
		h.mux.Handle("/metrics", h.promHTTP)
	}
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		protocol.WriteError(w, protocol.NewAPIError(http.StatusNotFound, protocol.ErrTypeNotFound, "not_found", "",
			fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)))
	})
	return h, nil
}

// MetricsHandler returns the /metrics handler, for a server of its own.
func (h *Handler) MetricsHandler() http.Handler { return h.promHTTP }

// ServeHTTP routes a request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// Registry returns where the handler registers its metrics.
func (h *Handler) Registry() prometheus.Registerer { return h.opts.Registry }

// Metrics returns what the handler serves on /metrics.
func (h *Handler) Metrics() prometheus.Gatherer { return h.opts.Metrics }

// Live returns the live engine state of model (in-flight counts, down
// marks), creating it if needed; guards use it to mark engines down.
func (h *Handler) Live(model string) *live.LiveSet { return h.model(model).live }

// SetEngineDown marks an engine of model down (skipped at once) or up.
func (h *Handler) SetEngineDown(model, engine string, down bool) {
	h.Live(model).SetDown(engine, down)
}

// SetEngineEndpoints records the endpoints an engine of model advertises
// now; with Options.Endpoints set, an engine is selectable only with one.
func (h *Handler) SetEngineEndpoints(model, engine string, ep control.Endpoints) {
	h.Live(model).SetEndpoints(engine, ep)
}

// ObserveSignal folds an engine's signal into the live state of its model
// (see live.LiveSet.ObserveSignal); the router service calls it for every signal
// it accepts.
func (h *Handler) ObserveSignal(sig *messages.EngineSignal) {
	h.Live(sig.Model).ObserveSignal(sig)
}

// settledOrWait returns at once when the router has settled (see
// Options.Settled), else waits for it or for ctx to end.
func (h *Handler) settledOrWait(ctx context.Context) error {
	if h.opts.Settled == nil {
		return nil
	}
	select {
	case <-h.opts.Settled:
		return nil
	default:
	}
	h.metrics.startWaits.Inc()
	select {
	case <-h.opts.Settled:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *Handler) model(name string) *modelState {
	if v, ok := h.models.Load(name); ok {
		return v.(*modelState)
	}
	ls := live.NewLiveSetFor(name, h.opts.Endpoints, h.opts.Now)
	recent, _ := selection.NewRecentKeys(selection.DefaultRecentKeys) // a valid size: never fails
	px, _ := prefix.New(prefix.Options{})                             // the defaults: never fails
	v, _ := h.models.LoadOrStore(name, &modelState{live: ls, recent: recent, prefix: px,
		adm: live.NewAdmission(h.prot), created: h.opts.Now().Unix()})
	return v.(*modelState)
}

// bind returns the Guard of model bound to t, rebinding when t is new.
func (h *Handler) bind(model string, t *selection.Table) *live.Bound {
	ms := h.model(model)
	if b := ms.bound.Load(); b != nil && b.Table() == t {
		return b
	}
	b := ms.live.Bind(t)
	ms.bound.Store(b)
	return b
}

// mimeJSON is the media type of request bodies; a Content-Type that is
// exactly it needs no parsing.
const mimeJSON = "application/json"

// newRequestID returns "req_" and 24 random hex digits (one allocation).
func (h *Handler) newRequestID() string {
	var b [12]byte
	for i := 0; i < len(b); i += 4 {
		v := rand.Uint32()
		b[i], b[i+1], b[i+2], b[i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
	}
	var id [4 + 2*len(b)]byte
	copy(id[:], "req_")
	hex.Encode(id[4:], b[:])
	return string(id[:])
}

// Metric model labels for requests rejected before a served model is known.
const (
	labelInvalid = "_invalid"
	labelUnknown = "_unknown"
	// labelTenant counts the front door's refusals: a missing or unknown
	// API key (401), a tenant over its rate (429).
	labelTenant = "_tenant"
)

// Relay copies the engine's body to w (flushing after every read), records
// the outcome and releases everything the request held
// (httpfront.Answer). ctx is the one the pipeline began with, or any
// context that has ended when the client is known to have gone away.
func (a *answer) Relay(ctx context.Context, w http.ResponseWriter) {
	defer a.release()
	n, first, err := a.h.relay(ctx, w, a.at.first, a.at.resp.Body, *a.bp)
	a.record(ctx, n, first, err)
}

// route admits and picks the first engine for a parsed request exactly as
// both fronts do: at start-up, once the engines were heard from
// (Options.Settled); the model's table, the affinity key (session id, then
// user, then prompt prefix; spread by weight without one), the snapshot's
// shed fraction for the request's priority and the local admission control
// (429 when shed), and the pick (keyed: PickRecent, keyless: PickTwo, then
// Bound.Overflow to a spare engine past a full batch) under
// the bounded-load guard, which skips engines marked
// down, without an address or ejected (all ejected: the snapshot's spare engines of weight zero,
// nearest first, then ejections are ignored). It counts the
// request with the Observer once the model is known to be served, and
// credits the retry budget. Errors: 404 for an unknown model, 429 when
// shed, 503 when no engine is available (or ctx ended while the router
// was starting). The caller must release an
// admitted request.
func (h *Handler) route(ctx context.Context, req *protocol.Request, session string, prio protocol.Priority) (*routed, *protocol.APIError) {
	if err := h.settledOrWait(ctx); err != nil {
		return nil, protocol.NewAPIError(http.StatusServiceUnavailable, protocol.ErrTypeUnavailable, "starting", "",
			fmt.Sprintf("the router is starting and has not heard from the engines of model %q yet: %v", req.Model, err))
	}
	table, info, ok := h.opts.Tables.Table(req.Model)
	if !ok {
		return nil, protocol.NewAPIError(http.StatusNotFound, protocol.ErrTypeNotFound, "model_not_found", "model",
			fmt.Sprintf("the model %q does not exist or is not served by this router", req.Model))
	}
	h.opts.Observer.Request(req.Model)
	if g, ok := h.opts.Observer.(GuardObserver); ok {
		g.Priority(req.Model, prio)
	}
	if m, ok := h.opts.Observer.(MixObserver); ok {
		m.Prompt(req.Model, protocol.PromptTokens(req))
	}
	ms := h.model(req.Model)
	bound := h.bind(req.Model, table)
	key, src := protocol.AffinityKey(session, req)
	if src == protocol.KeyNone {
		key = selection.SpreadKey(h.seq.Add(1))
	}
	u, apiErr := h.admit(req.Model, ms, info, bound, key, src, prio)
	if apiErr != nil {
		return nil, apiErr
	}
	rt := &routed{model: req.Model, table: table, bound: bound, ms: ms, key: key, src: src, prio: prio, ep: req.Endpoint}
	if info.Figures != nil {
		rt.spare = info.Figures.Spare
	}
	var idx int
	var kbuf [protocol.MaxPrefixKeys]uint64
	var keys []uint64
	switch src {
	case protocol.KeyNone:
		if idx, ok = table.PickTwo(key, bound); ok {
			var over bool
			if idx, over = bound.Overflow(idx, info.Figures); over {
				h.metrics.overflows.WithLabelValues(req.Model).Inc()
			}
		}
	case protocol.KeyPrefix:
		var tokens bool
		keys, tokens = h.prefixKeys(kbuf[:0], req.Model, req)
		idx, ok = h.pickPrefix(req.Model, ms, table, bound, key, keys, tokens)
		if ok {
			ms.recent.RememberName(key, table.Engine(idx).Name) // for admission's ongoing conversations
		}
	default:
		idx, ok = table.PickRecent(key, bound, ms.recent)
	}
	if !ok {
		idx, rt.fallback, ok = bound.PickFallback(key, rt.spare)
	}
	if !ok {
		rt.release()
		return nil, protocol.NewAPIError(http.StatusServiceUnavailable, protocol.ErrTypeUnavailable, "no_engine_available", "",
			fmt.Sprintf("no engine is available for model %q", req.Model))
	}
	rt.idx = idx
	if !rt.fallback { // a fallback pick is a moment's, not where the prefix will live
		ms.prefix.Routed(table.Engine(idx).Name, keys, h.opts.Now())
	}
	h.budget.Earn(u)
	h.amp.Add(1, 0)
	return rt, nil
}

// relay copies the engine's body to the client as it arrives: first (the
// bytes already read), then the rest, flushing after every read so each SSE
// event reaches the client at once; buf is its read buffer (first may
// alias it). It returns the bytes written, when the first byte was
// written, and the first read or write error (a client that went away ends
// the copy and, through the request context, the engine's request).
func (h *Handler) relay(ctx context.Context, w http.ResponseWriter, pending []byte, body io.Reader, buf []byte) (int64, time.Time, error) {
	rc := http.NewResponseController(w)
	var n int64
	var first time.Time
	write := func(p []byte) error {
		if first.IsZero() {
			first = h.opts.Now()
		}
		if _, werr := w.Write(p); werr != nil {
			return fmt.Errorf("write to client: %w", werr)
		}
		n += int64(len(p))
		if ferr := rc.Flush(); ferr != nil {
			return fmt.Errorf("flush to client: %w", ferr)
		}
		return nil
	}
	if len(pending) > 0 {
		if err := write(pending); err != nil {
			return n, first, err
		}
	}
	for {
		k, rerr := body.Read(buf)
		if k > 0 {
			if err := write(buf[:k]); err != nil {
				return n, first, err
			}
		}
		if rerr == io.EOF {
			return n, first, nil
		}
		if rerr != nil {
			if ctx.Err() != nil {
				return n, first, fmt.Errorf("client went away: %w", ctx.Err())
			}
			return n, first, fmt.Errorf("read from engine: %w: %w", errEngineBroke, rerr)
		}
	}
}
