package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/guard"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/streams"
)

// ReporterOptions configures NewReporter. Conn, Cluster and Router are
// required.
type ReporterOptions struct {
	// Conn is the NATS connection; the caller owns it.
	Conn *nats.Conn
	// Names is the NATS layout (default streams.DefaultNames()).
	Names streams.Names
	// Cluster and Router name the reporting router.
	Cluster, Router string
	// Interval is the report interval (default 1 s).
	Interval time.Duration
	// Tables, when set, lists the served models (each gets a report every
	// interval, idle or not) and their engines (probed for RTT).
	Tables Tables
	// Endpoints, when set, resolves engines' live endpoints for the probes.
	Endpoints EndpointResolver
	// ProbeInterval is the least time between two RTT probes of one
	// endpoint (default 5 s).
	ProbeInterval time.Duration
	// ProbeTimeout bounds one probe (default 1 s).
	ProbeTimeout time.Duration
	// RTTProbe is how HTTP engines are probed (default DefaultRTTProbe):
	// "tcp" times a TCP connect to the engine's host and port; "http:/path"
	// times a GET of that path on the engine's base URL. See CheckRTTProbe.
	RTTProbe string
	// PublishTimeout bounds publishing one interval's reports (default the
	// interval).
	PublishTimeout time.Duration
	// Logger receives the reporter's logs (component=router and cluster are added).
	Logger zerolog.Logger
	// Registry, when set, receives the reporter's metrics.
	Registry prometheus.Registerer
	// Now is the clock (default time.Now).
	Now func() time.Time
}

type engineAcc struct {
	sent, ok, timeouts int64
	errs               map[string]int64
	latSumMs           float64
	ttftSumMs          float64
	ttftN              int64
}

type modelAcc struct {
	requests int64
	prompt   int64 // estimated prompt tokens of the requests
	shed     int64
	retries  int64
	priority [protocol.NumPriorities]int64
	engines  map[string]*engineAcc
}

type probeState struct {
	last   time.Time
	rtt    time.Duration
	ok     bool
	warned bool // the probe path was answered 404/405 and that was logged
}

// DefaultRTTProbe is the default RTT probe: a TCP connect. The handshake
// takes one network round trip and nothing else, it works for every engine
// (vLLM, SGLang, TGI and llama.cpp serve /health, Switchyard's own engines
// /healthz: no one path is served by all) and it does not depend on the
// engine's HTTP stack. An HTTP probe also times the engine's own request
// handling, which grows with its load: that is not network latency, and the
// optimizer would read a busy engine as a far one.
const DefaultRTTProbe = "tcp"

// ErrBadRTTProbe is returned (wrapped) for an RTT probe CheckRTTProbe
// refuses.
var ErrBadRTTProbe = errors.New("invalid RTT probe")

// rttProbe is a parsed RTTProbe: tcp, or the HTTP path to GET.
type rttProbe struct {
	tcp  bool
	path string
}

// CheckRTTProbe reports whether s is a valid RTT probe: "tcp", or "http:"
// followed by an absolute path (an optional query allowed), such as
// "http:/health". The error wraps ErrBadRTTProbe and quotes s.
func CheckRTTProbe(s string) error {
	_, err := parseRTTProbe(s)
	return err
}

func parseRTTProbe(s string) (rttProbe, error) {
	if s == "tcp" {
		return rttProbe{tcp: true}, nil
	}
	path, ok := strings.CutPrefix(s, "http:")
	if !ok {
		return rttProbe{}, fmt.Errorf("%w %q: want tcp or http:/path", ErrBadRTTProbe, s)
	}
	u, err := url.ParseRequestURI(path)
	if err != nil || !strings.HasPrefix(path, "/") || strings.HasPrefix(path, "//") || u.Host != "" || u.Fragment != "" ||
		strings.ContainsAny(path, " \t#") {
		return rttProbe{}, fmt.Errorf("%w %q: the path after http: must be absolute, like http:/health", ErrBadRTTProbe, s)
	}
	return rttProbe{path: path}, nil
}

// Reporter counts what the router sees (an Observer) and publishes one
// messages.RouterReport per model every interval on
// <prefix>.report.<model>.<cluster>.<router> through JetStream, with
// Nats-Msg-Id "<router>-<random>-<model>-<seq>" (streams.MsgIDPrefix). Sequence numbers start at the
// start time in Unix milliseconds, so a restarted router never reuses an id
// inside the dedup window. Publishing runs on its own goroutine: failures
// are logged and counted, and never block requests; a report that cannot be
// published (NATS away) is dropped.
type Reporter struct {
	opts   ReporterOptions
	log    zerolog.Logger
	js     jetstream.JetStream
	rttHow rttProbe

	mu     sync.Mutex
	acc    map[string]*modelAcc
	seq    uint64
	msgID  string // streams.MsgIDPrefix of the router
	last   time.Time
	probes map[string]*probeState // endpoint → probe
	client *http.Client

	published prometheus.Counter
	failed    prometheus.Counter
	lastErrAt time.Time
}

// NewReporter returns a Reporter for opts; Run starts publishing.
func NewReporter(opts ReporterOptions) (*Reporter, error) {
	if opts.Conn == nil {
		return nil, errors.New("router: new reporter: ReporterOptions.Conn is nil")
	}
	if err := messages.CheckName("cluster", opts.Cluster); err != nil {
		return nil, fmt.Errorf("router: new reporter: %w", err)
	}
	if err := messages.CheckName("router", opts.Router); err != nil {
		return nil, fmt.Errorf("router: new reporter: %w", err)
	}
	if opts.Names.Prefix == "" {
		opts.Names = streams.DefaultNames()
	}
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = 5 * time.Second
	}
	if opts.ProbeTimeout <= 0 {
		opts.ProbeTimeout = time.Second
	}
	if opts.PublishTimeout <= 0 {
		opts.PublishTimeout = opts.Interval
	}
	if opts.RTTProbe == "" {
		opts.RTTProbe = DefaultRTTProbe
	}
	how, err := parseRTTProbe(opts.RTTProbe)
	if err != nil {
		return nil, fmt.Errorf("router: new reporter: ReporterOptions.RTTProbe: %w", err)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	js, err := jetstream.New(opts.Conn)
	if err != nil {
		return nil, fmt.Errorf("router: new reporter: %w", err)
	}
	now := opts.Now()
	r := &Reporter{
		opts:   opts,
		rttHow: how,
		log:    opts.Logger.With().Str("component", "router").Str("cluster", opts.Cluster).Logger(),
		js:     js,
		acc:    make(map[string]*modelAcc),
		seq:    uint64(now.UnixMilli()),
		msgID:  streams.MsgIDPrefix(opts.Router),
		last:   now,
		probes: make(map[string]*probeState),
		client: &http.Client{Timeout: opts.ProbeTimeout, Transport: &http.Transport{
			MaxIdleConnsPerHost: 1, IdleConnTimeout: 2 * opts.ProbeInterval, DisableCompression: true}},
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_router_reports_published_total",
			Help: "Router reports published to JetStream.",
		}),
		failed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_router_report_failures_total",
			Help: "Router reports that could not be published (and were dropped).",
		}),
	}
	if opts.Registry != nil {
		for _, c := range []prometheus.Collector{r.published, r.failed} {
			if err := opts.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("router: new reporter: register metrics: %w", err)
			}
		}
	}
	return r, nil
}

func (r *Reporter) model(name string) *modelAcc {
	m := r.acc[name]
	if m == nil {
		m = &modelAcc{engines: make(map[string]*engineAcc)}
		r.acc[name] = m
	}
	return m
}

// Request counts one client request for model.
func (r *Reporter) Request(model string) {
	r.mu.Lock()
	r.model(model).requests++
	r.mu.Unlock()
}

// Priority counts the priority class of one client request for model.
func (r *Reporter) Priority(model string, p protocol.Priority) {
	if p >= protocol.NumPriorities {
		return
	}
	r.mu.Lock()
	r.model(model).priority[p]++
	r.mu.Unlock()
}

// Prompt counts the estimated prompt tokens of one client request for
// model (protocol.PromptTokens), for the cluster's mix in the report.
func (r *Reporter) Prompt(model string, tokens int64) {
	if tokens <= 0 {
		return
	}
	r.mu.Lock()
	r.model(model).prompt += tokens
	r.mu.Unlock()
}

// Shed counts one shed request for model.
func (r *Reporter) Shed(model string, _ protocol.Priority, _ guard.ShedReason) {
	r.mu.Lock()
	r.model(model).shed++
	r.mu.Unlock()
}

// Retry counts one retry attempt for model.
func (r *Reporter) Retry(model string) {
	r.mu.Lock()
	r.model(model).retries++
	r.mu.Unlock()
}

// Outcome records one forwarding attempt of model to engine.
func (r *Reporter) Outcome(model, engine string, o Outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.model(model)
	e := m.engines[engine]
	if e == nil {
		e = &engineAcc{}
		m.engines[engine] = e
	}
	e.sent++
	switch o.Result {
	case ResultOK:
		e.ok++
		e.latSumMs += float64(o.Latency) / float64(time.Millisecond)
		if o.TTFT > 0 {
			e.ttftSumMs += float64(o.TTFT) / float64(time.Millisecond)
			e.ttftN++
		}
	case ResultTimeout:
		e.timeouts++
	case ResultCanceled:
	default:
		if e.errs == nil {
			e.errs = make(map[string]int64, 2)
		}
		e.errs[o.Result.Class()]++
	}
}

// Run publishes reports every Interval and probes engine RTTs until ctx
// ends.
func (r *Reporter) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.probeLoop(ctx)
	}()
	defer wg.Wait()
	tick := time.NewTicker(r.opts.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			r.Publish(ctx)
		}
	}
}

// Collect ends the current interval and returns its reports, one per
// model that is served or had traffic, sorted by model.
func (r *Reporter) Collect() []*messages.RouterReport {
	now := r.opts.Now()
	var served []string
	if r.opts.Tables != nil {
		served = r.opts.Tables.Models()
	}
	r.mu.Lock()
	acc := r.acc
	r.acc = make(map[string]*modelAcc, len(acc))
	interval := now.Sub(r.last).Seconds()
	r.last = now
	rtts := make(map[string]time.Duration, len(r.probes))
	for k, p := range r.probes {
		if p.ok {
			rtts[k] = p.rtt
		}
	}
	r.mu.Unlock()
	if interval <= 0 {
		interval = r.opts.Interval.Seconds()
	}
	// Within what validation accepts: a report collected within 10 ms of
	// the previous one (Collect called twice) is sent, not refused.
	interval = min(max(interval, messages.MinReportInterval), 3600)

	models := map[string]bool{}
	for _, m := range served {
		models[m] = true
	}
	for m := range acc {
		models[m] = true
	}
	var out []*messages.RouterReport
	for model := range models {
		if !messages.ValidModelName(model) {
			continue
		}
		rep := &messages.RouterReport{Model: model, Cluster: r.opts.Cluster, Router: r.opts.Router,
			Time: now.UnixMilli(), IntervalS: interval}
		if a := acc[model]; a != nil {
			rep.Requests = a.requests
			// Validation bounds the tokens by the requests: a Prompt call
			// without its Request (a caller's bug) is not sent.
			if a.requests > 0 {
				rep.PromptTokens = a.prompt
			}
			rep.Shed, rep.Retries = a.shed, a.retries
			for p, n := range a.priority {
				if n > 0 {
					if rep.DemandByPriority == nil {
						rep.DemandByPriority = make(map[string]int64, int(protocol.NumPriorities))
					}
					rep.DemandByPriority[protocol.Priority(p).String()] = n
				}
			}
			for name, e := range a.engines {
				if !messages.ValidName(name) {
					continue
				}
				o := messages.EngineOutcome{Sent: e.sent, Succeeded: e.ok, Timeouts: e.timeouts, Errors: e.errs}
				if e.ok > 0 {
					o.LatencyMs = e.latSumMs / float64(e.ok)
				}
				if e.ttftN > 0 {
					o.TTFTMs = e.ttftSumMs / float64(e.ttftN)
				}
				if rep.Engines == nil {
					rep.Engines = make(map[string]messages.EngineOutcome)
				}
				rep.Engines[name] = o
			}
		}
		for _, eng := range r.engines(model) {
			if d, ok := rtts[r.endpointKey(model, eng)]; ok && messages.ValidName(eng.Name) {
				if rep.RTTMs == nil {
					rep.RTTMs = make(map[string]float64)
				}
				rep.RTTMs[eng.Name] = float64(d) / float64(time.Millisecond)
			}
		}
		out = append(out, rep)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Model < out[b].Model })
	r.mu.Lock()
	for _, rep := range out {
		r.seq++
		rep.Seq = r.seq
	}
	r.mu.Unlock()
	return out
}

// Publish collects the interval's reports and publishes them. Errors are
// logged (at most every 10 s) and counted.
func (r *Reporter) Publish(ctx context.Context) {
	reps := r.Collect()
	if len(reps) == 0 {
		return
	}
	if !r.opts.Conn.IsConnected() {
		r.fail(len(reps), errors.New("NATS not connected"))
		return
	}
	pctx, cancel := context.WithTimeout(ctx, r.opts.PublishTimeout)
	defer cancel()
	for i, rep := range reps {
		subject, err := r.opts.Names.ReportSubject(rep.Model, rep.Cluster, rep.Router)
		if err != nil {
			r.fail(1, err)
			continue
		}
		data, err := messages.EncodeAt(rep, r.opts.Now())
		if err != nil {
			r.fail(1, fmt.Errorf("encode report of %s: %w", rep.Model, err))
			continue
		}
		id := r.msgID + rep.Model + "-" + strconv.FormatUint(rep.Seq, 10)
		if _, err := r.js.Publish(pctx, subject, data, jetstream.WithMsgID(id)); err != nil {
			if ctx.Err() != nil {
				// The router is stopping: the interval's reports have no reader
				// to miss them, so this is no fault to warn of.
				r.failed.Add(float64(len(reps) - i))
				r.log.Info().Int("reports", len(reps)-i).Msg("router reports not published: stopping")
				return
			}
			r.fail(len(reps)-i, fmt.Errorf("publish report on %s: %w", subject, err))
			return
		}
		r.published.Inc()
	}
}

func (r *Reporter) fail(n int, err error) {
	r.failed.Add(float64(n))
	now := r.opts.Now()
	r.mu.Lock()
	logIt := now.Sub(r.lastErrAt) >= 10*time.Second
	if logIt {
		r.lastErrAt = now
	}
	r.mu.Unlock()
	if logIt {
		r.log.Warn().Err(err).Int("reports", n).Msg("router reports dropped")
	}
}

// engines returns model's engines with live endpoints filled in.
func (r *Reporter) engines(model string) []selection.Engine {
	if r.opts.Tables == nil {
		return nil
	}
	t, _, ok := r.opts.Tables.Table(model)
	if !ok || t == nil {
		return nil
	}
	es := t.Engines()
	if r.opts.Endpoints != nil {
		for i := range es {
			if ep, ok := r.opts.Endpoints.Endpoints(model, es[i].Name); ok {
				if ep.URL != "" {
					es[i].URL = ep.URL
				}
				if ep.Subject != "" {
					es[i].Subject = ep.Subject
				}
			}
		}
	}
	return es
}

// endpointKey names what a probe of the engine measures: its HTTP base URL,
// or the NATS server for engines reached over NATS only.
func (r *Reporter) endpointKey(_ string, e selection.Engine) string {
	if e.URL != "" {
		return e.URL
	}
	if e.Subject != "" {
		return "nats:"
	}
	return ""
}

// probeLoop measures RTT to engines: for HTTP engines a TCP connect or a GET
// of the configured path (RTTProbe), for NATS-only engines the NATS
// connection's RTT; each endpoint at most once per ProbeInterval. A probe
// never counts against an engine's health: a failed one only measures no
// RTT.
func (r *Reporter) probeLoop(ctx context.Context) {
	tick := time.NewTicker(min(r.opts.Interval, r.opts.ProbeInterval))
	defer tick.Stop()
	for {
		r.probeDue(ctx)
		select {
		case <-ctx.Done():
			r.client.CloseIdleConnections()
			return
		case <-tick.C:
		}
	}
}

func (r *Reporter) probeDue(ctx context.Context) {
	if r.opts.Tables == nil {
		return
	}
	now := r.opts.Now()
	due := map[string]bool{}
	for _, model := range r.opts.Tables.Models() {
		for _, e := range r.engines(model) {
			k := r.endpointKey(model, e)
			if k == "" || due[k] {
				continue
			}
			r.mu.Lock()
			p := r.probes[k]
			if p == nil {
				p = &probeState{}
				r.probes[k] = p
			}
			isDue := now.Sub(p.last) >= r.opts.ProbeInterval
			if isDue {
				p.last = now
			}
			r.mu.Unlock()
			if isDue {
				due[k] = true
			}
		}
	}
	if len(due) == 0 {
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for k := range due {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			d, ok := r.probe(ctx, k)
			r.mu.Lock()
			if p := r.probes[k]; p != nil && ok {
				p.rtt, p.ok = d, true
			}
			r.mu.Unlock()
		}()
	}
	wg.Wait()
}

// probe measures the RTT to the endpoint key, and whether it measured one.
// A refused or timed-out connect, a transport error and an HTTP probe
// answered 404 or 405 (the engine does not serve that path: the answer says
// nothing about the engine, and its time includes a routing miss) measure
// none.
func (r *Reporter) probe(ctx context.Context, key string) (time.Duration, bool) {
	if key == "nats:" {
		d, err := r.opts.Conn.RTT()
		return d, err == nil
	}
	pctx, cancel := context.WithTimeout(ctx, r.opts.ProbeTimeout)
	defer cancel()
	if r.rttHow.tcp {
		return r.probeTCP(pctx, key)
	}
	req, err := http.NewRequestWithContext(pctx, http.MethodGet, strings.TrimSuffix(key, "/")+r.rttHow.path, nil)
	if err != nil {
		return 0, false
	}
	start := time.Now()
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, false
	}
	d := time.Since(start)
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	_ = resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed {
		r.unservedPath(key, resp.StatusCode)
		return 0, false
	}
	return d, true
}

// probeTCP times a TCP connect to the host and port of the base URL key
// (port 80 or 443 by scheme when the URL has none).
func (r *Reporter) probeTCP(ctx context.Context, key string) (time.Duration, bool) {
	u, err := url.Parse(key)
	if err != nil || u.Hostname() == "" {
		return 0, false
	}
	port := u.Port()
	if port == "" {
		switch u.Scheme {
		case "https":
			port = "443"
		case "http":
			port = "80"
		default:
			return 0, false
		}
	}
	var d net.Dialer
	start := time.Now()
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(u.Hostname(), port))
	if err != nil {
		return 0, false
	}
	rtt := time.Since(start)
	_ = c.Close()
	return rtt, true
}

// unservedPath logs, once per endpoint, that the engine answered the HTTP
// probe path with status: no RTT is measured there until the probe changes.
func (r *Reporter) unservedPath(key string, status int) {
	r.mu.Lock()
	p := r.probes[key]
	first := p != nil && !p.warned
	if first {
		p.warned = true
	}
	r.mu.Unlock()
	if first {
		r.log.Warn().Str("endpoint", key).Str("rtt_probe", r.opts.RTTProbe).Int("status", status).
			Msg("engine does not serve the RTT probe path: no RTT measured for it (the default probe, tcp, needs no path)")
	}
}
