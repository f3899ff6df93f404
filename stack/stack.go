package stack

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/internal/netem"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/tenant"
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
	// picks a free port, 0 listens nowhere (in-process clients only), as
	// natsembed.Options.Port (nats-server's convention).
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
	// tests: "127.0.0.1:0" picks free ports); with several clusters its port
	// must be 0. Empty uses the stack file's.
	RouterAddr string
	// KeysFile, when set, is every router's API keys file, overriding the
	// stack file's keys_file (`switchyard up --keys`).
	KeysFile string
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

// ErrOptions is wrapped by every error of Options.Validate and of Start for
// invalid options other than the stack file's (which wrap ErrStack).
var ErrOptions = errors.New("stack: invalid options")

// WithDefaults returns a copy of o with File set to Default() when nil.
// Each component's defaults are applied by Plan.
func (o Options) WithDefaults() Options {
	if o.File == nil {
		o.File = Default()
	}
	return o
}

// Validate reports the first field of o, or of a component's options it
// derives (see Plan), that is not usable, naming it and its value.
func (o Options) Validate() error {
	_, err := o.Plan()
	return err
}

// Plan is what Start runs for a set of Options: every component's
// effective options, defaults applied and validated, before Start adds the
// connection, logger and registerer.
type Plan struct {
	// NATS is the embedded server.
	NATS natsembed.Options
	// Provision is the layout provisioned at start.
	Provision streams.ProvisionOptions
	// Aggregator is the aggregator's options.
	Aggregator aggregator.Options
	// Optimizer is the optimizer service's options; nil with NoOptimizer.
	Optimizer *optimizersvc.Options
	// Engines are the simulated engines' options, in stack file order.
	Engines []enginesim.Options
	// Routers are the routers' options, one per frontend cluster in stack
	// file order; none with NoRouters.
	Routers []router.ServiceOptions
}

// Plan derives every component's options from o and the stack file,
// applies their defaults and validates them; the error names the
// component and the field at fault.
func (o Options) Plan() (Plan, error) {
	o = o.WithDefaults()
	if err := o.File.Validate(); err != nil {
		return Plan{}, fmt.Errorf("%w: %v", ErrStack, err)
	}
	if o.DataDir == "" {
		return Plan{}, fmt.Errorf("%w: DataDir is empty, want the embedded server's JetStream directory", ErrOptions)
	}
	if o.SignalInterval < 0 {
		return Plan{}, fmt.Errorf("%w: SignalInterval is %s, want >= 0", ErrOptions, o.SignalInterval)
	}
	if o.RouterAddr != "" && !o.NoRouters && len(o.File.Clusters) > 1 && !strings.HasSuffix(o.RouterAddr, ":0") {
		return Plan{}, fmt.Errorf("%w: RouterAddr %q: every router would listen there; give a port of 0 (free ports) or set each router's address in the stack file", ErrOptions, o.RouterAddr)
	}
	var p Plan
	var err error
	if p.NATS, err = checked(natsembed.Options{DataDir: o.DataDir, Host: o.NATSHost, Port: o.NATSPort, ServerName: "switchyard-up"}); err != nil {
		return Plan{}, fmt.Errorf("%w: NATS: %w", ErrOptions, err)
	}
	if p.Provision, err = checked(streams.ProvisionOptions{}); err != nil {
		return Plan{}, fmt.Errorf("%w: Provision: %w", ErrOptions, err)
	}
	if p.Aggregator, err = checked(o.Aggregator); err != nil {
		return Plan{}, fmt.Errorf("%w: Aggregator: %w", ErrOptions, err)
	}
	f := o.File
	if !o.NoOptimizer {
		oo := o.Optimizer
		oo.NetworkMs = f.NetworkTable()
		oo.PreferConfiguredNetwork = true // one machine: every measured RTT is loopback
		oo.Clusters = nil
		for _, c := range f.Clusters {
			oo.Clusters = append(oo.Clusters, c.Name)
		}
		if oo.Instance == "" {
			oo.Instance = "up"
		}
		if oo, err = checked(oo); err != nil {
			return Plan{}, fmt.Errorf("%w: Optimizer: %w", ErrOptions, err)
		}
		p.Optimizer = &oo
	}
	for _, e := range f.Engines {
		eo := enginesim.Options{
			Name: e.Name, Model: f.Model, Region: e.Region, Listen: e.Listen,
			OutputTokens: f.Sim.OutputTokens, PromptTokens: f.Sim.PromptTokens, BaseTBTMs: f.Sim.BaseTBTMs,
			TBTGrowthMs: f.Sim.TBTGrowthMs, PrefillMsPerToken: f.Sim.PrefillMsPerToken,
			SignalInterval: o.SignalInterval,
		}
		if eo.MaxBatch, err = enginesim.BatchForCapacity(eo, e.CapacityRPS); err != nil {
			return Plan{}, fmt.Errorf("%w: engine %s: %w", ErrOptions, e.Name, err)
		}
		if eo, err = checked(eo); err != nil {
			return Plan{}, fmt.Errorf("%w: engine %s: %w", ErrOptions, e.Name, err)
		}
		p.Engines = append(p.Engines, eo)
	}
	if !o.NoRouters {
		for i, c := range f.Clusters {
			addr := c.Router
			if o.RouterAddr != "" {
				addr = o.RouterAddr
			}
			// The stack serves one /metrics for all of its components
			// (Gatherer): a router's inference port serves none.
			ro := router.ServiceOptions{Cluster: c.Name, Router: c.Name + "-1", HTTPAddr: addr, NoMetrics: true}
			field := fmt.Sprintf("clusters[%d].keys_file", i)
			if ro.KeysFile = c.KeysFile; o.KeysFile != "" {
				ro.KeysFile, field = o.KeysFile, "KeysFile"
			}
			if ro.KeysFile != "" {
				if _, _, err := tenant.LoadFile(ro.KeysFile); err != nil {
					return Plan{}, fmt.Errorf("%w: router of cluster %s: %s: %w", ErrOptions, c.Name, field, err)
				}
			}
			if o.EmulateNetwork {
				ro.WrapTransport = netem.Wrap(f.DelayFrom(c.Name))
			}
			p.Routers = append(p.Routers, ro)
		}
	}
	return p, nil
}

// options is an Options type of the project's convention.
type options[T any] interface {
	WithDefaults() T
	Validate() error
}

// checked returns o with its defaults applied, or its Validate error.
func checked[T options[T]](o T) (T, error) {
	o = o.WithDefaults()
	return o, o.Validate()
}

// Start starts the embedded NATS server, provisions the layout, and starts the
// aggregator and the simulated engines. On error everything started is stopped.
func Start(ctx context.Context, opts Options) (_ *Stack, err error) {
	opts = opts.WithDefaults()
	plan, err := opts.Plan()
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	no := plan.NATS
	no.Logger = &log
	srv, err := natsembed.Start(no)
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
	if err := streams.Provision(ctx, js, streams.DefaultNames(), plan.Provision); err != nil {
		return nil, err
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(natsCollector{s}); err != nil {
			return nil, fmt.Errorf("stack: register the NATS server's metrics: %w", err)
		}
	}

	ao := plan.Aggregator
	ao.Conn, ao.Logger, ao.Registerer = s.conn, log, opts.Registerer
	agg, err := aggregator.New(ao)
	if err != nil {
		return nil, err
	}
	s.goRun("aggregator", func() error { return agg.Run(runCtx) })

	if plan.Optimizer != nil {
		oo := *plan.Optimizer
		oo.Conn, oo.Logger, oo.Registerer = s.conn, log, opts.Registerer
		opt, err := optimizersvc.New(oo)
		if err != nil {
			return nil, fmt.Errorf("stack: optimizer service: %w", err)
		}
		s.optimizer = opt
		s.goRun("optimizer", func() error { return opt.Run(runCtx) })
	}
	for _, eo := range plan.Engines {
		eo.Conn, eo.Logger = s.conn, log
		eng, err := enginesim.New(eo)
		if err != nil {
			return nil, fmt.Errorf("stack: engine %s: %w", eo.Name, err)
		}
		if err := eng.Start(ctx); err != nil {
			return nil, fmt.Errorf("stack: engine %s: %w", eo.Name, err)
		}
		s.engines = append(s.engines, eng)
	}
	for _, ro := range plan.Routers {
		ro.Conn, ro.Logger = s.conn, log // the router adds component, cluster and router to its lines
		rs, err := router.NewService(ro)
		if err != nil {
			return nil, fmt.Errorf("stack: router of cluster %s: %w", ro.Cluster, err)
		}
		s.routers = append(s.routers, rs)
		s.goRun("router "+ro.Cluster, func() error { return rs.Run(runCtx) })
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
	if s.opts.Registerer != nil {
		s.opts.Registerer.Unregister(natsCollector{s})
	}
	s.nats.Shutdown()
}
