package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/switchyard-dev/switchyard/internal/zmtp"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/engine"
	"github.com/switchyard-dev/switchyard/streams"
)

// Defaults applied to zero-valued Options and EngineConfig fields.
const (
	// DefaultInterval is the time between scrapes and between signals. Half
	// a second keeps several signals inside the aggregator's 2 s staleness
	// limit while costing a Python engine's metrics endpoint (a few hundred
	// series rendered per call) little.
	DefaultInterval = 500 * time.Millisecond
	// DefaultScrapeTimeout bounds one metrics or health request. It is
	// generous against the interval on purpose: an engine busy with a large
	// batch answers /metrics late, and a late answer is not a down engine (a
	// 200 ms timeout made routers mark healthy engines down many times a minute).
	DefaultScrapeTimeout = 3 * time.Second
	// DefaultStaleAfter is how long after the last good scrape the agent
	// keeps publishing the last values; past it the agent goes silent
	// rather than guess, and routers treat the engine as unknown. It bridges
	// one slow scrape (DefaultScrapeTimeout) plus a few intervals.
	DefaultStaleAfter = 5 * time.Second
	// DefaultHealthFailures is how many consecutive definite health
	// failures (an error status, or nothing listening) make health 0: one
	// failed probe is a blip.
	DefaultHealthFailures = 3
	// DefaultCapacityRPS is the capacity published while nothing better is
	// known: small, so an unknown engine gets a trickle of traffic from which
	// the agent learns, not a flood.
	DefaultCapacityRPS = 1.0
	// DefaultMetricsPath and DefaultHealthPath are the endpoints vLLM, SGLang,
	// TGI and llama.cpp's server all serve.
	DefaultMetricsPath = "/metrics"
	DefaultHealthPath  = "/health"
	// DefaultMaxBodyBytes caps a metrics body; a vLLM text is tens of KiB.
	DefaultMaxBodyBytes = 16 << 20
)

// The largest values a signal accepts (messages validation).
const (
	maxMs   = 86_400_000
	maxRate = 1e9
)

// ErrOptions wraps every Options or EngineConfig validation error.
var ErrOptions = errors.New("agent: invalid options")

// ErrNoConn is New's error for an Options without a NATS connection (it
// wraps ErrOptions). Validate checks configuration only, so that a command
// can check its flags before it connects.
var ErrNoConn = fmt.Errorf("%w: Options.Conn is nil, want a NATS connection", ErrOptions)

// EngineConfig is one engine the agent serves.
type EngineConfig struct {
	// Name is the engine's Switchyard name (a NATS token). Required.
	Name string
	// Model is the Switchyard model the engine serves (a NATS token). Required.
	Model string
	// Region is the engine's region (optional NATS token).
	Region string
	// URL is the engine's base URL, http:// or https://. Required.
	URL string
	// Format is the engine's metrics dialect. Required.
	Format Format
	// ServedModel is the name the engine serves the model under (vLLM's
	// --served-model-name): it keeps only metric series whose model label
	// is it, and when it is not Model the signals carry it, so that
	// routers send it in the request's model field.
	ServedModel string
	// MetricsPath and HealthPath are appended to URL; zero values take the defaults.
	MetricsPath, HealthPath string
	// Advertise is the base URL routers should use; empty means URL.
	Advertise string
	// Known holds what the metrics do not say (capacity, batch size, base latency).
	Known Known
	// Replicas is the number of replicas behind the URL; zero means 1.
	Replicas int
	// KVEvents, when set, is the engine's vLLM KV event endpoint
	// (tcp://host:port), relayed to SY_KV by a KVRelay; KVTopic is its topic
	// and KVReplay its replay endpoint (optional).
	KVEvents, KVTopic, KVReplay string
}

// Options configures an Agent.
type Options struct {
	// Conn is the NATS connection signals are published on. Required; the caller owns it.
	Conn *nats.Conn
	// Names is the NATS layout; the zero value means streams.DefaultNames().
	Names streams.Names
	// Engines are the engines served. At least one.
	Engines []EngineConfig
	// Interval, ScrapeTimeout, StaleAfter and HealthFailures: see the defaults.
	Interval, ScrapeTimeout, StaleAfter time.Duration
	HealthFailures                      int
	// MaxBodyBytes caps a metrics response; zero means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// HTTPClient, when set, does the scrapes (its own timeout is not used:
	// ScrapeTimeout bounds each request).
	HTTPClient *http.Client
	// Registerer receives the agent's switchyard_agent_* metrics; nil means
	// a registry of the agent's own (Agent.Registry).
	Registerer prometheus.Registerer
	// Logger receives the agent's log.
	Logger zerolog.Logger
}

// WithDefaults returns a copy of o with every zero field, its engines'
// included, set to its default.
func (o Options) WithDefaults() Options {
	if o.Names == (streams.Names{}) {
		o.Names = streams.DefaultNames()
	}
	if o.Interval == 0 {
		o.Interval = DefaultInterval
	}
	if o.ScrapeTimeout == 0 {
		o.ScrapeTimeout = DefaultScrapeTimeout
	}
	if o.StaleAfter == 0 {
		o.StaleAfter = max(DefaultStaleAfter, o.ScrapeTimeout+2*o.Interval)
	}
	if o.HealthFailures == 0 {
		o.HealthFailures = DefaultHealthFailures
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute, DisableCompression: false,
		}}
	}
	engines := make([]EngineConfig, len(o.Engines))
	for i, e := range o.Engines {
		if e.MetricsPath == "" {
			e.MetricsPath = DefaultMetricsPath
		}
		if e.HealthPath == "" {
			e.HealthPath = DefaultHealthPath
		}
		if e.Advertise == "" {
			e.Advertise = strings.TrimRight(e.URL, "/")
		}
		if e.Replicas == 0 {
			e.Replicas = 1
		}
		if e.Known.DefaultCapacityRPS == 0 {
			e.Known.DefaultCapacityRPS = DefaultCapacityRPS
		}
		engines[i] = e
	}
	o.Engines = engines
	return o
}

// Validate reports the first field of o (after defaults) that is not usable,
// naming it and its value; the error wraps ErrOptions.
func (o Options) Validate() error {
	o = o.WithDefaults()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrOptions, fmt.Sprintf(format, args...))
	}
	switch {
	case len(o.Engines) == 0:
		return bad("Options.Engines is empty, want at least one engine")
	case o.Interval < 10*time.Millisecond:
		return bad("Options.Interval is %s, want >= 10ms", o.Interval)
	case o.ScrapeTimeout <= 0:
		return bad("Options.ScrapeTimeout is %s, want > 0", o.ScrapeTimeout)
	case o.StaleAfter < o.Interval:
		return bad("Options.StaleAfter is %s, want >= Options.Interval (%s)", o.StaleAfter, o.Interval)
	case o.HealthFailures < 1:
		return bad("Options.HealthFailures is %d, want >= 1", o.HealthFailures)
	case o.MaxBodyBytes < 1024:
		return bad("Options.MaxBodyBytes is %d, want >= 1024", o.MaxBodyBytes)
	}
	if err := o.Names.Validate(); err != nil {
		return bad("Options.Names: %v", err)
	}
	seen := map[string]bool{}
	for i, e := range o.Engines {
		f := fmt.Sprintf("Options.Engines[%d]", i)
		if err := e.validate(f); err != nil {
			return fmt.Errorf("%w: %v", ErrOptions, err)
		}
		key := streams.JoinKey(e.Model, e.Name)
		if seen[key] {
			return bad("%s: engine %q of model %q is given twice", f, e.Name, e.Model)
		}
		seen[key] = true
	}
	return nil
}

func (e EngineConfig) validate(f string) error {
	if err := messages.CheckName(f+".Name", e.Name); err != nil {
		return err
	}
	if err := messages.CheckName(f+".Model", e.Model); err != nil {
		return err
	}
	if err := messages.CheckModelName(e.Model); err != nil {
		return fmt.Errorf("%s.Model: %w", f, err)
	}
	if e.Region != "" {
		if err := messages.CheckName(f+".Region", e.Region); err != nil {
			return err
		}
	}
	for _, u := range []struct{ field, v string }{{"URL", e.URL}, {"Advertise", e.Advertise}} {
		p, err := url.Parse(u.v)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return fmt.Errorf("%s.%s is %q, want an http:// or https:// base URL", f, u.field, u.v)
		}
	}
	if _, err := ParseFormat(string(e.Format)); err != nil {
		return fmt.Errorf("%s.Format: %w", f, err)
	}
	for _, p := range []struct{ field, v string }{{"MetricsPath", e.MetricsPath}, {"HealthPath", e.HealthPath}} {
		if !strings.HasPrefix(p.v, "/") {
			return fmt.Errorf("%s.%s is %q, want a path starting with /", f, p.field, p.v)
		}
	}
	k := e.Known
	for _, n := range []struct {
		field string
		v     float64
	}{{"Known.CapacityRPS", k.CapacityRPS}, {"Known.BaseLatencyMs", k.BaseLatencyMs}, {"Known.DefaultCapacityRPS", k.DefaultCapacityRPS}} {
		if !finite(n.v) || n.v < 0 || n.v > 1e9 {
			return fmt.Errorf("%s.%s is %v, want a finite number 0..1e9", f, n.field, n.v)
		}
	}
	if k.MaxRunning < 0 || k.MaxRunning > 1<<20 {
		return fmt.Errorf("%s.Known.MaxRunning is %d, want 0..%d", f, k.MaxRunning, 1<<20)
	}
	if e.KVEvents != "" {
		if _, err := zmtp.TCPAddr(e.KVEvents); err != nil {
			return fmt.Errorf("%s.KVEvents: %v", f, err)
		}
	}
	if e.KVReplay != "" {
		if _, err := zmtp.TCPAddr(e.KVReplay); err != nil {
			return fmt.Errorf("%s.KVReplay: %v", f, err)
		}
	}
	if e.Replicas < 0 || e.Replicas > 1<<20 {
		return fmt.Errorf("%s.Replicas is %d, want 0..%d", f, e.Replicas, 1<<20)
	}
	return nil
}

// EngineStats counts what the agent did for one engine.
type EngineStats struct {
	// Scrapes counts metrics scrapes that parsed; ScrapeFailures those that did not.
	Scrapes, ScrapeFailures uint64
	// HealthFailures counts definite health failures (error status, nothing listening).
	HealthFailures uint64
	// Published counts signals sent; Silent counts intervals skipped because
	// the engine could not be seen for StaleAfter.
	Published, Silent uint64
	// Resets counts engine restarts seen as counters going down.
	Resets uint64
	// Health is the health the agent would publish now.
	Health float64
	// Last is the newest derived values.
	Last Values
}

// Agent scrapes engines' own metrics and health and publishes Switchyard
// signals for them.
type Agent struct {
	opts    Options
	log     zerolog.Logger
	reg     *prometheus.Registry
	m       *agentMetrics
	engines []*runner
	relays  []*KVRelay
}

// New validates opts and returns an Agent that does nothing until Run.
func New(opts Options) (*Agent, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Conn == nil {
		return nil, ErrNoConn
	}
	a := &Agent{opts: opts, reg: prometheus.NewRegistry(),
		log: opts.Logger.With().Str("component", "agent").Logger()}
	var reg prometheus.Registerer = a.reg
	if opts.Registerer != nil {
		reg = opts.Registerer
	}
	m, err := newAgentMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("agent: register metrics: %w", err)
	}
	a.m = m
	for _, ec := range opts.Engines {
		parser, err := NewParser(ec.Format, ec.ServedModel)
		if err != nil {
			return nil, err
		}
		served := ec.ServedModel
		if served == ec.Model {
			served = ""
		}
		pub, err := engine.NewPublisher(engine.Options{
			Conn: opts.Conn, Names: opts.Names, Model: ec.Model, ServedModel: served, Engine: ec.Name, Region: ec.Region,
			Interval: opts.Interval, Logger: opts.Logger,
		})
		if err != nil {
			return nil, fmt.Errorf("agent: engine %q: %w", ec.Name, err)
		}
		if ec.KVEvents != "" {
			kv, err := NewKVRelay(KVRelayOptions{Conn: opts.Conn, Names: opts.Names, Model: ec.Model, Engine: ec.Name,
				Endpoint: ec.KVEvents, Topic: ec.KVTopic, Replay: ec.KVReplay, Logger: opts.Logger})
			if err != nil {
				return nil, fmt.Errorf("agent: engine %q: %w", ec.Name, err)
			}
			a.relays = append(a.relays, kv)
		}
		a.engines = append(a.engines, &runner{
			a: a, cfg: ec, parser: parser, pub: pub, est: NewEstimator(ec.Known),
			metricsURL: strings.TrimRight(ec.URL, "/") + ec.MetricsPath,
			healthURL:  strings.TrimRight(ec.URL, "/") + ec.HealthPath,
			log: a.log.With().Str("model", ec.Model).Str("engine", ec.Name).
				Str("format", string(ec.Format)).Logger(),
		})
	}
	if len(a.relays) > 0 {
		if err := reg.Register(newKVCollector(a.relays)); err != nil {
			return nil, fmt.Errorf("agent: register KV metrics: %w", err)
		}
	}
	return a, nil
}

// Registry returns the agent's own Prometheus registry, which holds its
// switchyard_agent_* metrics unless Options.Registerer was given.
func (a *Agent) Registry() *prometheus.Registry { return a.reg }

// Stats returns the counters of the engine named name of model, and false
// when the agent does not serve it.
func (a *Agent) Stats(model, name string) (EngineStats, bool) {
	for _, r := range a.engines {
		if r.cfg.Model == model && r.cfg.Name == name {
			return r.stats(), true
		}
	}
	return EngineStats{}, false
}

// Run scrapes and publishes for every engine until ctx ends; it returns nil then.
func (a *Agent) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, r := range a.engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.run(ctx)
		}()
	}
	for _, kv := range a.relays {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = kv.Run(ctx)
		}()
	}
	a.log.Info().Int("engines", len(a.engines)).Dur("interval", a.opts.Interval).Msg("agent running")
	wg.Wait()
	return nil
}

// runner serves one engine.
type runner struct {
	a                     *Agent
	cfg                   EngineConfig
	parser                *Parser
	pub                   *engine.Publisher
	metricsURL, healthURL string
	log                   zerolog.Logger

	mu         sync.Mutex // guards everything below
	est        *Estimator
	vals       Values
	lastOK     time.Time // last good metrics scrape
	healthFail int       // consecutive definite health failures
	silent     bool
	st         EngineStats
	// lastScrapeWarn and healthUnserved keep the log to a line per fault.
	lastScrapeWarn time.Time
	healthUnserved bool
}

// scrapeWarnEvery is the least time between two scrape-failure log lines of one engine.
const scrapeWarnEvery = 30 * time.Second

func (r *runner) stats() EngineStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.st
	s.Health = r.healthLocked()
	s.Last = r.vals
	return s
}

func (r *runner) healthLocked() float64 {
	if r.healthFail >= r.a.opts.HealthFailures {
		return 0
	}
	return 1
}

func (r *runner) run(ctx context.Context) {
	t := time.NewTicker(r.a.opts.Interval)
	defer t.Stop()
	inFlight := make(chan struct{}, 1)
	for {
		// A scrape that is still running (a slow engine) is left to finish;
		// publishing goes on with the last values meanwhile.
		select {
		case inFlight <- struct{}{}:
			go func() {
				defer func() { <-inFlight }()
				r.scrape(ctx)
			}()
		default:
		}
		r.publish(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// scrape reads the engine's health and metrics once.
func (r *runner) scrape(ctx context.Context) {
	o := r.a.opts
	labels := []string{r.cfg.Model, r.cfg.Name}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.probeHealth(ctx)
	}()
	defer wg.Wait()

	start := time.Now()
	body, err := r.get(ctx, r.metricsURL, o.MaxBodyBytes)
	r.a.m.scrapeSeconds.WithLabelValues(labels...).Observe(time.Since(start).Seconds())
	var s Sample
	if err == nil {
		s, err = r.parser.Parse(body)
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.st.ScrapeFailures++
		r.a.m.scrapes.WithLabelValues(r.cfg.Model, r.cfg.Name, scrapeResult(err)).Inc()
		if ctx.Err() == nil && time.Since(r.lastScrapeWarn) >= scrapeWarnEvery {
			// At most one line per scrapeWarnEvery: an engine started without
			// its metrics endpoint (llama.cpp without --metrics) fails every scrape.
			r.lastScrapeWarn = time.Now()
			r.log.Warn().Err(err).Str("url", r.metricsURL).Uint64("failures", r.st.ScrapeFailures).Msg("metrics scrape failed")
		}
		return
	}
	r.st.Scrapes++
	r.a.m.scrapes.WithLabelValues(r.cfg.Model, r.cfg.Name, "ok").Inc()
	r.vals = r.est.Update(s, now)
	if r.vals.CounterReset {
		r.st.Resets++
		r.a.m.resets.WithLabelValues(labels...).Inc()
		r.log.Info().Msg("engine counters went down: engine restarted, deltas taken from zero")
	}
	r.lastOK = now
}

func scrapeResult(err error) string {
	switch {
	case errors.Is(err, ErrMetrics):
		return "bad_metrics"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	return "error"
}

// errStatus is a non-2xx answer.
type errStatus struct{ code int }

func (e errStatus) Error() string { return fmt.Sprintf("status %d", e.code) }

func (r *runner) get(ctx context.Context, u string, limit int64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, r.a.opts.ScrapeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	// Ask for the classic text format: expfmt's text parser reads it, and
	// every engine listed serves it by default.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := r.a.opts.HTTPClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, errStatus{resp.StatusCode}
	}
	if int64(len(body)) > limit {
		return nil, fmt.Errorf("%w: body of %s over %d bytes", ErrMetrics, u, limit)
	}
	return body, nil
}

// probeHealth calls the health endpoint. An error status or a refused
// connection is a definite failure; a timeout or other transport error
// says nothing about the engine (the agent may be the one cut off) and
// leaves the count as it is.
func (r *runner) probeHealth(ctx context.Context) {
	_, err := r.get(ctx, r.healthURL, 64<<10)
	var st errStatus
	isStatus := errors.As(err, &st)
	// 404 and 405 say the path is not served (a misconfigured health_path),
	// not that the engine is down: such an engine's health then follows
	// refused connections only.
	unserved := isStatus && (st.code == http.StatusNotFound || st.code == http.StatusMethodNotAllowed)
	definite := (isStatus && !unserved) || errors.Is(err, syscall.ECONNREFUSED)
	r.mu.Lock()
	defer r.mu.Unlock()
	if unserved && !r.healthUnserved {
		r.healthUnserved = true
		r.log.Warn().Int("status", st.code).Str("url", r.healthURL).Msg("health path not served; set health_path (health follows refused connections only)")
	}
	switch {
	case err == nil:
		if r.healthFail >= r.a.opts.HealthFailures {
			r.log.Info().Msg("engine health endpoint answers again")
		}
		r.healthFail = 0
	case definite:
		r.healthFail++
		r.st.HealthFailures++
		r.a.m.healthFailures.WithLabelValues(r.cfg.Model, r.cfg.Name).Inc()
		if r.healthFail == r.a.opts.HealthFailures {
			r.log.Warn().Err(err).Str("url", r.healthURL).Int("consecutive", r.healthFail).Msg("engine unhealthy, publishing health 0")
		}
	}
}

// publish sends one signal, or stays silent when the engine has not been
// seen for StaleAfter and is not known to be down.
func (r *runner) publish(ctx context.Context) {
	r.mu.Lock()
	down := r.healthFail >= r.a.opts.HealthFailures
	fresh := !r.lastOK.IsZero() && time.Since(r.lastOK) <= r.a.opts.StaleAfter
	if r.lastOK.IsZero() && !down {
		r.mu.Unlock()
		return // nothing seen yet: nothing to publish
	}
	if !fresh && !down {
		r.st.Silent++
		r.a.m.signals.WithLabelValues(r.cfg.Model, r.cfg.Name, "silent").Inc()
		if !r.silent {
			r.log.Warn().Dur("stale_after", r.a.opts.StaleAfter).Msg("engine metrics unreachable, not publishing (routers treat it as unknown)")
		}
		r.silent = true
		r.mu.Unlock()
		return
	}
	if r.silent {
		r.log.Info().Msg("engine metrics reachable again, publishing")
		r.silent = false
	}
	v := r.vals
	health := r.healthLocked()
	r.mu.Unlock()

	sig := messages.EngineSignal{
		Version: messages.SchemaVersion, Kind: messages.KindSignal,
		// Clamped to the signal's ranges: an engine's absurd counter must
		// not make every signal invalid.
		TTFTMs: math.Min(v.TTFTMs, maxMs), TBTMs: math.Min(v.TBTMs, maxMs), Queue: v.Queue, Running: v.Running,
		MaxRunning: v.MaxRunning, KVUse: v.KVUse, CapacityRPS: math.Min(v.CapacityRPS, maxRate),
		LoadRPS: math.Min(v.LoadRPS, maxRate), OutputTokens: math.Min(v.OutputTokens, 1e7), Replicas: r.cfg.Replicas,
		Health: health, BaseLatencyMs: math.Min(v.BaseLatencyMs, maxMs),
		Transports: []messages.Transport{{Kind: messages.TransportHTTP, Address: r.cfg.Advertise}},
	}
	if down {
		// A down engine runs nothing; its last gauges would mislead.
		sig.Queue, sig.Running, sig.LoadRPS = 0, 0, 0
	}
	r.pub.Set(sig)
	err := r.pub.PublishNow(ctx)
	result := "published"
	if err != nil {
		result = "failed"
	}
	r.a.m.signals.WithLabelValues(r.cfg.Model, r.cfg.Name, result).Inc()
	if err == nil {
		r.mu.Lock()
		r.st.Published++
		r.mu.Unlock()
	}
}

type agentMetrics struct {
	scrapes, signals, resets, healthFailures *prometheus.CounterVec
	scrapeSeconds                            *prometheus.HistogramVec
}

func newAgentMetrics(reg prometheus.Registerer) (*agentMetrics, error) {
	l := []string{"model", "engine"}
	m := &agentMetrics{
		scrapes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_agent_scrapes_total", Help: "Metrics scrapes by result (ok, timeout, error, bad_metrics).",
		}, append(l, "result")),
		signals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_agent_signals_total", Help: "Signal intervals by result (published, failed, silent).",
		}, append(l, "result")),
		resets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_agent_counter_resets_total", Help: "Engine restarts seen as counters going down.",
		}, l),
		healthFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_agent_health_failures_total", Help: "Definite health-probe failures (error status or connection refused).",
		}, l),
		scrapeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "switchyard_agent_scrape_duration_seconds", Help: "Time to fetch one metrics text.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 8),
		}, l),
	}
	for _, c := range []prometheus.Collector{m.scrapes, m.signals, m.resets, m.healthFailures, m.scrapeSeconds} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
