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

	"github.com/switchyard-dev/switchyard/auth"
	"github.com/switchyard-dev/switchyard/auth/endpoints"
	"github.com/switchyard-dev/switchyard/internal/netem"
	"github.com/switchyard-dev/switchyard/plan"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/tenant"
	"github.com/switchyard-dev/switchyard/services/agent"
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
	// Aggregator holds aggregator options; Conn, Logger, Registerer and
	// Endpoints (the stack's policy) are set by the stack.
	Aggregator aggregator.Options
	// Optimizer holds optimizer service options; Conn, NetworkMs, Clusters,
	// Logger and Registerer are set by the stack.
	Optimizer optimizersvc.Options
	// NoOptimizer leaves the optimizer service out.
	NoOptimizer bool
	// SignalInterval is the engines' signal period, the simulated engines' and
	// the agent's (between two scrapes of an engine by URL); zero means each
	// one's default.
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
	// NoKVRouting keeps the routers off the engines' KV events: without it,
	// when an engine by URL has kv_events, every router reads them
	// (router.ServiceOptions.KVEvents) and places requests with token
	// keys on the engines that report holding their prefix.
	NoKVRouting bool
	// Tokenizer is the routers' (router.ServiceOptions.Tokenizer): what
	// gives chat and text requests token keys. Nil: token-id prompts only.
	Tokenizer protocol.Tokenizer
	// Logger receives every component's log.
	Logger zerolog.Logger
	// Registerer receives every component's metrics; nil means none.
	Registerer prometheus.Registerer
	// Auth, when set, runs the embedded server in operator mode with TLS on
	// its client listener, refusing anonymous clients, and connects every
	// component with its own identity (Identities); its material must hold
	// credentials for them (auth.Generate with Identities(File)). Nil runs
	// one anonymous connection for all, as tests that test no security do.
	Auth *auth.Material
	// MutualTLS makes the embedded server require client certificates too.
	MutualTLS bool
	// NoTLS leaves TLS off the client listener with Auth (a server on
	// loopback, whose traffic never leaves the machine).
	NoTLS bool
	// Endpoints are rules of the engine endpoint policy beside the ones
	// the stack derives (`switchyard up --engine-endpoints`): for engines
	// that join the stack from elsewhere. The stack always pins its own
	// engines to their endpoints (EndpointRules), so that an engine's
	// identity cannot advertise another address, and gives the policy to
	// the routers and the optimizer service.
	Endpoints *endpoints.File
}

// Identity names of the stack's components.
const (
	AdminIdentity      = "admin"
	ReaderIdentity     = "reader"
	AggregatorIdentity = "aggregator"
	// AgentIdentity is the in-process agent's, for the engines by URL.
	AgentIdentity     = "agent"
	OptimizerIdentity = "optimizer"
)

// RouterIdentity is the identity of cluster's router.
func RouterIdentity(cluster string) string { return "router-" + cluster }

// componentIdentity names the component of f, other than an engine, whose
// identity is called name ("" when none is). An engine is its own
// identity, so its name must not be one of these: the stack file's
// validation refuses such an engine by this rule.
func componentIdentity(f *File, name string) string {
	switch name {
	case AdminIdentity:
		return "the admin"
	case ReaderIdentity:
		return "the read-only operator"
	case AggregatorIdentity:
		return "the aggregator"
	case AgentIdentity:
		return "the agent of the engines by URL"
	case OptimizerIdentity:
		return "the optimizer"
	}
	for _, c := range f.Clusters {
		if name == RouterIdentity(c.Name) {
			return fmt.Sprintf("cluster %s's router", c.Name)
		}
	}
	return ""
}

// Identities returns the identities of every component of f: admin,
// reader, aggregator, optimizer, one per simulated engine (named after
// it), one agent (AgentIdentity) for the engines given by URL, and one
// router per cluster.
func Identities(f *File) []auth.Identity {
	ids := []auth.Identity{
		{Name: AdminIdentity, Role: auth.RoleAdmin}, {Name: ReaderIdentity, Role: auth.RoleReader},
		{Name: AggregatorIdentity, Role: auth.RoleAggregator}, {Name: OptimizerIdentity, Role: auth.RoleOptimizer},
	}
	var byURL []string
	for _, e := range f.Engines {
		if e.ByURL() {
			byURL = append(byURL, e.Name)
			continue
		}
		ids = append(ids, auth.Identity{Name: e.Name, Role: auth.RoleEngine, Model: f.Model})
	}
	if len(byURL) > 0 {
		// One agent publishes for every engine given by URL.
		ids = append(ids, auth.Identity{Name: AgentIdentity, Role: auth.RoleAgent, Model: f.Model, Engines: byURL})
	}
	for _, c := range f.Clusters {
		ids = append(ids, auth.Identity{Name: RouterIdentity(c.Name), Role: auth.RoleRouter, Cluster: c.Name, Router: routerName(c.Name)})
	}
	return ids
}

func routerName(cluster string) string { return cluster + "-1" }

// Stack is a running in-process deployment: start it with Start, stop it with Close.
type Stack struct {
	opts Options
	file *File
	nats *natsembed.Server
	conn *nats.Conn
	// conns are the components' own connections (with Auth).
	conns   []*nats.Conn
	engines []*enginesim.Engine
	routers []*router.Service
	// optimizer is the optimizer service, nil with NoOptimizer.
	optimizer *optimizersvc.Service
	// agentOpts is the agent's options for the engines by URL (nil: none);
	// agentMu guards the running agent.
	agentOpts *agent.Options
	agentMu   sync.Mutex
	agent     *runningAgent
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
	// Agent is the engine agent's options for the engines given by URL
	// (Conn, Logger set by Start); nil when every engine is simulated.
	Agent *agent.Options
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
	if o.Endpoints != nil {
		if _, err := endpoints.New(*o.Endpoints, endpoints.Options{}); err != nil {
			return Plan{}, fmt.Errorf("%w: Endpoints: %w", ErrOptions, err)
		}
	}
	var p Plan
	var err error
	no := natsembed.Options{DataDir: o.DataDir, Host: o.NATSHost, Port: o.NATSPort, ServerName: "switchyard-up"}
	if o.Auth != nil {
		no.Auth = o.Auth.ServerAuth()
		if !o.NoTLS {
			no.TLS = o.Auth.ServerTLS(o.MutualTLS)
		}
	}
	if p.NATS, err = checked(no); err != nil {
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
		oo.ClusterRegions = make(map[string]string, len(f.Clusters))
		for _, c := range f.Clusters {
			oo.Clusters = append(oo.Clusters, c.Name)
			oo.ClusterRegions[c.Name] = c.Region
		}
		// An engine the stack file does not name (an agent started beside
		// the stack) is planned at the file's own latencies by region.
		if oo.Regions == (plan.RegionLatency{}) {
			oo.Regions = plan.RegionLatency{SameRegionMs: f.Network.IntraRegionMs, OtherRegionMs: f.Network.InterRegionMs}
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
		if e.ByURL() {
			if p.Agent == nil {
				p.Agent = &agent.Options{Interval: o.SignalInterval}
			}
			format, _ := agent.ParseFormat(e.Metrics) // checked by File.Validate
			p.Agent.Engines = append(p.Agent.Engines, agent.EngineConfig{
				Name: e.Name, Model: f.Model, ServedModel: e.ServedModelName, Region: e.Region, URL: e.URL, Format: format, KVEvents: e.KVEvents,
				Known: agent.Known{CapacityRPS: e.CapacityRPS, MaxRunning: e.MaxRunning},
			})
			continue
		}
		eo := enginesim.Options{
			Name: e.Name, Model: f.Model, ServedModel: e.ServedModelName, Region: e.Region, Listen: e.Listen,
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
	if p.Agent != nil {
		ao, err := checked(*p.Agent)
		if err != nil {
			return Plan{}, fmt.Errorf("%w: Agent: %w", ErrOptions, err)
		}
		p.Agent = &ao
	}
	kvEvents := false
	for _, e := range f.Engines {
		kvEvents = kvEvents || e.KVEvents != ""
	}
	if !o.NoRouters {
		for i, c := range f.Clusters {
			addr := c.Router
			if o.RouterAddr != "" {
				addr = o.RouterAddr
			}
			// The stack serves one /metrics for all of its components
			// (Gatherer): a router's inference port serves none.
			ro := router.ServiceOptions{Cluster: c.Name, Router: routerName(c.Name), HTTPAddr: addr, NoMetrics: true, Aliases: f.AliasMap(),
				KVEvents: kvEvents && !o.NoKVRouting, Tokenizer: o.Tokenizer}
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
// aggregator, the optimizer, the simulated engines, the agent of the engines
// by URL and the routers. On error everything started is stopped.
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
	if s.conn, err = s.Connect(ctx, AdminIdentity); err != nil {
		return nil, err
	}
	// own is the connection of one component: its own identity with Auth,
	// the stack's connection without.
	own := func(identity string) (*nats.Conn, error) {
		if opts.Auth == nil {
			return s.conn, nil
		}
		nc, err := s.Connect(ctx, identity)
		if err == nil {
			s.conns = append(s.conns, nc)
		}
		return nc, err
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

	for _, eo := range plan.Engines {
		if eo.Conn, err = own(eo.Name); err != nil {
			return nil, err
		}
		eo.Logger = log
		eng, err := enginesim.New(eo)
		if err != nil {
			return nil, fmt.Errorf("stack: engine %s: %w", eo.Name, err)
		}
		if err := eng.Start(ctx); err != nil {
			return nil, fmt.Errorf("stack: engine %s: %w", eo.Name, err)
		}
		s.engines = append(s.engines, eng)
	}
	if plan.Agent != nil {
		ao := *plan.Agent
		if ao.Conn, err = own(AgentIdentity); err != nil {
			return nil, err
		}
		ao.Logger = log
		s.agentOpts = &ao
		if err := s.StartAgent(); err != nil {
			return nil, err
		}
	}
	// The policy pins the engines to the addresses they listen on, known
	// once they have started: the aggregator, the optimizer and the
	// routers start after (the signals sent meanwhile wait in their stream).
	pol, err := endpoints.New(s.EndpointRules(), endpoints.Options{OwnSubject: ownSubject(streams.DefaultNames())})
	if err != nil {
		return nil, fmt.Errorf("stack: engine endpoint policy: %w", err)
	}
	ao := plan.Aggregator
	if ao.Conn, err = own(AggregatorIdentity); err != nil {
		return nil, err
	}
	ao.Logger, ao.Registerer, ao.Endpoints = log, opts.Registerer, pol
	agg, err := aggregator.New(ao)
	if err != nil {
		return nil, err
	}
	s.goRun("aggregator", func() error { return agg.Run(runCtx) })
	if plan.Optimizer != nil {
		oo := *plan.Optimizer
		if oo.Conn, err = own(OptimizerIdentity); err != nil {
			return nil, err
		}
		oo.Logger, oo.Registerer, oo.Endpoints = log, opts.Registerer, pol
		opt, err := optimizersvc.New(oo)
		if err != nil {
			return nil, fmt.Errorf("stack: optimizer service: %w", err)
		}
		s.optimizer = opt
		s.goRun("optimizer", func() error { return opt.Run(runCtx) })
	}
	for _, ro := range plan.Routers {
		if ro.Conn, err = own(RouterIdentity(ro.Cluster)); err != nil {
			return nil, err
		}
		ro.Logger = log // the router adds component, cluster and router to its lines
		ro.Endpoints = pol
		rs, err := router.NewService(ro)
		if err != nil {
			return nil, fmt.Errorf("stack: router of cluster %s: %w", ro.Cluster, err)
		}
		s.routers = append(s.routers, rs)
		s.goRun("router "+ro.Cluster, func() error { return rs.Run(runCtx) })
	}
	return s, nil
}

// EndpointRules are the stack's engine endpoint policy: its model's rule
// pinning every simulated engine to the URL it listens on and every engine
// by URL to its URL (each may also advertise its own inference subject),
// followed by Options.Endpoints' rules.
func (s *Stack) EndpointRules() endpoints.File {
	r := endpoints.Rules{Model: s.file.Model}
	for _, e := range s.engines {
		r.Engines = append(r.Engines, endpoints.EngineRule{Name: e.Name(), URLs: []string{e.URL()}})
	}
	for _, e := range s.file.Engines {
		if e.ByURL() {
			r.Engines = append(r.Engines, endpoints.EngineRule{Name: e.Name, URLs: []string{e.URL}})
		}
	}
	f := endpoints.File{Models: []endpoints.Rules{r}}
	if s.opts.Endpoints != nil {
		f.Models = append(f.Models, s.opts.Endpoints.Models...)
	}
	return f
}

// ownSubject is the inference subject an engine serves in layout n.
func ownSubject(n streams.Names) func(model, engine string) string {
	return func(model, engine string) string {
		subj, _ := n.InferSubject(model, engine)
		return subj
	}
}

// Connect opens a new in-process connection to the stack's server as
// identity (with Auth; without, anonymously); the caller closes it.
func (s *Stack) Connect(ctx context.Context, identity string) (*nats.Conn, error) {
	o := streams.ConnectOptions{InProcess: s.nats.Server(), Name: "switchyard-up-" + identity, Logger: s.opts.Logger}
	if s.opts.Auth != nil {
		o = s.opts.Auth.Connect(identity, s.opts.MutualTLS, o)
	}
	return streams.Connect(ctx, o)
}

// Auth returns the stack's auth material, nil without.
func (s *Stack) Auth() *auth.Material { return s.opts.Auth }

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

// Conn returns the stack's own NATS connection (the admin identity's with Auth).
func (s *Stack) Conn() *nats.Conn { return s.conn }

// Engines returns the simulated engines, in stack file order (engines by
// URL are not among them).
func (s *Stack) Engines() []*enginesim.Engine { return s.engines }

// Routers returns the routers, one per frontend cluster in stack file order.
func (s *Stack) Routers() []*router.Service { return s.routers }

// Optimizer returns the optimizer service, or nil when left out.
func (s *Stack) Optimizer() *optimizersvc.Service { return s.optimizer }

// runningAgent is one run of the engine agent.
type runningAgent struct {
	a      *agent.Agent
	cancel context.CancelFunc
	done   chan struct{}
}

// StartAgent starts a new engine agent for the engines given by URL, as a
// restarted agent process would: its estimates and signal sequence start
// from zero, and its metrics are in its own registry (see Gatherer). It
// does nothing when the agent runs or the stack has no engine by URL.
func (s *Stack) StartAgent() error {
	s.agentMu.Lock()
	defer s.agentMu.Unlock()
	if s.agentOpts == nil || s.agent != nil {
		return nil
	}
	a, err := agent.New(*s.agentOpts)
	if err != nil {
		return fmt.Errorf("stack: agent: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ra := &runningAgent{a: a, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(ra.done)
		_ = a.Run(ctx)
	}()
	s.agent = ra
	return nil
}

// StopAgent stops the engine agent and waits for it, as if its process
// died: the engines by URL go on serving, but nothing publishes their
// signals until StartAgent.
func (s *Stack) StopAgent() {
	s.agentMu.Lock()
	ra := s.agent
	s.agent = nil
	s.agentMu.Unlock()
	if ra != nil {
		ra.cancel()
		<-ra.done
	}
}

// Agent returns the running engine agent, or nil when it is stopped or the
// stack has no engine by URL.
func (s *Stack) Agent() *agent.Agent {
	s.agentMu.Lock()
	defer s.agentMu.Unlock()
	if s.agent == nil {
		return nil
	}
	return s.agent.a
}

// Close stops every component, then the NATS server, and waits for them.
func (s *Stack) Close() {
	s.cancel()
	s.StopAgent()
	s.wg.Wait()
	for _, r := range s.routers {
		_ = r.Close()
	}
	for _, e := range s.engines {
		_ = e.Close()
	}
	for _, nc := range s.conns {
		nc.Close()
	}
	if s.conn != nil {
		s.conn.Close()
	}
	if s.opts.Registerer != nil {
		s.opts.Registerer.Unregister(natsCollector{s})
	}
	s.nats.Shutdown()
}
