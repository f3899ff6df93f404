package control

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/auth/endpoints"
	"github.com/switchyard-dev/switchyard/internal/poison"
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
	// state (health 0 in its newest signal) changes, outside any lock; the
	// service wires it to the handler's LiveSet so that Pick skips a down
	// engine at once.
	OnDown func(model, engine string, down bool)
	// OnSilent is called whenever an engine's signals go silent (the
	// newest is older than DownAfter while NATS is connected) or resume,
	// outside any lock; the service wires it to the handler's LiveSet,
	// where a silent engine stays usable on the router's own successes
	// (LiveSet.SetSilent).
	OnSilent func(model, engine string, silent bool)
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
	// Endpoints, when set, is the operator's endpoint policy: a signal
	// advertising a URL or subject it refuses is ignored (counted in
	// switchyard_router_endpoints_refused_total and logged at a bounded
	// rate), so that an engine's identity cannot point routers elsewhere.
	// Nil uses whatever engines advertise.
	Endpoints *endpoints.Policy
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
	// Down is true when the engine reports health 0 in its newest signal.
	Down bool
	// Silent is true when its newest signal is older than DownAfter
	// (counted only while NATS is connected, and from the reconnect). A
	// silent engine's state is unknown, not down: its signals may have
	// stopped because the signal path lost them, not because it stopped.
	Silent bool
	// URL is the advertised HTTP base URL, empty when none.
	URL string
	// Subject is the advertised NATS inference subject, empty when none.
	Subject string
	// ServedModel is the name the engine serves the model under, empty
	// when it is the model id (messages.EngineSignal.ServedModel).
	ServedModel string
}

// Endpoints are the ways an engine can be reached, and the model name it
// is to be sent.
type Endpoints struct {
	// URL is the HTTP base URL, empty when none.
	URL string
	// Subject is the NATS inference subject, empty when none.
	Subject string
	// ServedModel is the name the engine serves the model under, empty
	// when it is the model id.
	ServedModel string
}

// EndpointResolver finds an engine's live endpoints; Signals implements it.
type EndpointResolver interface {
	// Endpoints returns the endpoints the engine advertises for model.
	Endpoints(model, engine string) (Endpoints, bool)
}

type signalEntry struct {
	view EngineView
	// heard counts the signals received since Run started, up to
	// MaxHeard (see HeardAll).
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
	guard     *poison.Guard

	endpoints atomic.Pointer[map[string]Endpoints] // "<model>.<engine>" → endpoints; copy on write
	version   atomic.Uint64

	running bool // Run has subscribed (under mu)
	// short counts the engines heard from since Run started fewer than
	// MaxHeard times (under mu).
	short    int
	heardAny bool

	received prometheus.Counter
	rejected *prometheus.CounterVec
	refused  *prometheus.CounterVec
	down     prometheus.Gauge
}

// rejectSubject counts a valid signal published on another engine's subject.
const rejectSubject = poison.ReasonSubject

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
	log := opts.Logger.With().Str("component", "router").Logger()
	guard, err := poison.New(poison.Options{Component: "router", Logger: log, Registerer: opts.Registry, Now: opts.Now})
	if err != nil {
		return nil, fmt.Errorf("router: new signals: %w", err)
	}
	s := &Signals{
		opts:    opts,
		log:     log,
		engines: make(map[string]map[string]*signalEntry),
		guard:   guard,
		received: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_router_signals_received_total",
			Help: "Engine signals received and accepted by the router's local guard.",
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_router_signals_rejected_total",
			Help: "Engine signals that failed to decode or validate, whose subject does not match, or whose handling panicked, by reason.",
		}, []string{"reason"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_router_endpoints_refused_total",
			Help: "Engine signals ignored because the operator's endpoint policy refuses the URL or subject they advertise, by reason.",
		}, []string{"reason"}),
		down: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_router_engines_down",
			Help: "Engines the router's local guard counts as down (health 0) or silent, over all models.",
		}),
	}
	empty := map[string]Endpoints{}
	s.endpoints.Store(&empty)
	if opts.Registry != nil {
		for _, c := range []prometheus.Collector{s.received, s.rejected, s.refused, s.down} {
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
			s.guard.Flush()
		}
	}
}

// MaxHeard caps the per-engine count of signals HeardAll looks at: a
// caller asks HeardAll(MaxHeard) for "every engine heard from signalled
// that many times".
const MaxHeard = 3

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
	if n >= MaxHeard {
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

// DownAfter returns the signal age past which an engine counts as down
// (SignalOptions.DownAfter, defaulted).
func (s *Signals) DownAfter() time.Duration { return s.opts.DownAfter }

// Version rises whenever the set of engines, their endpoints, down states
// or capacities change; the snapshot store uses it to rebuild local-policy
// tables only when needed.
func (s *Signals) Version() uint64 { return s.version.Load() }

// handle decodes and folds in one signal message. A panic while handling
// it (in folding, or in the OnSignal and OnDown callbacks) is recovered
// and counted: the message is dropped, the router goes on.
func (s *Signals) handle(m *nats.Msg) {
	defer s.guard.Recover("signals", m.Subject, func() { s.rejected.WithLabelValues(poison.ReasonPanic).Inc() })
	now := s.opts.Now()
	var sig messages.EngineSignal
	if err := messages.DecodeIntoAt(m.Data, &sig, now); err != nil {
		s.reject(m.Subject, poison.Reason(err), err)
		return
	}
	toks, ok := s.opts.Names.ParseSubject(m.Subject, "signal", 2)
	if !ok || toks[0] != sig.Model || toks[1] != sig.Engine {
		s.reject(m.Subject, rejectSubject, fmt.Errorf("signal of %s/%s on subject %q", sig.Model, sig.Engine, m.Subject))
		return
	}
	ep := endpointsOf(sig.Transports)
	if err := s.opts.Endpoints.Check(sig.Model, sig.Engine, ep.URL, ep.Subject); err != nil {
		if errors.Is(err, endpoints.ErrResolving) {
			return // undecided until the name resolves; a later signal will be
		}
		reason := endpoints.Reason(err)
		s.refused.WithLabelValues(reason).Inc()
		s.guard.Log("endpoint/"+m.Subject).Err(err).Str("subject", m.Subject).Str("reason", reason).
			Str("model", sig.Model).Str("engine", sig.Engine).
			Msg("ignored an engine signal: the operator's endpoint policy refuses the endpoint it advertises (logged at a bounded rate)")
		return
	}
	s.received.Inc()
	r, ok := s.fold(&sig, ep, now)
	if !ok {
		return
	}
	if r.changed || r.downChanged || r.wasSilent {
		s.version.Add(1)
	}
	if r.epChanged && s.opts.OnEndpoints != nil {
		s.opts.OnEndpoints(sig.Model, sig.Engine, r.ep)
	}
	if r.wasSilent {
		s.log.Info().Str("model", sig.Model).Str("engine", sig.Engine).Msg("engine signalling again")
		if s.opts.OnSilent != nil {
			s.opts.OnSilent(sig.Model, sig.Engine, false)
		}
	}
	if s.opts.OnSignal != nil {
		s.opts.OnSignal(&sig)
	}
	if r.downChanged {
		if !r.first || r.view.Down {
			s.log.Info().Str("model", sig.Model).Str("engine", sig.Engine).Bool("down", sig.Health <= 0).
				Float64("health", sig.Health).Msg("engine health changed")
		}
		if s.opts.OnDown != nil {
			s.opts.OnDown(sig.Model, sig.Engine, sig.Health <= 0)
		}
	}
}

// foldResult is what folding one signal changed.
type foldResult struct {
	view        EngineView // the engine's view after the signal
	ep          Endpoints  // the endpoints the signal advertises
	first       bool       // the engine's first signal
	changed     bool       // capacity, health or endpoints changed
	downChanged bool       // the down mark changed (or first)
	epChanged   bool       // the endpoints changed (or first)
	wasSilent   bool       // the engine had gone silent before this signal
}

// fold records sig as its engine's newest signal, unless a newer one
// overtook it (ok false), and returns what changed. The lock is released by
// defer, so that a panic cannot leave it held.
func (s *Signals) fold(sig *messages.EngineSignal, ep Endpoints, now time.Time) (r foldResult, ok bool) {
	r.ep = ep
	r.ep.ServedModel = sig.ServedModel
	s.mu.Lock()
	defer s.mu.Unlock()
	byEngine := s.engines[sig.Model]
	if byEngine == nil {
		byEngine = make(map[string]*signalEntry)
		s.engines[sig.Model] = byEngine
	}
	e := byEngine[sig.Engine]
	r.first = e == nil
	if r.first {
		e = &signalEntry{view: EngineView{Model: sig.Model, Engine: sig.Engine}}
		byEngine[sig.Engine] = e
	} else if sig.Time < e.view.Signal.Time && sig.Seq <= e.view.Signal.Seq &&
		now.Sub(e.view.Received) < s.opts.DownAfter {
		return foldResult{}, false // an older signal overtaken by a newer one
	}
	if s.running && e.heard < MaxHeard {
		e.heard++
		s.heardAny = true
		switch e.heard {
		case 1:
			s.short++
		case MaxHeard:
			s.short--
		}
	}
	prevDown := e.view.Down
	r.wasSilent = e.view.Silent
	r.epChanged = r.first || e.view.URL != r.ep.URL || e.view.Subject != r.ep.Subject || e.view.ServedModel != r.ep.ServedModel
	r.changed = r.epChanged || e.view.Signal.CapacityRPS != sig.CapacityRPS || e.view.Signal.Health != sig.Health
	e.view.Signal = *sig
	e.view.Received = now
	e.view.URL, e.view.Subject, e.view.ServedModel = r.ep.URL, r.ep.Subject, r.ep.ServedModel
	e.view.Down = sig.Health <= 0
	e.view.Silent = false
	r.downChanged = r.first || prevDown != e.view.Down
	if r.epChanged {
		s.publishEndpointsLocked()
	}
	if r.downChanged || r.wasSilent {
		s.countDownLocked()
	}
	r.view = e.view
	return r, true
}

// reject counts a bad signal under reason and logs it at a bounded rate
// (per subject and in total).
func (s *Signals) reject(subject, reason string, err error) {
	s.rejected.WithLabelValues(reason).Inc()
	s.guard.Log(subject).Err(err).Str("subject", subject).Str("reason", reason).Msg("rejected an engine signal")
}

type downChange struct {
	model, engine string
	silent        bool
}

// Sweep re-evaluates signal ages now: an engine whose newest signal is older
// than DownAfter is counted silent. While NATS is disconnected no engine is
// counted silent (silence is then no evidence), and after a reconnect ages
// count from the reconnect. Run calls it every SweepInterval.
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
				silent := now.Sub(since) > s.opts.DownAfter
				if silent != e.view.Silent {
					e.view.Silent = silent
					changes = append(changes, downChange{model, name, silent})
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
		if c.silent {
			ev = s.log.Warn()
		}
		ev.Str("model", c.model).Str("engine", c.engine).Bool("silent", c.silent).Dur("down_after", s.opts.DownAfter).
			Msg("engine signal freshness changed (a silent engine is used only while this router's requests to it succeed)")
		if s.opts.OnSilent != nil {
			s.opts.OnSilent(c.model, c.engine, c.silent)
		}
	}
}

func (s *Signals) countDownLocked() {
	n := 0
	for _, byEngine := range s.engines {
		for _, e := range byEngine {
			if e.view.Down || e.view.Silent {
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
			m[model+"."+name] = Endpoints{URL: e.view.URL, Subject: e.view.Subject, ServedModel: e.view.ServedModel}
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

// endpointsOf picks the endpoints of a signal's transports
// (endpoints.Of: the first usable HTTP URL and NATS subject).
func endpointsOf(ts []messages.Transport) Endpoints {
	var ep Endpoints
	ep.URL, ep.Subject = endpoints.Of(ts)
	return ep
}
