package router

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/streams"
)

// DefaultDownAfter is how old an engine's newest signal may be before the
// router counts the engine down, when SignalOptions.DownAfter is zero.
const DefaultDownAfter = 3 * time.Second

// SignalOptions configures NewSignals. Conn is required.
type SignalOptions struct {
	// Conn is the NATS connection; the caller owns it.
	Conn *nats.Conn
	// Names is the NATS layout (default streams.DefaultNames()).
	Names streams.Names
	// DownAfter is how old an engine's newest signal may be, while NATS is
	// connected, before the engine counts as down (default DefaultDownAfter).
	DownAfter time.Duration
	// SweepInterval is how often signal ages are checked (default
	// DownAfter/4).
	SweepInterval time.Duration
	// OnDown is called when an engine is first seen and whenever its down
	// state changes, outside any lock; the service wires it to the
	// handler's LiveSet so that Pick skips a down engine at once.
	OnDown func(model, engine string, down bool)
	// OnSignal, when set, is called with every signal accepted as the
	// engine's newest, outside any lock; it must not keep sig. The service
	// wires it to the handler's LiveSet for the engines' load (Bound.Load).
	OnSignal func(sig *messages.EngineSignal)
	// OnEndpoints, when set, is called when an engine is first seen and
	// whenever the endpoints it advertises change, outside any lock and
	// after Endpoints returns the new ones; the service wires it to the
	// handler (Handler.SetEngineEndpoints), which never picks an engine it
	// has no address for.
	OnEndpoints func(model, engine string, ep Endpoints)
	// Logger receives the component's logs (component=router is added).
	Logger zerolog.Logger
	// Registry, when set, receives the component's metrics.
	Registry prometheus.Registerer
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// EngineView is what the router knows about one engine of one model from
// the engine's live signals.
type EngineView struct {
	// Model and Engine name the engine.
	Model, Engine string
	// Signal is the newest signal received.
	Signal messages.EngineSignal
	// Received is when Signal was received.
	Received time.Time
	// Down is true when the engine reports health 0 or its newest signal is
	// older than DownAfter (counted only while NATS is connected).
	Down bool
	// URL is the advertised HTTP base URL, empty when none.
	URL string
	// Subject is the advertised NATS inference subject, empty when none.
	Subject string
}

// Endpoints are the ways an engine can be reached.
type Endpoints struct {
	// URL is the HTTP base URL, empty when none.
	URL string
	// Subject is the NATS inference subject, empty when none.
	Subject string
}

// EndpointResolver finds an engine's live endpoints; Signals implements it.
type EndpointResolver interface {
	// Endpoints returns the endpoints the engine advertises for model.
	Endpoints(model, engine string) (Endpoints, bool)
}

type signalEntry struct {
	view EngineView
	// heard counts the signals received since Run started, up to
	// maxHeard (see HeardAll).
	heard int
}

// Signals keeps the newest live signal of every engine, received over a
// core NATS subscription on the signal subjects (a plain subscription sees
// every JetStream-published signal). It is the router's fast local guard
// and the source of engine endpoints. It is safe for concurrent use.
type Signals struct {
	opts SignalOptions
	log  zerolog.Logger

	mu        sync.Mutex
	engines   map[string]map[string]*signalEntry // model → engine → entry
	connSince time.Time                          // when NATS was last seen to (re)connect
	connected bool
	badLog    map[string]time.Time // subject → last decode-error log

	endpoints atomic.Pointer[map[string]Endpoints] // "<model>.<engine>" → endpoints; copy on write
	version   atomic.Uint64

	running bool // Run has subscribed (under mu)
	// short counts the engines heard from since Run started fewer than
	// maxHeard times (under mu).
	short    int
	heardAny bool

	received prometheus.Counter
	rejected prometheus.Counter
	down     prometheus.Gauge
}

// NewSignals returns a Signals for opts; Run starts it.
func NewSignals(opts SignalOptions) (*Signals, error) {
	if opts.Conn == nil {
		return nil, errors.New("router: new signals: SignalOptions.Conn is nil")
	}
	if opts.Names.Prefix == "" {
		opts.Names = streams.DefaultNames()
	}
	if opts.DownAfter <= 0 {
		opts.DownAfter = DefaultDownAfter
	}
	if opts.SweepInterval <= 0 {
		opts.SweepInterval = opts.DownAfter / 4
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Signals{
		opts:    opts,
		log:     opts.Logger.With().Str("component", "router").Logger(),
		engines: make(map[string]map[string]*signalEntry),
		badLog:  make(map[string]time.Time),
		received: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_router_signals_received_total",
			Help: "Engine signals received and accepted by the router's local guard.",
		}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_router_signals_rejected_total",
			Help: "Engine signals that failed to decode or validate, or whose subject does not match.",
		}),
		down: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_router_engines_down",
			Help: "Engines the router's local guard counts as down, over all models.",
		}),
	}
	empty := map[string]Endpoints{}
	s.endpoints.Store(&empty)
	if opts.Registry != nil {
		for _, c := range []prometheus.Collector{s.received, s.rejected, s.down} {
			if err := opts.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("router: new signals: register metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Run subscribes to the signal subjects and checks signal ages until ctx
// ends. The subscription survives NATS reconnects (the client resubscribes).
func (s *Signals) Run(ctx context.Context) error {
	sub, err := s.opts.Conn.Subscribe(s.opts.Names.SignalFilter(), s.handle)
	if err != nil {
		return fmt.Errorf("router: subscribe to signals on %s: %w", s.opts.Names.SignalFilter(), err)
	}
	// Signals arrive at several per second per engine; a slow router drops
	// rather than queueing without bound.
	_ = sub.SetPendingLimits(65536, 64<<20)
	defer func() { _ = sub.Unsubscribe() }()
	s.mu.Lock()
	s.running = true
	s.mu.Unlock()
	tick := time.NewTicker(s.opts.SweepInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			s.Sweep()
		}
	}
}

// maxHeard caps the per-engine count of signals HeardAll looks at.
const maxHeard = 3

// HeardAll reports whether, since Run started, at least one engine
// signalled and every engine heard from signalled at least n times (n is
// capped at 3): n−1 signal intervals of each have passed, so that an
// engine that has not signalled by then is unlikely to be about to.
func (s *Signals) HeardAll(n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.heardAny {
		return false
	}
	if n >= maxHeard {
		return s.short == 0
	}
	for _, byEngine := range s.engines {
		for _, e := range byEngine {
			if e.heard > 0 && e.heard < n {
				return false
			}
		}
	}
	return true
}

// Heard reports whether the engine of model signalled since Run started.
func (s *Signals) Heard(model, engine string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.engines[model][engine]
	return ok && e.heard > 0
}

// Version rises whenever the set of engines, their endpoints, down states
// or capacities change; the snapshot store uses it to rebuild local-policy
// tables only when needed.
func (s *Signals) Version() uint64 { return s.version.Load() }

// handle decodes and folds in one signal message.
func (s *Signals) handle(m *nats.Msg) {
	now := s.opts.Now()
	var sig messages.EngineSignal
	if err := messages.DecodeIntoAt(m.Data, &sig, now); err != nil {
		s.reject(m.Subject, now, err)
		return
	}
	toks, ok := s.opts.Names.ParseSubject(m.Subject, "signal", 2)
	if !ok || toks[0] != sig.Model || toks[1] != sig.Engine {
		s.reject(m.Subject, now, fmt.Errorf("signal of %s/%s on subject %q", sig.Model, sig.Engine, m.Subject))
		return
	}
	s.received.Inc()
	ep := endpointsOf(sig.Transports)

	s.mu.Lock()
	byEngine := s.engines[sig.Model]
	if byEngine == nil {
		byEngine = make(map[string]*signalEntry)
		s.engines[sig.Model] = byEngine
	}
	e := byEngine[sig.Engine]
	first := e == nil
	if first {
		e = &signalEntry{view: EngineView{Model: sig.Model, Engine: sig.Engine}}
		byEngine[sig.Engine] = e
	} else if sig.Time < e.view.Signal.Time && sig.Seq <= e.view.Signal.Seq &&
		now.Sub(e.view.Received) < s.opts.DownAfter {
		s.mu.Unlock() // an older signal overtaken by a newer one
		return
	}
	if s.running && e.heard < maxHeard {
		e.heard++
		s.heardAny = true
		switch e.heard {
		case 1:
			s.short++
		case maxHeard:
			s.short--
		}
	}
	prevDown := e.view.Down
	changed := first || e.view.Signal.CapacityRPS != sig.CapacityRPS || e.view.Signal.Health != sig.Health ||
		e.view.URL != ep.URL || e.view.Subject != ep.Subject
	epChanged := first || e.view.URL != ep.URL || e.view.Subject != ep.Subject
	e.view.Signal = sig
	e.view.Received = now
	e.view.URL, e.view.Subject = ep.URL, ep.Subject
	e.view.Down = sig.Health <= 0
	downChanged := first || prevDown != e.view.Down
	if epChanged {
		s.publishEndpointsLocked()
	}
	if downChanged {
		s.countDownLocked()
	}
	s.mu.Unlock()

	if changed || downChanged {
		s.version.Add(1)
	}
	if epChanged && s.opts.OnEndpoints != nil {
		s.opts.OnEndpoints(sig.Model, sig.Engine, ep)
	}
	if s.opts.OnSignal != nil {
		s.opts.OnSignal(&sig)
	}
	if downChanged {
		if !first || e.view.Down {
			s.log.Info().Str("model", sig.Model).Str("engine", sig.Engine).Bool("down", sig.Health <= 0).
				Float64("health", sig.Health).Msg("engine health changed")
		}
		if s.opts.OnDown != nil {
			s.opts.OnDown(sig.Model, sig.Engine, sig.Health <= 0)
		}
	}
}

// reject counts a bad signal and logs it at most once per subject every 10 s.
func (s *Signals) reject(subject string, now time.Time, err error) {
	s.rejected.Inc()
	s.mu.Lock()
	last, seen := s.badLog[subject]
	logIt := !seen || now.Sub(last) >= 10*time.Second
	if logIt {
		if len(s.badLog) > 4096 {
			clear(s.badLog)
		}
		s.badLog[subject] = now
	}
	s.mu.Unlock()
	if logIt {
		s.log.Warn().Err(err).Str("subject", subject).Msg("rejected an engine signal")
	}
}

type downChange struct {
	model, engine string
	down          bool
}

// Sweep re-evaluates signal ages now: an engine whose newest signal is older
// than DownAfter is counted down. While NATS is disconnected no engine is
// counted down for age (silence is then no evidence), and after a reconnect
// ages count from the reconnect. Run calls it every SweepInterval.
func (s *Signals) Sweep() {
	now := s.opts.Now()
	connected := s.opts.Conn.IsConnected()
	var changes []downChange
	s.mu.Lock()
	if connected && !s.connected {
		s.connSince = now
	}
	s.connected = connected
	if connected {
		for model, byEngine := range s.engines {
			for name, e := range byEngine {
				since := e.view.Received
				if s.connSince.After(since) {
					since = s.connSince
				}
				down := e.view.Signal.Health <= 0 || now.Sub(since) > s.opts.DownAfter
				if down != e.view.Down {
					e.view.Down = down
					changes = append(changes, downChange{model, name, down})
				}
			}
		}
	}
	if len(changes) > 0 {
		s.countDownLocked()
	}
	s.mu.Unlock()
	if len(changes) == 0 {
		return
	}
	s.version.Add(1)
	for _, c := range changes {
		ev := s.log.Info()
		if c.down {
			ev = s.log.Warn()
		}
		ev.Str("model", c.model).Str("engine", c.engine).Bool("down", c.down).Dur("down_after", s.opts.DownAfter).
			Msg("engine signal freshness changed")
		if s.opts.OnDown != nil {
			s.opts.OnDown(c.model, c.engine, c.down)
		}
	}
}

func (s *Signals) countDownLocked() {
	n := 0
	for _, byEngine := range s.engines {
		for _, e := range byEngine {
			if e.view.Down {
				n++
			}
		}
	}
	s.down.Set(float64(n))
}

func (s *Signals) publishEndpointsLocked() {
	m := make(map[string]Endpoints)
	for model, byEngine := range s.engines {
		for name, e := range byEngine {
			m[model+"."+name] = Endpoints{URL: e.view.URL, Subject: e.view.Subject}
		}
	}
	s.endpoints.Store(&m)
}

// Endpoints returns the endpoints the engine of model advertised in its
// newest signal. It takes no lock.
func (s *Signals) Endpoints(model, engine string) (Endpoints, bool) {
	ep, ok := (*s.endpoints.Load())[model+"."+engine]
	return ep, ok
}

// Engine returns the view of one engine.
func (s *Signals) Engine(model, engine string) (EngineView, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.engines[model][engine]
	if !ok {
		return EngineView{}, false
	}
	return e.view, true
}

// Region returns the region the engine's newest signal names, "" when
// unknown; it makes Signals a RegionResolver.
func (s *Signals) Region(model, engine string) string {
	v, ok := s.Engine(model, engine)
	if !ok {
		return ""
	}
	return v.Signal.Region
}

// Engines returns the views of model's engines, sorted by name.
func (s *Signals) Engines(model string) []EngineView {
	s.mu.Lock()
	out := make([]EngineView, 0, len(s.engines[model]))
	for _, e := range s.engines[model] {
		out = append(out, e.view)
	}
	s.mu.Unlock()
	sort.Slice(out, func(a, b int) bool { return out[a].Engine < out[b].Engine })
	return out
}

// Models returns the models any engine has signalled for, sorted.
func (s *Signals) Models() []string {
	s.mu.Lock()
	out := make([]string, 0, len(s.engines))
	for m := range s.engines {
		out = append(out, m)
	}
	s.mu.Unlock()
	sort.Strings(out)
	return out
}

// endpointsOf picks the first usable HTTP and NATS transports of a signal:
// an absolute http(s) URL, and a subject without wildcards or spaces.
func endpointsOf(ts []messages.Transport) Endpoints {
	var ep Endpoints
	for _, t := range ts {
		switch t.Kind {
		case messages.TransportHTTP:
			if ep.URL == "" && validBaseURL(t.Address) {
				ep.URL = strings.TrimSuffix(t.Address, "/")
			}
		case messages.TransportNATS:
			if ep.Subject == "" && validSubject(t.Address) {
				ep.Subject = t.Address
			}
		}
	}
	return ep
}

func validBaseURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.RawQuery == "" && u.Fragment == ""
}

func validSubject(s string) bool {
	if s == "" || len(s) > 256 || strings.ContainsAny(s, " \t\r\n*>") || strings.HasPrefix(s, ".") ||
		strings.HasSuffix(s, ".") || strings.Contains(s, "..") {
		return false
	}
	return true
}
