package stack

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/internal/netem"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/services/aggregator"
	"github.com/switchyard-dev/switchyard/services/enginesim"
	"github.com/switchyard-dev/switchyard/services/optimizersvc"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/streams/natsembed"
)

// Options configures an in-process stack.
type Options struct {
	// File is the stack to run. Nil means Default().
	File *File
	// DataDir holds the embedded NATS server's JetStream store. Required.
	DataDir string
	// NATSHost and NATSPort are the embedded server's client address; port -1
	// picks a free port, 0 listens nowhere (in-process clients only).
	NATSHost string
	NATSPort int
	// Aggregator holds aggregator options; Conn, Logger and Registerer are set by the stack.
	Aggregator aggregator.Options
	// Optimizer holds optimizer service options; Conn, NetworkMs, Clusters,
	// Logger and Registerer are set by the stack.
	Optimizer optimizersvc.Options
	// NoOptimizer leaves the optimizer service out.
	NoOptimizer bool
	// SignalInterval is the engines' signal period; zero means the SDK default.
	SignalInterval time.Duration
	// RouterAddr, when set, overrides every cluster's router address (for
	// tests: "127.0.0.1:0" picks free ports). Empty uses the stack file's.
	RouterAddr string
	// NoRouters leaves the routers out.
	NoRouters bool
	// EmulateNetwork makes each router wait the stack file's one-way network
	// latency to an engine before forwarding to it and before relaying its
	// answer (internal/netem), so that cross-region requests take
	// longer, as they would.
	EmulateNetwork bool
	// Logger receives every component's log.
	Logger zerolog.Logger
	// Registerer receives every component's metrics; nil means none.
	Registerer prometheus.Registerer
}

// Stack is a running in-process deployment: start it with Start, stop it with Close.
type Stack struct {
	opts    Options
	file    *File
	nats    *natsembed.Server
	conn    *nats.Conn
	engines []*enginesim.Engine
	routers []*router.Service
	// optimizer is the optimizer service, nil with NoOptimizer.
	optimizer *optimizersvc.Service
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	errs      chan error
}

// Start starts the embedded NATS server, provisions the layout, and starts the
// aggregator and the simulated engines. On error everything started is stopped.
func Start(ctx context.Context, opts Options) (_ *Stack, err error) {
	if opts.File == nil {
		opts.File = Default()
	}
	if err := opts.File.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrStack, err)
	}
	if opts.DataDir == "" {
		return nil, errors.New("stack: Options.DataDir is required")
	}
	log := opts.Logger
	srv, err := natsembed.Start(natsembed.Options{DataDir: opts.DataDir, Host: opts.NATSHost, Port: opts.NATSPort,
		Logger: &log, ServerName: "switchyard-up"})
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	s := &Stack{opts: opts, file: opts.File, nats: srv, cancel: cancel, errs: make(chan error, 16)}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	s.conn, err = streams.Connect(ctx, streams.ConnectOptions{InProcess: srv.Server(), Name: "switchyard-up", Logger: log})
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(s.conn)
	if err != nil {
		return nil, err
	}
	if err := streams.Provision(ctx, js, streams.DefaultNames(), streams.ProvisionOptions{}); err != nil {
		return nil, err
	}

	ao := opts.Aggregator
	ao.Conn, ao.Logger, ao.Registerer = s.conn, log, opts.Registerer
	agg, err := aggregator.New(ao)
	if err != nil {
		return nil, err
	}
	s.goRun("aggregator", func() error { return agg.Run(runCtx) })

	f := s.file
	if !opts.NoOptimizer {
		oo := opts.Optimizer
		oo.Conn, oo.Logger, oo.Registerer = s.conn, log, opts.Registerer
		oo.NetworkMs = f.NetworkTable()
		oo.PreferConfiguredNetwork = true // one machine: every measured RTT is loopback
		oo.Clusters = nil
		for _, c := range f.Clusters {
			oo.Clusters = append(oo.Clusters, c.Name)
		}
		if oo.Instance == "" {
			oo.Instance = "up"
		}
		opt, err := optimizersvc.New(oo)
		if err != nil {
			return nil, fmt.Errorf("stack: optimizer service: %w", err)
		}
		s.optimizer = opt
		s.goRun("optimizer", func() error { return opt.Run(runCtx) })
	}
	for _, e := range f.Engines {
		eo := enginesim.Options{
			Name: e.Name, Model: f.Model, Region: e.Region, Listen: e.Listen,
			OutputTokens: f.Sim.OutputTokens, PromptTokens: f.Sim.PromptTokens, BaseTBTMs: f.Sim.BaseTBTMs,
			TBTGrowthMs: f.Sim.TBTGrowthMs, PrefillMsPerToken: f.Sim.PrefillMsPerToken,
			Conn: s.conn, SignalInterval: opts.SignalInterval, Logger: log,
		}
		b, err := enginesim.BatchForCapacity(eo, e.CapacityRPS)
		if err != nil {
			return nil, fmt.Errorf("stack: engine %s: %w", e.Name, err)
		}
		eo.MaxBatch = b
		eng, err := enginesim.New(eo)
		if err != nil {
			return nil, fmt.Errorf("stack: engine %s: %w", e.Name, err)
		}
		if err := eng.Start(ctx); err != nil {
			return nil, fmt.Errorf("stack: engine %s: %w", e.Name, err)
		}
		s.engines = append(s.engines, eng)
	}
	if !opts.NoRouters {
		for _, c := range f.Clusters {
			addr := c.Router
			if opts.RouterAddr != "" {
				addr = opts.RouterAddr
			}
			ro := router.ServiceOptions{Conn: s.conn, Cluster: c.Name, Router: c.Name + "-1", HTTPAddr: addr,
				Logger: log.With().Str("cluster", c.Name).Logger()}
			if opts.EmulateNetwork {
				ro.WrapTransport = netem.Wrap(f.DelayFrom(c.Name))
			}
			rs, err := router.NewService(ro)
			if err != nil {
				return nil, fmt.Errorf("stack: router of cluster %s: %w", c.Name, err)
			}
			s.routers = append(s.routers, rs)
			s.goRun("router "+c.Name, func() error { return rs.Run(runCtx) })
		}
	}
	return s, nil
}

func (s *Stack) goRun(name string, fn func() error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := fn(); err != nil {
			s.errs <- fmt.Errorf("stack: %s: %w", name, err)
		}
	}()
}

// Errors delivers the error of any component that stopped on its own.
func (s *Stack) Errors() <-chan error { return s.errs }

// File returns the stack being run.
func (s *Stack) File() *File { return s.file }

// NATSURL returns the embedded server's client URL ("" with no client listener).
func (s *Stack) NATSURL() string { return s.nats.ClientURL() }

// Conn returns the stack's own NATS connection.
func (s *Stack) Conn() *nats.Conn { return s.conn }

// Engines returns the simulated engines, in stack file order.
func (s *Stack) Engines() []*enginesim.Engine { return s.engines }

// Routers returns the routers, one per frontend cluster in stack file order.
func (s *Stack) Routers() []*router.Service { return s.routers }

// Optimizer returns the optimizer service, or nil when left out.
func (s *Stack) Optimizer() *optimizersvc.Service { return s.optimizer }

// Close stops every component, then the NATS server, and waits for them.
func (s *Stack) Close() {
	s.cancel()
	s.wg.Wait()
	for _, r := range s.routers {
		_ = r.Close()
	}
	for _, e := range s.engines {
		_ = e.Close()
	}
	if s.conn != nil {
		s.conn.Close()
	}
	s.nats.Shutdown()
}
