package router

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/kvindex/kvfeed"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/httpfront"
	"github.com/switchyard-dev/switchyard/router/live"
	"github.com/switchyard-dev/switchyard/router/natsfront"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/router/tenant"
	"github.com/switchyard-dev/switchyard/router/upstream"
	"github.com/switchyard-dev/switchyard/streams"
)

// ServiceOptions configures NewService. Conn and Cluster are required.
type ServiceOptions struct {
	// Conn is the NATS connection; the caller owns it (and closes it after
	// Run returns).
	Conn *nats.Conn
	// Names is the NATS layout (default streams.DefaultNames()).
	Names streams.Names
	// Cluster is the router's frontend cluster.
	Cluster string
	// Router is the router's name, unique in its cluster (default
	// "<cluster>-<random hex>").
	Router string
	// HTTPAddr is the HTTP front's listen address, e.g. "127.0.0.1:8081";
	// ":0" picks a free port (see Addr). Empty: no HTTP front.
	HTTPAddr string
	// MetricsAddr, when set, serves /metrics on a listener of its own
	// (":0" picks a free port, see MetricsAddr), and the HTTP front
	// answers 404 there. Empty: /metrics is served on the HTTP front.
	MetricsAddr string
	// NoMetrics serves /metrics nowhere (a process that serves its
	// registry itself, as `switchyard up` does); it excludes MetricsAddr.
	NoMetrics bool
	// KeysFile, when set, is the front door's API keys file
	// (router/tenant): every request needs a key of it, runs at most at
	// its tenant's priority ceiling and within its rate, and its key is not
	// forwarded to engines. The file is re-read every
	// tenant.DefaultReloadInterval. Empty: the fronts are open.
	KeysFile string
	// Server tunes the HTTP server (its Addr is ignored).
	Server httpfront.ServerOptions
	// Aliases maps other public names of a model to its model id (see
	// Options.Aliases and CheckAliases).
	Aliases map[string]string
	// NoNATSFront turns the NATS front (sy.req.<cluster>.<model>) off.
	NoNATSFront bool
	// PreferNATS forwards over NATS to engines that offer both transports.
	PreferNATS bool
	// StaleAfter is the snapshot age past which the local policy takes over
	// (default DefaultStaleAfter).
	StaleAfter time.Duration
	// DownAfter is the signal age past which an engine counts as down
	// (default DefaultDownAfter).
	DownAfter time.Duration
	// ReportInterval is the report interval (default 1 s).
	ReportInterval time.Duration
	// RTTProbe is how the router measures its RTT to HTTP engines: "tcp"
	// (DefaultRTTProbe, the default) or "http:/path" (see CheckRTTProbe).
	RTTProbe string
	// RefreshInterval is how often the store re-evaluates staleness, the
	// local policy and down marks (default 250 ms).
	RefreshInterval time.Duration
	// Table tunes the selection tables.
	Table selection.TableOptions
	// MaxBodyBytes bounds request bodies on both fronts (default 8 MiB).
	MaxBodyBytes int64
	// HTTPTransport tunes forwarding over HTTP.
	HTTPTransport upstream.HTTPTransportOptions
	// WrapTransport, when set, wraps the transport the router forwards
	// through: internal/netem's network emulation, for stacks on one
	// machine.
	WrapTransport func(upstream.Transport) upstream.Transport
	// NATSFirstReplyTimeout bounds the wait for an engine's first NATS
	// reply (default 60 s).
	NATSFirstReplyTimeout time.Duration
	// Protection tunes ejection of failing engines, retries, the retry
	// budget and load shedding.
	Protection live.ProtectionOptions
	// ShutdownTimeout bounds the wait for HTTP requests in progress when
	// ctx ends (default 10 s); after it they are cut.
	ShutdownTimeout time.Duration
	// Logger receives the router's logs.
	Logger zerolog.Logger
	// Registry receives every metric (default: a new registry). It may be
	// shared or wrapped (prometheus.WrapRegistererWith, e.g. with a cluster
	// label) when one process runs several routers.
	Registry prometheus.Registerer
	// Metrics is what the HTTP front serves on /metrics (default: Registry,
	// when it is a prometheus.Gatherer as a *prometheus.Registry is;
	// required otherwise): with several routers in one process, the
	// process's registry holding all of their series.
	Metrics prometheus.Gatherer
	// KVEvents makes the router read the engines' KV events (the SY_KV
	// stream, which engine agents fill) into an engine-exact prefix index
	// per model (kvindex/kvfeed) and place requests with token keys by it
	// first (see Options.KV). Off: requests are placed by what this router
	// routed only.
	KVEvents bool
	// Tokenizer, when set, gives requests' token ids (see
	// Options.Tokenizer); without one only token-id prompts meet the
	// engines' KV events.
	Tokenizer protocol.Tokenizer
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Service is one router: the snapshot store, the live signal guard, the
// HTTP and NATS fronts, forwarding over HTTP and NATS, and the reports.
// It is what `switchyard router` and `switchyard up` run.
type Service struct {
	opts     ServiceOptions
	log      zerolog.Logger
	signals  *control.Signals
	store    *control.SnapshotStore
	reporter *control.Reporter
	handler  *Handler
	front    *natsfront.Front
	httpT    *upstream.HTTPTransport
	ln       net.Listener
	srv      httpfront.Server
	metLn    net.Listener
	metSrv   *http.Server
	keys     *tenant.Watcher
	kv       *kvfeed.Feed  // with KVEvents
	settled  chan struct{} // closed by settle: the handler routes from then on

	mu      sync.Mutex
	started bool
}

// withDefaults returns o with its zero fields set to their defaults; the
// fields whose zero value is a default of the component that reads them
// (StaleAfter, DownAfter, Protection, ...) are left to it.
func (o ServiceOptions) withDefaults() ServiceOptions {
	if o.Router == "" && o.Cluster != "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		o.Router = o.Cluster + "-" + hex.EncodeToString(b[:])
	}
	if o.Names.Prefix == "" {
		o.Names = streams.DefaultNames()
	}
	if o.Registry == nil {
		reg := prometheus.NewRegistry()
		o.Registry = reg
		if o.Metrics == nil {
			o.Metrics = reg
		}
	}
	if g, ok := o.Registry.(prometheus.Gatherer); ok && o.Metrics == nil {
		o.Metrics = g
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = 10 * time.Second
	}
	return o
}

// Validate reports the first field of o that no router can run with,
// naming it; zero fields that have defaults are valid. NewService calls it
// after the defaults are set; a command calls it to check its flags before
// it connects (Conn is not checked here: NewService requires it).
func (o ServiceOptions) Validate() error {
	if err := messages.CheckName("ServiceOptions.Cluster", o.Cluster); err != nil {
		return err
	}
	if o.Router != "" {
		if err := messages.CheckName("ServiceOptions.Router", o.Router); err != nil {
			return err
		}
	}
	if err := CheckAliases(o.Aliases); err != nil {
		return fmt.Errorf("ServiceOptions.Aliases: %w", err)
	}
	if o.RTTProbe != "" {
		if err := control.CheckRTTProbe(o.RTTProbe); err != nil {
			return fmt.Errorf("ServiceOptions.RTTProbe: %w", err)
		}
	}
	if o.Names.Prefix != "" {
		if err := o.Names.Validate(); err != nil {
			return fmt.Errorf("ServiceOptions.Names: %w", err)
		}
	}
	if o.Protection.Routers < 0 {
		return fmt.Errorf("%w: ServiceOptions.Protection.Routers is %d: a cluster has at least one router (0: the default, 1)", ErrBadOption, o.Protection.Routers)
	}
	if h := o.Protection.SlotHeadroom; h < 0 || math.IsNaN(h) || math.IsInf(h, 0) {
		return fmt.Errorf("%w: ServiceOptions.Protection.SlotHeadroom is %v: want 0 (the default) or more; Protection.NoSlotHeadroom turns it off", ErrBadOption, h)
	}
	if o.NoMetrics && o.MetricsAddr != "" {
		return fmt.Errorf("%w: ServiceOptions.MetricsAddr is %q with NoMetrics: want one of them", ErrBadOption, o.MetricsAddr)
	}
	if o.Registry != nil && o.Metrics == nil {
		if _, ok := o.Registry.(prometheus.Gatherer); !ok {
			return fmt.Errorf("%w: ServiceOptions.Metrics is nil and ServiceOptions.Registry is no prometheus.Gatherer: say what /metrics serves", ErrBadOption)
		}
	}
	return nil
}

// ErrBadOption marks an option value no router can run with (matched with
// errors.Is; the error names the field).
var ErrBadOption = errors.New("invalid router option")

// NewService builds a router for opts and, when HTTPAddr is set, opens its
// listener (so Addr is known before Run). Call Run, or Close when Run will
// not be called.
func NewService(opts ServiceOptions) (*Service, error) {
	if opts.Conn == nil {
		return nil, errors.New("router: new service: ServiceOptions.Conn is nil")
	}
	opts = opts.withDefaults()
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("router: new service: %w", err)
	}
	logger := opts.Logger.With().Str("router", opts.Router).Logger()
	s := &Service{opts: opts, log: logger.With().Str("component", "router").Str("cluster", opts.Cluster).Logger(),
		settled: make(chan struct{})}

	markDown := func(model, engine string, down bool) {
		if s.handler != nil {
			s.handler.SetEngineDown(model, engine, down)
		}
	}
	markSilent := func(model, engine string, silent bool) {
		if s.handler != nil {
			s.handler.Live(model).SetSilent(engine, silent)
		}
	}
	observe := func(sig *messages.EngineSignal) {
		if s.handler != nil {
			s.handler.ObserveSignal(sig)
		}
	}
	addressed := func(model, engine string, ep control.Endpoints) {
		if s.handler != nil {
			s.handler.SetEngineEndpoints(model, engine, ep)
		}
	}
	var err error
	s.signals, err = control.NewSignals(control.SignalOptions{Conn: opts.Conn, Names: opts.Names, DownAfter: opts.DownAfter,
		OnDown: markDown, OnSilent: markSilent, OnSignal: observe, OnEndpoints: addressed, Logger: logger, Registry: opts.Registry, Now: opts.Now})
	if err != nil {
		return nil, err
	}
	s.store, err = control.NewSnapshotStore(control.StoreOptions{Conn: opts.Conn, Names: opts.Names, Cluster: opts.Cluster,
		StaleAfter: opts.StaleAfter, Signals: s.signals, Guard: markDown, Table: opts.Table,
		RefreshInterval: opts.RefreshInterval, Logger: logger, Registry: opts.Registry, Now: opts.Now})
	if err != nil {
		return nil, err
	}
	s.reporter, err = control.NewReporter(control.ReporterOptions{Conn: opts.Conn, Names: opts.Names, Cluster: opts.Cluster,
		Router: opts.Router, Interval: opts.ReportInterval, RTTProbe: opts.RTTProbe, Tables: s.store, Endpoints: s.signals,
		Logger: logger, Registry: opts.Registry, Now: opts.Now})
	if err != nil {
		return nil, err
	}
	s.httpT = upstream.NewHTTPTransport(opts.HTTPTransport)
	natsT, err := upstream.NewNATSTransport(upstream.NATSTransportOptions{Conn: opts.Conn, FirstReplyTimeout: opts.NATSFirstReplyTimeout})
	if err != nil {
		return nil, err
	}
	var transport upstream.Transport = &upstream.TransportPolicy{HTTP: s.httpT, NATS: natsT, Endpoints: s.signals, PreferNATS: opts.PreferNATS}
	if opts.WrapTransport != nil {
		transport = opts.WrapTransport(transport)
	}
	var gate *tenant.Gate
	if opts.KeysFile != "" {
		keys, data, err := tenant.LoadFile(opts.KeysFile)
		if err != nil {
			return nil, fmt.Errorf("router: new service: ServiceOptions.KeysFile: %w", err)
		}
		if gate, err = tenant.NewGate(keys, opts.Registry); err != nil {
			return nil, err
		}
		if s.keys, err = tenant.NewWatcher(tenant.WatcherOptions{Path: opts.KeysFile, Gate: gate, Logger: logger}, data); err != nil {
			return nil, err
		}
	}
	var kv KVIndexes
	if opts.KVEvents {
		js, err := jetstream.New(opts.Conn)
		if err != nil {
			return nil, fmt.Errorf("router: new service: KV events: %w", err)
		}
		if s.kv, err = kvfeed.New(kvfeed.Options{JS: js, Names: opts.Names, Logger: logger}); err != nil {
			return nil, fmt.Errorf("router: new service: KV events: %w", err)
		}
		kv = s.kv
	}
	s.handler, err = NewHandler(Options{
		Tables:       s.store,
		Transport:    transport,
		Cluster:      opts.Cluster,
		Router:       opts.Router,
		Logger:       logger,
		Registry:     opts.Registry,
		Metrics:      opts.Metrics,
		MaxBodyBytes: opts.MaxBodyBytes,
		Now:          opts.Now,
		Observer:     s.reporter,
		Protection:   opts.Protection,
		Regions:      s.signals,
		Endpoints:    s.signals,
		Settled:      s.settled,
		Tenants:      gate,
		NoMetrics:    opts.MetricsAddr != "" || opts.NoMetrics,
		Aliases:      opts.Aliases,
		KV:           kv,
		Tokenizer:    opts.Tokenizer,
	})
	if err != nil {
		return nil, err
	}
	if !opts.NoNATSFront {
		s.front, err = natsfront.New(natsfront.Options{Conn: opts.Conn, Names: opts.Names, Cluster: opts.Cluster,
			Pipeline: s.handler, Logger: logger})
		if err != nil {
			return nil, err
		}
	}
	if opts.HTTPAddr != "" {
		s.ln, err = net.Listen("tcp", opts.HTTPAddr)
		if err != nil {
			return nil, fmt.Errorf("router: listen on %s: %w", opts.HTTPAddr, err)
		}
		so := opts.Server
		so.Addr = s.ln.Addr().String()
		if s.srv, err = NewServer(s.handler, so); err != nil {
			_ = s.ln.Close()
			return nil, err
		}
	}
	if opts.MetricsAddr != "" {
		if s.metLn, err = net.Listen("tcp", opts.MetricsAddr); err != nil {
			if s.ln != nil {
				_ = s.ln.Close()
			}
			return nil, fmt.Errorf("router: listen for /metrics on %s: %w", opts.MetricsAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", s.handler.MetricsHandler())
		s.metSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	}
	return s, nil
}

// settlePoll is how often settle re-checks what the router has heard.
const settlePoll = 20 * time.Millisecond

// settle closes s.settled, so that the handler starts routing, once the
// router knows enough of the engines not to route on a stale picture: once
// the weights watcher delivered the stored snapshots, the engines they
// plan for have all signalled since the start
// (their addresses are known), or every engine heard from has signalled
// three times (two signal intervals passed: an engine a snapshot names that
// has not signalled by then is taken as gone, and routed around), or
// DownAfter passed (an engine silent that long would count as down had it
// signalled before). A snapshot stored by an earlier run is installed at
// once and names engines whose addresses, new in this run, come only with
// their signals; until then requests wait rather than go nowhere.
func (s *Service) settle(ctx context.Context) {
	start := time.Now()
	limit := time.NewTimer(s.signals.DownAfter())
	defer limit.Stop()
	tick := time.NewTicker(settlePoll)
	defer tick.Stop()
	for {
		why := s.settledBy()
		if why == "" {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				continue
			case <-limit.C:
				why = "down_after"
			}
		}
		s.store.StartRouting() // and local-policy tables for the models signalled so far
		close(s.settled)
		s.log.Info().Str("by", why).Dur("after", time.Since(start)).Msg("heard from the engines; routing")
		return
	}
}

// settledBy returns why the router may route now, "" when it should wait.
// Nothing but the engines' signals and a failed watch settles it before
// the stored snapshots were delivered: a router that routed on the
// signals alone would install the stored snapshot moments later anyway.
func (s *Service) settledBy() string {
	if !s.store.CaughtUp() {
		if s.store.WatchFailed() && s.signals.HeardAll(control.MaxHeard) {
			return "signals_without_weights" // the local policy's to route
		}
		return ""
	}
	planned, unheard := 0, 0
	s.store.PlannedEngines(func(model, engine string) bool {
		planned++
		if !s.signals.Heard(model, engine) {
			unheard++
			return false
		}
		return true
	})
	if planned > 0 && unheard == 0 {
		return "planned_engines"
	}
	if s.signals.HeardAll(control.MaxHeard) {
		return "signals"
	}
	return ""
}

// Settled is closed once the router has heard from the engines since Run
// started and routes requests (those that arrive before wait for it).
func (s *Service) Settled() <-chan struct{} { return s.settled }

// Addr returns the HTTP front's address ("" without one).
func (s *Service) Addr() string {
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// MetricsAddr returns the /metrics listener's address ("" without
// ServiceOptions.MetricsAddr).
func (s *Service) MetricsAddr() string {
	if s.metLn == nil {
		return ""
	}
	return s.metLn.Addr().String()
}

// Name returns the router's name.
func (s *Service) Name() string { return s.opts.Router }

// Handler returns the HTTP front.
func (s *Service) Handler() *Handler { return s.handler }

// Store returns the snapshot store.
func (s *Service) Store() *control.SnapshotStore { return s.store }

// Signals returns the live engine signals.
func (s *Service) Signals() *control.Signals { return s.signals }

// KV returns the engine-exact prefix indexes kept from the engines' KV
// events, nil without ServiceOptions.KVEvents.
func (s *Service) KV() *kvfeed.Feed { return s.kv }

// kvRetry is how long the router waits to subscribe to SY_KV again after
// a failed attempt (a stream not provisioned yet, a lost server): the
// requests meanwhile go by what the router routed.
const kvRetry = 5 * time.Second

// runKV keeps the KV event feed running until ctx ends: a failure to
// subscribe is logged (at warning level once) and retried, never the
// router's end, since requests can be placed without it.
func (s *Service) runKV(ctx context.Context) error {
	warned := false
	for {
		err := s.kv.Run(ctx)
		if ctx.Err() != nil {
			return nil
		}
		ev := s.log.Debug()
		if !warned {
			ev, warned = s.log.Warn(), true
		}
		ev.Err(err).Dur("retry_in", kvRetry).Msg("KV events unavailable: placing requests by what this router routed until they are")
		t := time.NewTimer(kvRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// Close releases the listener of a Service whose Run was never called.
func (s *Service) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return nil
	}
	s.started = true
	var errs []error
	for _, ln := range []net.Listener{s.ln, s.metLn} {
		if ln != nil {
			errs = append(errs, ln.Close())
		}
	}
	return errors.Join(errs...)
}

// Run runs the router until ctx ends or a part fails, then stops every
// part: the HTTP server stops accepting and waits up to ShutdownTimeout for
// requests in progress, NATS subscriptions are removed, and Run returns
// when all its goroutines have ended. It returns nil on a clean stop.
func (s *Service) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return errors.New("router: service already started or closed")
	}
	s.started = true
	s.mu.Unlock()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 8)
	var wg sync.WaitGroup
	start := func(name string, run func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx); err != nil {
				errc <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		}()
	}
	start("signals", s.signals.Run)
	start("snapshot store", s.store.Run)
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.settle(ctx)
	}()
	start("reports", s.reporter.Run)
	if s.front != nil {
		start("NATS front", s.front.Run)
	}
	if s.keys != nil {
		start("keys file", s.keys.Run)
	}
	if s.kv != nil {
		start("KV events", s.runKV)
	}
	if s.metSrv != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.metSrv.Serve(s.metLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("metrics: %w", err)
				cancel()
			}
		}()
	}
	if s.srv != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("HTTP front: %w", err)
				cancel()
			}
		}()
	}
	s.log.Info().Str("http", s.Addr()).Str("http_server", string(s.opts.Server.WithDefaults().Kind)).
		Bool("nats_front", s.front != nil).Bool("kv_events", s.kv != nil).Str("metrics", s.MetricsAddr()).Str("keys_file", s.opts.KeysFile).Msg("router started")
	<-ctx.Done()
	if s.metSrv != nil {
		_ = s.metSrv.Close() // scrapes are short: nothing to drain
	}
	if s.srv != nil {
		sctx, scancel := context.WithTimeout(context.Background(), s.opts.ShutdownTimeout)
		if err := s.srv.Shutdown(sctx); err != nil {
			_ = s.srv.Close()
		}
		scancel()
	}
	wg.Wait()
	s.httpT.CloseIdleConnections()
	close(errc)
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		s.log.Error().Err(errors.Join(errs...)).Msg("router stopped on error")
		return fmt.Errorf("router: %w", errors.Join(errs...))
	}
	s.log.Info().Msg("router stopped")
	return nil
}
