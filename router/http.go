package router

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/selection"
)

// Limits on client-supplied header values.
const (
	maxRequestIDLen = 128
	maxSessionIDLen = 256
)

// Mode says how a model's table was made.
type Mode string

// Table modes.
const (
	// ModeSnapshot: the table comes from a fresh optimizer snapshot.
	ModeSnapshot Mode = "snapshot"
	// ModeLocalPolicy: no snapshot yet, or a stale one; the table comes from
	// the router's local policy over live engine signals.
	ModeLocalPolicy Mode = "local-policy"
)

// Info describes the table installed for a model.
type Info struct {
	// Generation is the snapshot's generation (0 for a local-policy table
	// built before any snapshot).
	Generation uint64
	// Mode says where the table came from.
	Mode Mode
	// Created is when the optimizer produced the snapshot the table was built
	// from; the snapshot's age is measured from it. Zero when unknown.
	Created time.Time
	// Figures are the snapshot's shed fractions, demand and predictions for
	// the guards (shedding, admission, retry budget); nil when the table is
	// not routed by a fresh snapshot.
	Figures *Figures
}

// Tables is the source of selection tables, one per model, for the router's
// own frontend cluster; the snapshot store implements it. Table must be
// cheap (an atomic load and a map lookup) as it is called on every request.
type Tables interface {
	// Table returns the table installed for model, its info, and whether the
	// model is served.
	Table(model string) (*Table, Info, bool)
	// Models returns the served models.
	Models() []string
}

// Options configures a Handler. Tables is required.
type Options struct {
	// Tables gives the selection table per model.
	Tables Tables
	// Transport forwards requests to engines (default: an HTTPTransport with
	// default options).
	Transport Transport
	// Cluster is the router's frontend cluster, for logs and /readyz.
	Cluster string
	// Router is the router's name, for logs and /readyz.
	Router string
	// Logger receives the handler's logs; component=router and cluster are
	// added. The zero Logger discards.
	Logger zerolog.Logger
	// Registry receives the handler's metrics and is served on /metrics
	// (default: a new registry).
	Registry *prometheus.Registry
	// MaxBodyBytes bounds request bodies (default 8 MiB); larger ones get 413.
	MaxBodyBytes int64
	// BodyReadTimeout bounds reading a request body (default 30s).
	BodyReadTimeout time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Observer is told about every routed request and every forwarding
	// outcome, e.g. a Reporter (default: none). When it is a GuardObserver
	// it is also told about priorities, shed requests and retries.
	Observer Observer
	// Protection tunes ejection of failing engines, retries, the retry
	// budget and load shedding (default: the defaults of each).
	Protection ProtectionOptions
	// Regions, when set, gives engines' regions: a retry goes to the
	// failed engine's region first.
	Regions RegionResolver
	// Endpoints, when set, gives engines' live endpoints (the router's
	// Signals): the handler then never picks an engine for which neither
	// its table entry nor Endpoints has an address, and SetEngineEndpoints
	// must be called as they change. Nil: every engine of a table is
	// selectable (tables that carry addresses, or a Transport that needs
	// none).
	Endpoints EndpointResolver
	// Settled, when set, holds requests until it is closed (each within its
	// own context): the router's start-up, until the engines' signals were
	// heard (Signals.Settled), so that a snapshot stored by an earlier run
	// is not routed on before the engines' addresses are known.
	Settled <-chan struct{}
}

// Handler is the router's HTTP front: the OpenAI inference endpoints,
// /v1/models, /healthz, /readyz and /metrics.
type Handler struct {
	opts     Options
	log      zerolog.Logger
	metrics  *metrics
	mux      *http.ServeMux
	models   sync.Map // model → *modelState
	seq      atomic.Uint64
	bufs     sync.Pool
	promHTTP http.Handler
	prot     ProtectionOptions
	budget   *RetryBudget
	amp      *ampWindow
}

// modelState is the router's live state for one model.
type modelState struct {
	live   *LiveSet
	recent *RecentKeys // where this router sent each affinity key lately
	bound  atomic.Pointer[Bound]
	adm    *Admission
	// met holds the model's metric children, made on first use.
	met atomic.Pointer[modelMetrics]
}

// NewHandler returns a Handler for opts. It fails when Tables is nil or the
// metrics cannot be registered in opts.Registry.
func NewHandler(opts Options) (*Handler, error) {
	if opts.Tables == nil {
		return nil, errors.New("router: new handler: Options.Tables is nil")
	}
	if opts.Transport == nil {
		opts.Transport = NewHTTPTransport(HTTPTransportOptions{})
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
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
	prot := opts.Protection.withDefaults()
	budget := NewRetryBudget(prot.Budget, opts.Now)
	amp := &ampWindow{now: opts.Now}
	m, err := newMetrics(opts.Registry, opts.Tables, opts.Now, budget.Tokens, amp.ratio)
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
	h.promHTTP = promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{Registry: opts.Registry})
	h.mux.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		h.serveStd(w, r, EndpointChat)
	})
	h.mux.HandleFunc("/v1/completions", func(w http.ResponseWriter, r *http.Request) {
		h.serveStd(w, r, EndpointCompletions)
	})
	h.mux.HandleFunc("/v1/models", h.serveModels)
	h.mux.HandleFunc("/healthz", h.serveHealth)
	h.mux.HandleFunc("/readyz", h.serveReady)
	h.mux.Handle("/metrics", h.promHTTP)
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, newAPIError(http.StatusNotFound, ErrTypeNotFound, "not_found", "",
			fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)))
	})
	return h, nil
}

// ServeHTTP routes a request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// Registry returns the registry holding the handler's metrics.
func (h *Handler) Registry() *prometheus.Registry { return h.opts.Registry }

// Live returns the live engine state of model (in-flight counts, down
// marks), creating it if needed; guards use it to mark engines down.
func (h *Handler) Live(model string) *LiveSet { return h.model(model).live }

// SetEngineDown marks an engine of model down (skipped at once) or up.
func (h *Handler) SetEngineDown(model, engine string, down bool) {
	h.Live(model).SetDown(engine, down)
}

// SetEngineEndpoints records the endpoints an engine of model advertises
// now; with Options.Endpoints set, an engine is selectable only with one.
func (h *Handler) SetEngineEndpoints(model, engine string, ep Endpoints) {
	h.Live(model).SetEndpoints(engine, ep)
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
	live := newLiveSet(h.opts.Now)
	live.resolve, live.model = h.opts.Endpoints, name
	v, _ := h.models.LoadOrStore(name, &modelState{live: live, recent: newRecentKeys(DefaultRecentKeys),
		adm: &Admission{prot: h.prot, now: h.opts.Now}})
	return v.(*modelState)
}

// bind returns the Guard of model bound to t, rebinding when t is new.
func (h *Handler) bind(model string, t *Table) *Bound {
	ms := h.model(model)
	if b := ms.bound.Load(); b != nil && b.Table() == t {
		return b
	}
	b := ms.live.Bind(t)
	ms.bound.Store(b)
	return b
}

// validHeaderValue reports whether v is 1..max visible ASCII characters.
func validHeaderValue(v string, max int) bool {
	if v == "" || len(v) > max {
		return false
	}
	for i := 0; i < len(v); i++ {
		if v[i] <= ' ' || v[i] > '~' {
			return false
		}
	}
	return true
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

// reject answers e and counts it under model.
func (h *Handler) reject(w http.ResponseWriter, model string, e *APIError) {
	h.metrics.requests.WithLabelValues(model, strconv.Itoa(e.Status)).Inc()
	WriteError(w, e)
}

// Metric model labels for requests rejected before a served model is known.
const (
	labelInvalid = "_invalid"
	labelUnknown = "_unknown"
)

// clientRequest is what the inference endpoints read of a client's
// request, whichever HTTP server parsed it (net/http or fasthttp).
type clientRequest interface {
	// method is the request method.
	method() string
	// header returns the first value of the named header (canonical form)
	// and whether the header is present.
	header(name string) (string, bool)
	// passHeaders returns the client headers forwarded to engines.
	passHeaders() http.Header
	// body reads the request body within the handler's size and time limits.
	body() ([]byte, *APIError)
}

// headWriter is a response writer that writes an engine's answer head
// without a header map: the headers set so far, then the engine's headers
// but the hop-by-hop ones (each replacing any of its name set before),
// then X-Switchyard-Engine and X-Request-Id, and the status — what
// copyResponseHeaders, two Sets and WriteHeader do on an http.Header.
type headWriter interface {
	writeHead(status int, engine http.Header, engineName, requestID string)
}

// answer is a request whose engine answered and whose response head is
// written: relay copies the body to the client and ends the request.
type answer struct {
	h      *Handler
	rt     *routed
	at     *attempt
	mm     *modelMetrics
	bp     *[]byte
	log    *reqLog
	start  time.Time
	stream bool
	logv   reqLog          // what log points to
	up     UpstreamRequest // the request forwarded to the engine
}

// serveInference answers an inference request up to the response head: it
// checks the request, routes it and forwards it, and either answers an
// error (returning nil) or writes the engine's status and headers and
// returns the answer whose body the caller relays with answer.relay. ctx
// ends when the client goes away, if the server can tell.
func (h *Handler) serveInference(ctx context.Context, w http.ResponseWriter, r clientRequest, ep Endpoint) *answer {
	start := h.opts.Now()
	if m := r.method(); m != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		h.reject(w, labelInvalid, newAPIError(http.StatusMethodNotAllowed, ErrTypeInvalidRequest, "method_not_allowed", "",
			fmt.Sprintf("method %s not allowed on %s; use POST", m, ep.Path())))
		return nil
	}
	reqID, _ := r.header(messages.HeaderRequestID)
	if reqID == "" {
		reqID = h.newRequestID()
	} else if !validHeaderValue(reqID, maxRequestIDLen) {
		h.reject(w, labelInvalid, newAPIError(http.StatusBadRequest, ErrTypeInvalidRequest, "invalid_header", messages.HeaderRequestID,
			fmt.Sprintf("header %s must be 1 to %d visible ASCII characters", messages.HeaderRequestID, maxRequestIDLen)))
		return nil
	}
	w.Header().Set(messages.HeaderRequestID, reqID)
	session, present := r.header(messages.HeaderSessionID)
	if present && !validHeaderValue(session, maxSessionIDLen) {
		h.reject(w, labelInvalid, newAPIError(http.StatusBadRequest, ErrTypeInvalidRequest, "invalid_header", messages.HeaderSessionID,
			fmt.Sprintf("header %s must be 1 to %d visible ASCII characters", messages.HeaderSessionID, maxSessionIDLen)))
		return nil
	}
	if ct, _ := r.header("Content-Type"); ct != "" && ct != mimeJSON {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != mimeJSON {
			h.reject(w, labelInvalid, newAPIError(http.StatusUnsupportedMediaType, ErrTypeInvalidRequest, "unsupported_media_type", "",
				fmt.Sprintf("Content-Type %q is not application/json", ct)))
			return nil
		}
	}
	body, apiErr := r.body()
	if apiErr != nil {
		h.reject(w, labelInvalid, apiErr)
		return nil
	}
	req, err := ParseRequest(ep, body)
	if err != nil {
		var ae *APIError
		if !errors.As(err, &ae) {
			ae = invalidRequest("", err.Error())
		}
		h.reject(w, labelInvalid, ae)
		return nil
	}
	prioHeader, _ := r.header(messages.HeaderPriority)
	prio, ok := ParsePriority(prioHeader)
	if !ok {
		h.reject(w, labelInvalid, newAPIError(http.StatusBadRequest, ErrTypeInvalidRequest, "invalid_header", messages.HeaderPriority,
			fmt.Sprintf("header %s must be critical, standard or sheddable", messages.HeaderPriority)))
		return nil
	}
	rt, apiErr := h.route(ctx, req, session, prio)
	if apiErr != nil {
		switch apiErr.Status {
		case http.StatusServiceUnavailable:
			w.Header().Set("Retry-After", "1")
		case http.StatusTooManyRequests:
			w.Header().Set("Retry-After", h.retryAfter())
		}
		label := req.Model
		if apiErr.Status == http.StatusNotFound {
			label = labelUnknown
		}
		h.reject(w, label, apiErr)
		return nil
	}
	mm := h.modelMetrics(rt.ms, req.Model)
	mm.inFlight.Inc()
	// One allocation for the answer, the request's logger and the request
	// to the engine; the answer is returned only once the engine answered.
	ans := &answer{h: h, rt: rt, mm: mm, start: start, stream: req.Stream,
		logv: reqLog{base: &h.log, model: req.Model, id: reqID, key: rt.src, prio: prio},
		up: UpstreamRequest{Endpoint: ep, Model: req.Model, Stream: req.Stream, RequestID: reqID, Body: body,
			Header: r.passHeaders()}}
	log, up := &ans.logv, &ans.up
	ans.log = log
	bp := h.bufs.Get().(*[]byte)
	var at *attempt
	var a *answer
	defer func() {
		if a != nil {
			return // the answer's relay releases it all
		}
		if at != nil {
			at.finish()
		}
		h.bufs.Put(bp)
		mm.inFlight.Dec()
		rt.release()
	}()
	at, apiErr = h.forward(ctx, rt, up, *bp, log)
	if apiErr != nil {
		if apiErr.Code != nil && *apiErr.Code == "canceled" {
			log.Debug().Msg("client went away before the engine answered")
		}
		h.reject(w, req.Model, apiErr)
		return nil
	}
	resp := at.resp
	h.countRequest(mm, req.Model, resp.Status)

	if hw, ok := w.(headWriter); ok {
		hw.writeHead(resp.Status, resp.Header, at.engine.Name, reqID)
	} else {
		hdr := w.Header()
		copyResponseHeaders(hdr, resp.Header)
		hdr.Set(messages.HeaderEngine, at.engine.Name)
		hdr.Set(messages.HeaderRequestID, reqID)
		w.WriteHeader(resp.Status)
	}
	ans.at, ans.bp = at, bp
	a = ans
	return a
}

// relay copies the engine's body to w (flushing after every read), records
// the outcome and releases everything the request held. ctx is the one
// serveInference was given, or any context that has ended when the client
// is known to have gone away.
func (a *answer) relay(ctx context.Context, w http.ResponseWriter) {
	h, at := a.h, a.at
	defer func() {
		at.finish()
		h.bufs.Put(a.bp)
		a.mm.inFlight.Dec()
		a.rt.release()
	}()
	n, first, err := h.relay(ctx, w, at.first, at.resp.Body, *a.bp)
	end := h.opts.Now()
	// Only a streamed answer's first byte is its first token; a whole
	// answer's first byte comes when it is complete, and counting it as TTFT
	// would make every engine look slow to the penalty rules.
	ttftAt := first
	if !a.stream {
		ttftAt = time.Time{}
	}
	h.finishAttempt(ctx, at, err, ttftAt, end, a.log)
	if !first.IsZero() {
		a.mm.ttft.Observe(first.Sub(a.start).Seconds())
	}
	a.mm.duration.Observe(end.Sub(a.start).Seconds())
	ev := a.log.Debug()
	if err != nil {
		ev = a.log.Info().Err(err)
	}
	ev.Str("engine", at.engine.Name).Int("status", at.resp.Status).Int64("bytes", n).Dur("duration", end.Sub(a.start)).
		Bool("stream", a.stream).Int("attempts", at.n).Msg("request done")
}

// route admits and picks the first engine for a parsed request exactly as
// both fronts do: at start-up, once the engines were heard from
// (Options.Settled); the model's table, the affinity key (session id, then
// user, then prompt prefix; spread by weight without one), the snapshot's
// shed fraction for the request's priority and the local admission control
// (429 when shed), and the pick (keyed: PickRecent, keyless: PickTwo) under
// the bounded-load guard, which skips engines marked
// down, without an address or ejected (all ejected: the snapshot's spare engines of weight zero,
// nearest first, then ejections are ignored). It counts the
// request with the Observer once the model is known to be served, and
// credits the retry budget. Errors: 404 for an unknown model, 429 when
// shed, 503 when no engine is available (or ctx ended while the router
// was starting). The caller must release an
// admitted request.
func (h *Handler) route(ctx context.Context, req *Request, session string, prio Priority) (*routed, *APIError) {
	if err := h.settledOrWait(ctx); err != nil {
		return nil, newAPIError(http.StatusServiceUnavailable, ErrTypeUnavailable, "starting", "",
			fmt.Sprintf("the router is starting and has not heard from the engines of model %q yet: %v", req.Model, err))
	}
	table, info, ok := h.opts.Tables.Table(req.Model)
	if !ok {
		return nil, newAPIError(http.StatusNotFound, ErrTypeNotFound, "model_not_found", "model",
			fmt.Sprintf("the model %q does not exist or is not served by this router", req.Model))
	}
	h.opts.Observer.Request(req.Model)
	if g, ok := h.opts.Observer.(GuardObserver); ok {
		g.Priority(req.Model, prio)
	}
	ms := h.model(req.Model)
	bound := h.bind(req.Model, table)
	key, src := AffinityKey(session, req)
	if src == KeyNone {
		key = selection.SpreadKey(h.seq.Add(1))
	}
	u, apiErr := h.admit(req.Model, ms, info, bound, key, src, prio)
	if apiErr != nil {
		return nil, apiErr
	}
	rt := &routed{model: req.Model, table: table, bound: bound, ms: ms, key: key, src: src, prio: prio}
	if info.Figures != nil {
		rt.spare = info.Figures.Spare
	}
	var idx int
	if src == KeyNone {
		idx, ok = table.PickTwo(key, bound)
	} else {
		idx, ok = table.PickRecent(key, bound, ms.recent)
	}
	if !ok {
		idx, rt.fallback, ok = bound.PickFallback(key, rt.spare)
	}
	if !ok {
		rt.release()
		return nil, newAPIError(http.StatusServiceUnavailable, ErrTypeUnavailable, "no_engine_available", "",
			fmt.Sprintf("no engine is available for model %q", req.Model))
	}
	rt.idx = idx
	h.budget.Earn(u)
	h.amp.add(1, 0)
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

// passedHeaders names the client headers forwarded to engines, in
// canonical form.
func passedHeaders() [5]string {
	return [5]string{"Authorization", "Accept", messages.HeaderSessionID, "Openai-Organization", "Openai-Project"}
}

// isHopHeader reports whether k is a connection-level header, never relayed.
func isHopHeader(k string) bool {
	switch k {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Te", "Trailer", "Upgrade",
		"Proxy-Authenticate", "Proxy-Authorization":
		return true
	}
	return false
}

func copyResponseHeaders(dst, src http.Header) {
	for k, vs := range src {
		if !isHopHeader(k) {
			dst[k] = vs
		}
	}
}
