// Package optimizersvc is Switchyard's weight-path service. It watches the
// engine state (sy_engines) and the demand and RTT state (sy_demand) written by
// the aggregator, builds one optimizer.Problem per model, solves it with the
// optimizer package, and writes one messages.WeightSnapshot per (model,
// frontend cluster) to the weights bucket (sy_weights), which routers watch.
//
// # Problem construction
//
// A problem is built for every model with at least one engine state (a model
// with demand but no engine state at all is not planned). Its engines are
// those with a state under <model>.<engine>:
//
//   - status "down", or an effective capacity (capacity_rps × health) of zero:
//     the engine is left out of the problem;
//   - status "stale": the engine stays in, with its health multiplied by
//     optimizer.StaleHealthFactor (0.5): it has stopped signalling recently, so it gets
//     less traffic until the aggregator decides whether it is down;
//   - status "up": capacity_rps and health as reported.
//
// Every engine's capacity in the problem is capacity_rps ×
// Options.TargetUtilisation (default 1): below 1 the optimizer keeps that
// headroom on every engine and sheds the demand beyond it instead.
//
// Each engine's latency profile is a queue profile L(x) = base_ms / (1 − x/C)
// (C the effective capacity, so the prior's shape comes from the engine's
// capacity) whose base_ms is fitted from the engine state's slow windows: every
// state update gives one sample base = (TTFT + output_tokens × TBT) × (1 −
// load/C), folded into an optimizer.BaseFit with its default options (the
// same fit the simulator runs): the fit's target is the median of the last
// optimizer.DefaultFitWindow samples, pulled towards Options.PriorBaseMs as if
// the prior were optimizer.DefaultFitPriorSamples extra samples, and the fit
// moves only optimizer.DefaultFitAlpha of the way to the target per update, so
// that it does not chase momentary latency. The base never goes below the
// engine's own idle-latency estimate (EngineState.BaseLatencyMs) when it
// reports one: samples below it are the queue model's correction overshooting
// for a continuous-batching engine, and they would plan the engines sampled
// at higher loads fuller (see optimizer.BaseFit.BaseMs).
//
// The clusters of a model are those with a demand state <model>.<cluster> and
// those listed in Options.Clusters. A cluster's demand is the fast window of
// its per-priority rates when the state has them, and otherwise the fast window
// of its total rate counted as "standard". Demand below Options.MinDemandRPS
// (default 1 req/s, including clusters with no demand measured yet) is raised
// to it, so that routers get weights from the start.
//
// The network latency from cluster i to engine j is half the measured RTT
// (rtt.<cluster>.<engine> in sy_demand, slow window) when there is one, and
// otherwise Options.NetworkMs[i][j]; with neither, it is the latency
// Options.Regions assumes by region (the cluster's from
// Options.ClusterRegions, the engine's from its state; 1 ms within a region
// and 30 ms between regions by default, see plan.DefaultSameRegionMs), so
// that an engine the configuration does not name is planned as soon as its
// signals arrive, with no restart, and moves to its measured latency when
// the routers' RTT reports come. With Options.NoRegionDefault such an engine
// is not eligible for that cluster.
//
// # Penalties and operator overrides
//
// Before each round the service judges every model's engines by the router
// outcomes the aggregator folds into their states (EngineState.Outcomes),
// when routers sent the engine requests within PenaltyOptions.EvidenceMaxAge.
// An engine is an outlier when it had FailedIntervals report intervals in a
// row without a success (multiplier 0), its error rate exceeds max(5%, 3 ×
// the model's fleet median) (0.25, or 0 from 50%), its timeout rate exceeds
// max(5%, 3 × the median) (likewise), or the TTFT routers see exceeds 3 × its
// fitted TTFT profile at its load plus 50 ms (0.5). The multiplier scales
// its health (capacity) in the problem for a penalty time of 5 s × 2^(n−1)
// for the n-th penalty in a row (at most 5 min); then it ramps linearly
// from max(multiplier, 0.1) to 1 over SlowStart (10 s). Only evidence newer
// than the penalty counts again. At most MaxShare (half) of a model's
// engines are penalised at once, the worst first. Strikes decay: one is
// forgiven per StrikeDecay (1 min) of good behaviour after the slow start,
// and all after Forget (5 min). A penalty record read on a restart keeps
// its strikes but not its penalty (adoptPenalty). Each penalty is logged (engine, reason,
// multiplier, duration), counted (switchyard_optimizer_penalties_total,
// switchyard_optimizer_penalised_engines) and, by the leader, written to
// sy_engines under penalty.<model>.<engine> (messages.Penalty) on every phase
// change; the key is deleted when the strikes are forgotten. Every instance
// judges for itself; only the leader writes, and followers adopt its records
// when newer than their own judgement, so that a new leader continues the
// escalation (strikes) rather than starting again.
//
// Slow start applies whenever an engine's effective capacity comes back from
// about zero (below AboutZeroShare, 5%, of the largest capacity_rps it has
// reported), whatever took it there: its own health signal, a down status,
// an operator's drain, cordon or pinned health, or a capacity drop. Its
// health in the problem then ramps linearly from RecoveryFloor to 1 over
// SlowStart, as after a penalty (a penalty's end has its own ramp, not a
// second one on top). A slow start is logged when it begins and ends and
// shown while it lasts in switchyard_optimizer_slow_start_multiplier{model,
// engine}. An engine first seen with capacity gets none, so a restarted
// service does not throttle the fleet.
//
// Operator records (messages.Operator, key operator.<engine> in sy_engines,
// written by `switchyard engine`) override: drain and cordon keep the engine
// out of the problem (weight 0 in every snapshot); health pins its multiplier
// in place of any penalty; deleting the key restores it. Values in
// sy_engines are told apart by their kind, not by their key.
//
// # Writing
//
// The service solves at most every MinInterval after a change and at least
// every MaxInterval, warm-starting each model from its previous solution. A
// snapshot is written for a (model, cluster) only when its weights (with the
// shed fraction) moved by a total-variation distance of at least the solver's
// dead band from the snapshot in the bucket, when shedding starts or stops, or
// when the snapshot in the bucket is older than Heartbeat (a heartbeat rewrite
// carries the current solution). Writes are compare-and-set on the key's
// revision and carry the generation messages.NextGeneration gives after the
// key's current one (read when the instance first writes the key after gaining
// the lease) and the highest this instance has seen for it: one above, or the
// milliseconds since messages.EpochMs when that is more, so that generations
// follow the clock and routers can tell one from the future
// (messages.GenerationCeiling). On a conflict the service re-reads the key
// and does not write it again in that round; the next round compares against
// what is there now. A key that is absent is created the same way, so a
// deleted and re-created key still carries a generation above the ones
// routers hold. A key whose value cannot be followed — undecodable, invalid,
// or from the future (a generation above the ceiling, as a forged 2^64-1 is)
// — is counted in switchyard_optimizer_bad_values_total, overwritten by the
// next round's snapshot (switchyard_optimizer_weights_overwritten_total) and
// logged at most once per 10 s per key.
//
// Every snapshot written carries the selection table routers install
// (SlotEngines, Slots): selection.AssignSlots computes it from the table of the
// snapshot this instance last read or wrote for the key (so a new leader
// continues from its predecessor's), for the engines of positive weight and
// selection.SlotCount of them slots, never fewer than the previous table's. A
// key then moves between engines only as far as the weight change requires
// (the total-variation distance, up to one slot per engine of rounding),
// and every router maps keys alike whatever snapshots it saw before. A
// snapshot too large for messages.MaxSnapshotSize with its table is written
// without one; routers then compute theirs from the weights.
//
// # Leadership
//
// Several instances may run. Only the holder of the lease key "optimizer" in
// the leases bucket writes; it renews the lease every LeaseTTL/3 and stops
// writing at once when a renewal fails or the lease's validity lapses. The
// others solve as well (so that they can take over warm) and try to create the
// lease key every LeaseTTL/3. A follower that finds the key last renewed more
// than LeaseTTL ago (by the server's timestamp) takes it over at once by
// compare-and-set on the revision it saw, rather than waiting for the bucket's
// TTL to remove it (the server checks ages at most every 250 ms); it retries
// just after the holder's lease is due to expire. So one instance takes over
// within about the TTL after the holder dies. This relies on the clocks of
// the instances and the server agreeing to within a tenth of the TTL, the
// margin by which a leader stops writing before its lease expires; the
// compare-and-set writes keep generations rising even if they do not. A
// graceful stop releases the lease.
package optimizersvc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/auth/endpoints"
	"github.com/switchyard-dev/switchyard/internal/logthrottle"
	"github.com/switchyard-dev/switchyard/internal/poison"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/optimizer"
	"github.com/switchyard-dev/switchyard/plan"
	"github.com/switchyard-dev/switchyard/streams"
)

// LeaseKey is the key of the optimizer's lease in the leases bucket.
const LeaseKey = "optimizer"

// Options configures a Service. Zero values take the defaults documented per field.
type Options struct {
	// Conn is the NATS connection. Required.
	Conn *nats.Conn
	// Names is the NATS layout; the zero value means streams.DefaultNames().
	Names streams.Names
	// Instance names this instance in the lease and in the snapshots' writer
	// field; it must be unique among the running instances. Empty means
	// <hostname>-<pid>, with characters that are not valid in a name replaced by '-'.
	Instance string
	// NetworkMs is the configured one-way network latency in ms from each
	// frontend cluster to each engine, used where no RTT is measured. An
	// engine absent from both a cluster's row and the measured RTTs is
	// planned at the latency Regions assumes (see the package comment).
	NetworkMs map[string]map[string]float64
	// ClusterRegions gives each frontend cluster's region, by cluster name,
	// for the region default of the network latency; a cluster not in it
	// counts as of another region than every engine.
	ClusterRegions map[string]string
	// Regions is the one-way latency assumed between a cluster and an
	// engine by region until one is measured or configured; zero fields
	// take plan.DefaultSameRegionMs and plan.DefaultOtherRegionMs.
	Regions plan.RegionLatency
	// NoRegionDefault turns the region default off: an engine of no
	// measured or configured latency from a cluster is then not planned for
	// it (the behaviour of a network table that must name every engine).
	NoRegionDefault bool
	// PreferConfiguredNetwork uses NetworkMs even where an RTT is measured:
	// for a stack on one machine, where the network is emulated and measured
	// RTTs are all loopback.
	PreferConfiguredNetwork bool
	// Clusters are planned for every model even before any demand is measured.
	Clusters []string
	// Endpoints is the operator's engine endpoint policy (auth/endpoints):
	// an engine whose state advertises a URL or subject it refuses is not
	// planned (counted in switchyard_optimizer_engines_refused, logged at
	// a bounded rate). Nil plans engines wherever they say they are.
	Endpoints *endpoints.Policy
	// MinDemandRPS is the least demand a cluster is planned for (see the
	// package comment). Zero means 1 req/s.
	MinDemandRPS float64
	// DemandBandSD is the demand hold's band (plan.DemandHold.BandSD): a
	// cluster's demand is planned at a held rate while its fast window
	// stays within this many of the window's standard deviations of it.
	// Zero means plan.DefaultDemandBandSD; negative plans the fast window
	// as it is.
	DemandBandSD float64
	// PriorBaseMs is the prior base latency of an engine's queue profile, used
	// until samples arrive and blended with them. Zero means 500 ms.
	PriorBaseMs float64
	// ShedByLatency, when capacity is short, leaves the shed where the
	// solver's objective puts it: on the traffic whose service costs the
	// most network latency, so that the clusters farthest from the
	// capacity lose most of their traffic. By default each solution goes
	// through optimizer.ShareShed: shed by priority, then in proportion to
	// each cluster's demand.
	ShedByLatency bool
	// TargetUtilisation is the share of every engine's effective capacity
	// the problem plans for, in (0, 1]: demand beyond it is shed (by
	// priority) rather than queued on the engines, and the utilisations in
	// snapshots are relative to it. Zero means 1 (plan up to capacity).
	TargetUtilisation float64
	// EngineTargetUtilisation overrides TargetUtilisation for the engines it
	// names (by engine name, in every model), each in (0, 1]: an operator's
	// extra headroom on a slower engine type, whose long generations make the
	// end-to-end latency tail. Such an engine's utilisation in snapshots is
	// relative to TargetUtilisation, not to its own target, so that routers
	// comparing live load with the plan keep it at its lower share (rated
	// against its own target, an engine at its plan looks no fuller than
	// the others at theirs, and the routers' comparison undoes the lower
	// target).
	EngineTargetUtilisation map[string]float64
	// MinInterval is the least time between two solves. Zero means 100 ms.
	MinInterval time.Duration
	// MaxInterval is the longest time between two solves. Zero means 2 s.
	MaxInterval time.Duration
	// Heartbeat is how old a snapshot may get before it is rewritten unchanged
	// (with a new generation and time), so that routers do not consider it
	// stale. Zero means 10 s; it must not be shorter than MaxInterval.
	Heartbeat time.Duration
	// LeaseTTL must equal the leases bucket's TTL (streams.ProvisionOptions.LeaseTTL).
	// Zero means 3 s.
	LeaseTTL time.Duration
	// Penalties are the outlier rules and penalty schedule; zero values take
	// the defaults documented per field.
	Penalties PenaltyOptions
	// Solver configures the solver; the zero value means optimizer.DefaultOptions().
	Solver optimizer.Options
	// Provision is what the service's layout keeper re-creates a deleted
	// stream or bucket with (see streams.Repair).
	Provision streams.ProvisionOptions
	// Logger receives the service's log.
	Logger zerolog.Logger
	// Registerer receives the service's metrics; nil means none are registered.
	Registerer prometheus.Registerer
	// Now is the clock for message timestamps; nil means time.Now.
	Now func() time.Time
	// OnValue, when set, is called with the bucket, key and bytes of every
	// state value the watches deliver, before it is decoded, inside the
	// handler's panic recovery; it must not keep data. For inspection and
	// tests (a handler that panics on a chosen value).
	OnValue func(bucket, key string, data []byte)
}

// WithDefaults returns a copy of o with every zero field set to its default
// (Instance from the host name and process id).
func (o Options) WithDefaults() Options {
	if o.Names == (streams.Names{}) {
		o.Names = streams.DefaultNames()
	}
	if o.Instance == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "optimizer"
		}
		o.Instance = sanitizeName(host + "-" + strconv.Itoa(os.Getpid()))
	}
	if o.MinDemandRPS == 0 {
		o.MinDemandRPS = plan.DefaultMinDemandRPS
	}
	if o.PriorBaseMs == 0 {
		o.PriorBaseMs = plan.DefaultPriorBaseMs
	}
	o.Regions = o.Regions.WithDefaults()
	if o.TargetUtilisation == 0 {
		o.TargetUtilisation = 1
	}
	if o.MinInterval == 0 {
		o.MinInterval = 100 * time.Millisecond
	}
	if o.MaxInterval == 0 {
		o.MaxInterval = 2 * time.Second
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = 10 * time.Second
	}
	if o.LeaseTTL == 0 {
		o.LeaseTTL = 3 * time.Second
	}
	if o.Solver == (optimizer.Options{}) {
		o.Solver = optimizer.DefaultOptions()
	}
	if !(o.Solver.Tolerance > 0) {
		o.Solver.Tolerance = optimizer.DefaultOptions().Tolerance // what the solver takes 0 to mean
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	o.Penalties = o.Penalties.WithDefaults()
	o.Provision = o.Provision.WithDefaults()
	return o
}

// sanitizeName turns s into a valid messages name: characters outside
// [A-Za-z0-9_-] become '-', and the result is cut to messages.MaxNameLen,
// keeping its end (where the pid is).
func sanitizeName(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			b[i] = '-'
		}
	}
	if len(b) > messages.MaxNameLen {
		b = b[len(b)-messages.MaxNameLen:]
	}
	return string(b)
}

// ErrOptions is wrapped by every error of Validate and of New for invalid options.
var ErrOptions = errors.New("optimizersvc: invalid options")

// Validate reports the first field of o (after defaults) that is not
// usable, naming it and its value; the error wraps ErrOptions. It checks
// configuration only: New also needs Conn.
func (o Options) Validate() error {
	o = o.WithDefaults()
	if err := o.Names.Validate(); err != nil {
		return fmt.Errorf("%w: Names: %v", ErrOptions, err)
	}
	if err := messages.CheckName("Instance", o.Instance); err != nil {
		return fmt.Errorf("%w: %v", ErrOptions, err)
	}
	for _, c := range o.Clusters {
		if err := messages.CheckName("cluster", c); err != nil {
			return fmt.Errorf("%w: Clusters: %v", ErrOptions, err)
		}
	}
	for _, c := range slices.Sorted(maps.Keys(o.NetworkMs)) { // sorted: the same field is named every time
		row := o.NetworkMs[c]
		if err := messages.CheckName("cluster", c); err != nil {
			return fmt.Errorf("%w: NetworkMs: %v", ErrOptions, err)
		}
		for _, e := range slices.Sorted(maps.Keys(row)) {
			ms := row[e]
			if err := messages.CheckName("engine", e); err != nil {
				return fmt.Errorf("%w: NetworkMs[%s]: %v", ErrOptions, c, err)
			}
			if math.IsNaN(ms) || math.IsInf(ms, 0) || ms < 0 {
				return fmt.Errorf("%w: NetworkMs[%s][%s] is %v, want a finite latency >= 0 ms", ErrOptions, c, e, ms)
			}
		}
	}
	for _, c := range slices.Sorted(maps.Keys(o.ClusterRegions)) {
		if err := messages.CheckName("cluster", c); err != nil {
			return fmt.Errorf("%w: ClusterRegions: %v", ErrOptions, err)
		}
		if err := messages.CheckName("region", o.ClusterRegions[c]); err != nil {
			return fmt.Errorf("%w: ClusterRegions[%s]: %v", ErrOptions, c, err)
		}
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"Regions.SameRegionMs", o.Regions.SameRegionMs}, {"Regions.OtherRegionMs", o.Regions.OtherRegionMs}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 || f.v > plan.MaxLatencyMs {
			return fmt.Errorf("%w: %s is %v, want a finite latency >= 0 ms", ErrOptions, f.name, f.v)
		}
	}
	if err := o.Penalties.Validate(); err != nil {
		return err
	}
	for _, f := range []struct {
		field string
		v     float64
	}{{"MinDemandRPS", o.MinDemandRPS}, {"PriorBaseMs", o.PriorBaseMs}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v <= 0 {
			return fmt.Errorf("%w: %s is %v, want a finite positive number", ErrOptions, f.field, f.v)
		}
	}
	if !(o.TargetUtilisation > 0 && o.TargetUtilisation <= 1) {
		return fmt.Errorf("%w: TargetUtilisation is %v, want a share in (0, 1]", ErrOptions, o.TargetUtilisation)
	}
	for _, e := range slices.Sorted(maps.Keys(o.EngineTargetUtilisation)) {
		if tu := o.EngineTargetUtilisation[e]; !(tu > 0 && tu <= 1) {
			return fmt.Errorf("%w: EngineTargetUtilisation[%s] is %v, want a share in (0, 1]", ErrOptions, e, tu)
		}
	}
	if o.MinInterval < 0 || o.MaxInterval < o.MinInterval {
		return fmt.Errorf("%w: MinInterval %s and MaxInterval %s: want 0 <= MinInterval <= MaxInterval", ErrOptions, o.MinInterval, o.MaxInterval)
	}
	if o.Heartbeat < o.MaxInterval {
		return fmt.Errorf("%w: Heartbeat %s is shorter than MaxInterval %s", ErrOptions, o.Heartbeat, o.MaxInterval)
	}
	if o.LeaseTTL < 30*time.Millisecond {
		return fmt.Errorf("%w: LeaseTTL %s is too short (want >= 30ms)", ErrOptions, o.LeaseTTL)
	}
	if err := o.Provision.Validate(); err != nil {
		return fmt.Errorf("%w: Provision: %v", ErrOptions, err)
	}
	return nil
}

// Service is the running optimizer service. Create it with New and run it with Run.
type Service struct {
	opts    Options
	log     zerolog.Logger
	js      jetstream.JetStream
	metrics *metrics
	badLog  *logthrottle.Throttle
	poison  *poison.Guard

	// mu guards the input state, the fits and the published solutions.
	mu        sync.Mutex
	engines   map[string]*messages.EngineState // by <model>.<engine>
	demand    map[string]*messages.DemandState // by <model>.<cluster>
	rtt       map[string]float64               // one-way ms by <cluster>.<engine>
	fits      map[string]*optimizer.BaseFit    // by <model>.<engine>
	hold      plan.DemandHold                  // the demand planned, by <model>.<cluster>
	solutions map[string]*optimizer.Solution   // by model
	pens      map[string]*penalty              // by <model>.<engine>
	ramps     map[string]*ramp                 // slow starts, by <model>.<engine>
	refusedAt map[string]time.Time             // since when an engine's endpoint is refused, by <model>.<engine>
	operators map[string]*messages.Operator    // by sy_engines key operator.<engine>
	restore   map[string]*messages.Operator    // operator records a re-created engines bucket lost, to write back
	carried   map[string]time.Time             // state kept over a bucket's re-creation, by key, since when
	changed   chan struct{}                    // signalled (non-blocking) on input changes

	// Layout repair: the keeper, the streams it saw come back, and whether
	// a state bucket's watcher ended because the bucket was replaced.
	keeper          *streams.Keeper
	relaid          chan []string
	enginesReplaced atomic.Bool
	demandReplaced  atomic.Bool

	// Leadership, written by the lease loop.
	leader     atomic.Bool
	leaseMu    sync.Mutex
	leaseUntil time.Time // writes are allowed until then (monotonic clock)
	gained     chan struct{}

	// Solve-loop state, touched only by the goroutine running Run.
	models map[string]*modelState
	keys   map[string]*keyState // weights keys, by <model>.<cluster>
	maxGen map[string]uint64    // highest generation ever seen per weights key
	// written holds, per penalty key, what this instance last wrote there.
	written map[string]string
	// started is when New ran: penalty records written before it are
	// restored from a previous run (adoptPenalty).
	started time.Time
}

// modelState is the solver and the previous solution of one model.
type modelState struct {
	solver *optimizer.Solver
	prev   *optimizer.Solution
}

// keyState is what the leader knows of one weights key.
type keyState struct {
	rev  uint64                   // revision of the current value, 0 when absent
	gen  uint64                   // generation of the current value
	last *messages.WeightSnapshot // current value, nil when absent or undecodable
}

// New validates opts and returns a Service ready to Run.
func New(opts Options) (*Service, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Conn == nil {
		return nil, fmt.Errorf("%w: Conn is nil, want a NATS connection", ErrOptions)
	}
	js, err := jetstream.New(opts.Conn)
	if err != nil {
		return nil, fmt.Errorf("optimizersvc: jetstream: %w", err)
	}
	log := opts.Logger.With().Str("component", "optimizer").Str("instance", opts.Instance).Logger()
	guard, err := poison.New(poison.Options{Component: "optimizer", Logger: log, Registerer: opts.Registerer})
	if err != nil {
		return nil, fmt.Errorf("optimizersvc: %w", err)
	}
	s := &Service{
		opts:      opts,
		log:       log,
		js:        js,
		metrics:   newMetrics(opts.Registerer),
		badLog:    logthrottle.New(10*time.Second, 10000),
		poison:    guard,
		engines:   make(map[string]*messages.EngineState),
		demand:    make(map[string]*messages.DemandState),
		rtt:       make(map[string]float64),
		fits:      make(map[string]*optimizer.BaseFit),
		hold:      plan.DemandHold{BandSD: opts.DemandBandSD},
		solutions: make(map[string]*optimizer.Solution),
		changed:   make(chan struct{}, 1),
		gained:    make(chan struct{}, 1),
		models:    make(map[string]*modelState),
		keys:      make(map[string]*keyState),
		maxGen:    make(map[string]uint64),
		pens:      make(map[string]*penalty),
		ramps:     make(map[string]*ramp),
		refusedAt: make(map[string]time.Time),
		operators: make(map[string]*messages.Operator),
		restore:   make(map[string]*messages.Operator),
		carried:   make(map[string]time.Time),
		written:   make(map[string]string),
		relaid:    make(chan []string, 8),
		started:   time.Now(),
	}
	s.keeper, err = streams.NewKeeper(streams.KeeperOptions{JS: js, Conn: opts.Conn, Names: opts.Names, Provision: opts.Provision,
		Logger: s.log, OnRepair: func(restored []string) {
			s.metrics.repairs.Add(float64(len(restored)))
			select {
			case s.relaid <- restored:
			default:
			}
		}})
	if err != nil {
		return nil, fmt.Errorf("optimizersvc: %w", err)
	}
	return s, nil
}

// Instance returns the instance name used in the lease and in snapshots.
func (s *Service) Instance() string { return s.opts.Instance }

// Leader reports whether this instance holds the lease and may write snapshots.
func (s *Service) Leader() bool {
	if !s.leader.Load() {
		return false
	}
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	return time.Now().Before(s.leaseUntil)
}

// LastSolution returns the newest solution computed for model (whether or not
// it was written), or nil. The solution must not be modified.
func (s *Service) LastSolution(model string) *optimizer.Solution {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.solutions[model]
}

// Run watches the state buckets, takes part in the leader election, solves and
// (as leader) writes snapshots until ctx is done; then it releases the lease if
// it holds it and returns nil. It returns an error only when it cannot start.
func (s *Service) Run(ctx context.Context) error {
	buckets := map[string]jetstream.KeyValue{}
	for _, name := range []string{s.opts.Names.EnginesBucket, s.opts.Names.DemandBucket, s.opts.Names.WeightsBucket, s.opts.Names.LeasesBucket} {
		kv, err := s.js.KeyValue(ctx, name)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("optimizersvc: open bucket %s (provisioned?): %w", name, err)
		}
		buckets[name] = kv
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()

	loaded := make(chan struct{}, 2)
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = s.keeper.Run(ctx)
	}()
	for _, b := range []struct {
		bucket   string
		handle   func(jetstream.KeyValueEntry)
		sweep    func(map[string]bool)
		replaced *atomic.Bool
	}{
		{s.opts.Names.EnginesBucket, s.handleEngine, s.sweepEngines, &s.enginesReplaced},
		{s.opts.Names.DemandBucket, s.handleDemand, s.sweepDemand, &s.demandReplaced},
	} {
		first := true
		w := &streams.BucketWatch{
			Conn: s.opts.Conn, JS: s.js, Bucket: b.bucket, Entry: s.guarded(b.bucket, b.handle), Logger: s.log,
			Down: func(err error) {
				if errors.Is(err, streams.ErrBucketReplaced) {
					b.replaced.Store(true)
				}
			},
			Current: func(seen map[string]bool) {
				// A new watcher delivered the current values: drop the keys
				// deleted while nobody watched.
				b.sweep(seen)
				if first {
					first = false
					loaded <- struct{}{}
				}
				s.notify()
			},
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = w.Run(ctx)
		}()
	}
	for range 2 {
		select {
		case <-ctx.Done():
			return nil
		case <-loaded:
		}
	}
	s.mu.Lock()
	s.log.Info().Int("engines", len(s.engines)).Int("demand", len(s.demand)).Int("rtt", len(s.rtt)).
		Dur("min_interval", s.opts.MinInterval).Dur("max_interval", s.opts.MaxInterval).
		Dur("heartbeat", s.opts.Heartbeat).Dur("lease_ttl", s.opts.LeaseTTL).Msg("optimizer running")
	s.mu.Unlock()

	wg.Add(1)
	go func() {
		defer wg.Done()
		s.leaseLoop(ctx, buckets[s.opts.Names.LeasesBucket])
	}()
	s.loop(ctx, buckets[s.opts.Names.WeightsBucket], buckets[s.opts.Names.EnginesBucket])
	return nil
}

// loop solves after changes (at most every MinInterval), at least every
// MaxInterval, and at once when leadership is gained.
func (s *Service) loop(ctx context.Context, weights, engines jetstream.KeyValue) {
	var last time.Time
	timer := time.NewTimer(0) // first solve at once
	defer timer.Stop()
	pending := true
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.gained:
			clear(s.keys) // another leader may have written: re-read every key before writing it
			pending = true
			timer.Reset(0)
			continue
		case restored := <-s.relaid:
			for _, name := range restored {
				switch name {
				case streams.BucketStream(s.opts.Names.WeightsBucket):
					clear(s.keys) // re-read (absent now) and write every key afresh
				case streams.BucketStream(s.opts.Names.EnginesBucket):
					clear(s.written) // write the penalty records again
				}
			}
			pending = true
			timer.Reset(0)
			continue
		case <-s.changed:
			if !pending {
				pending = true
				timer.Reset(max(0, time.Until(last.Add(s.opts.MinInterval))))
			}
			continue
		case <-timer.C:
		}
		if !pending && time.Since(last) < s.opts.MaxInterval {
			timer.Reset(time.Until(last.Add(s.opts.MaxInterval)))
			continue
		}
		pending = false
		last = time.Now()
		s.mu.Lock()
		s.dropCarriedLocked(last)
		s.mu.Unlock()
		s.restoreOperators(ctx, engines)
		s.solveAll(ctx, weights, engines)
		s.poison.Flush() // the summary of throttled bad-value lines, also when no more arrive
		timer.Reset(s.opts.MaxInterval)
	}
}

// notify signals the solve loop that inputs changed.
func (s *Service) notify() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// sortedKeys returns the keys of m in ascending order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// targets returns the shares of engines' effective capacity that the
// problem plans for: EngineTargetUtilisation, else TargetUtilisation.
func (o *Options) targets() plan.Targets {
	return plan.Targets{Common: o.TargetUtilisation, PerEngine: o.EngineTargetUtilisation}
}
