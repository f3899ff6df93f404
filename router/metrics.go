package router

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-dev/switchyard/router/control"
)

// metrics are one handler's Prometheus collectors, registered in its own
// registry.
type metrics struct {
	requests        *prometheus.CounterVec
	duration        *prometheus.HistogramVec
	ttft            *prometheus.HistogramVec
	engineRequests  *prometheus.CounterVec
	inFlight        *prometheus.GaugeVec
	ejected         *prometheus.GaugeVec
	retries         *prometheus.CounterVec
	retrySuppressed *prometheus.CounterVec
	clientErrors    *prometheus.CounterVec
	attempts        prometheus.Counter
	shed            *prometheus.CounterVec
	startWaits      prometheus.Counter
	unaddressed     *prometheus.CounterVec
	// prefixFromKV and prefixFromRouted count prefix picks whose holders
	// came from the engines' KV events or from what the router routed.
	prefixFromKV, prefixFromRouted prometheus.Counter
	// overflows counts keyless requests sent past a full batch to a
	// spare engine (live.Bound.Overflow), by model.
	overflows *prometheus.CounterVec
}

// latencyBuckets span 1 ms to about 2 minutes.
func latencyBuckets() []float64 { return prometheus.ExponentialBuckets(0.001, 2, 18) }

func newMetrics(reg prometheus.Registerer, tables control.Tables, now func() time.Time, tokens, amplification func() float64) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_router_requests_total",
			Help: "Inference requests answered, by model and HTTP status code.",
		}, []string{"model", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "switchyard_router_request_duration_seconds",
			Help:    "Time from receiving a request to the end of its response, by model.",
			Buckets: latencyBuckets(),
		}, []string{"model"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "switchyard_router_ttft_seconds",
			Help:    "Time from receiving a request to relaying the first response byte, by model.",
			Buckets: latencyBuckets(),
		}, []string{"model"}),
		engineRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_router_engine_requests_total",
			Help: "Requests forwarded, by model, engine and outcome (HTTP status code or error).",
		}, []string{"model", "engine", "code"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_router_in_flight_requests",
			Help: "Requests being forwarded now, by model.",
		}, []string{"model"}),
		ejected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_router_engine_ejected",
			Help: "1 while the router skips the engine after consecutive failures (fast local skip), else 0, by model and engine.",
		}, []string{"model", "engine"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_router_retries_total",
			Help: "Retry attempts, by the failure that caused them (connect, 5xx, 429, timeout).",
		}, []string{"reason"}),
		retrySuppressed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_router_retries_suppressed_total",
			Help: "Failed attempts not retried, by cause (attempts: per-request cap; budget: retry budget empty; no_candidate).",
		}, []string{"cause"}),
		clientErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_router_engine_client_errors_total",
			Help: "Engine answers that blame the request (400, 404, 413, 422, ...): relayed, never retried, never counted against the engine.",
		}, []string{"model", "engine"}),
		attempts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_router_upstream_attempts_total",
			Help: "Attempts to forward a request to an engine, retries included.",
		}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_router_shed_total",
			Help: "Requests shed with a 429, by reason (snapshot: the snapshot's shed fraction; admission: local admission control) and priority.",
		}, []string{"reason", "priority"}),
		startWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_router_startup_waits_total",
			Help: "Requests that arrived before the router had heard from the engines since its start and waited for their signals.",
		}),
		unaddressed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_router_unaddressed_skips_total",
			Help: "Times a request passed over an engine the router has no address for (no signal from it yet, or none advertised), by model and engine; never counted against the engine.",
		}, []string{"model", "engine"}),
		overflows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_router_overflow_picks_total",
			Help: "Requests without affinity whose planned engine's batch was full, sent instead to an engine the snapshot gives this cluster weight zero (nearest first) with a free slot, because its extra predicted latency was below the wait for a slot; by model.",
		}, []string{"model"}),
	}
	picks := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "switchyard_router_prefix_picks_total",
		Help: "Requests placed by the engine-exact prefix index (ServiceOptions.KVEvents), by where their prefix's holders came from: kv_events (the engines' own KV events) or routed (what this router routed: no engine reported holding any of the prefix).",
	}, []string{"source"})
	m.prefixFromKV, m.prefixFromRouted = picks.WithLabelValues("kv_events"), picks.WithLabelValues("routed")
	budget := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "switchyard_router_retry_budget_tokens",
		Help: "Tokens in the router-wide retry budget; a retry costs one.",
	}, tokens)
	amp := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "switchyard_router_retry_amplification",
		Help: "Upstream attempts per client request over the last 10 s (1 when idle).",
	}, amplification)
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.ttft, m.engineRequests, m.inFlight,
		m.ejected, m.retries, m.retrySuppressed, m.clientErrors, m.attempts, m.shed, m.startWaits, m.unaddressed, m.overflows, picks, budget, amp,
		&snapshotCollector{tables: tables, now: now}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// snapshotCollector reports, at scrape time, each model's snapshot
// generation, age and mode from the Tables.
type snapshotCollector struct {
	tables control.Tables
	now    func() time.Time
}

var (
	descAge = prometheus.NewDesc("switchyard_router_snapshot_age_seconds",
		"Age of the installed weight snapshot, by model.", []string{"model"}, nil)
	descGeneration = prometheus.NewDesc("switchyard_router_snapshot_generation",
		"Generation of the installed weight snapshot, by model.", []string{"model"}, nil)
	descLocal = prometheus.NewDesc("switchyard_router_local_policy",
		"1 when the model is routed by the local policy (no fresh snapshot), else 0.", []string{"model"}, nil)
)

// Describe sends the collector's descriptors.
func (c *snapshotCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descAge
	ch <- descGeneration
	ch <- descLocal
}

// Collect sends the current snapshot figures.
func (c *snapshotCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.now()
	for _, model := range c.tables.Models() {
		_, info, ok := c.tables.Table(model)
		if !ok {
			continue
		}
		local := 0.0
		if info.Mode == control.ModeLocalPolicy {
			local = 1
		}
		ch <- prometheus.MustNewConstMetric(descGeneration, prometheus.GaugeValue, float64(info.Generation), model)
		ch <- prometheus.MustNewConstMetric(descLocal, prometheus.GaugeValue, local, model)
		if !info.Created.IsZero() {
			ch <- prometheus.MustNewConstMetric(descAge, prometheus.GaugeValue, now.Sub(info.Created).Seconds(), model)
		}
	}
}

// modelMetrics are one model's metric children, looked up once instead of
// on every request (a label lookup hashes the label values every time).
type modelMetrics struct {
	inFlight prometheus.Gauge
	ttft     prometheus.Observer
	duration prometheus.Observer
	ok       prometheus.Counter // requests answered 200
	engineOK sync.Map           // engine name → prometheus.Counter of its 200 answers
}

// modelMetrics returns the metric children of model, whose state is ms.
func (h *Handler) modelMetrics(ms *modelState, model string) *modelMetrics {
	if mm := ms.met.Load(); mm != nil {
		return mm
	}
	ms.met.CompareAndSwap(nil, &modelMetrics{
		inFlight: h.metrics.inFlight.WithLabelValues(model),
		ttft:     h.metrics.ttft.WithLabelValues(model),
		duration: h.metrics.duration.WithLabelValues(model),
		ok:       h.metrics.requests.WithLabelValues(model, "200"),
	})
	return ms.met.Load()
}

// countRequest counts a request of model answered with status.
func (h *Handler) countRequest(mm *modelMetrics, model string, status int) {
	if status == http.StatusOK {
		mm.ok.Inc()
		return
	}
	h.metrics.requests.WithLabelValues(model, strconv.Itoa(status)).Inc()
}

// countEngine counts a request of model forwarded to engine and answered
// with status.
func (h *Handler) countEngine(rt *routed, engine string, status int) {
	if status != http.StatusOK {
		h.metrics.engineRequests.WithLabelValues(rt.model, engine, strconv.Itoa(status)).Inc()
		return
	}
	mm := h.modelMetrics(rt.ms, rt.model)
	c, ok := mm.engineOK.Load(engine)
	if !ok {
		c, _ = mm.engineOK.LoadOrStore(engine, h.metrics.engineRequests.WithLabelValues(rt.model, engine, "200"))
	}
	c.(prometheus.Counter).Inc()
}
