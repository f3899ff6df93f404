package scenario

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/switchyard-dev/switchyard/workload"
)

// ErrScenario is wrapped by every scenario parsing and validation error.
var ErrScenario = errors.New("sim: bad scenario")

// Scenario describes one simulation: the fleet, the frontend clusters and
// their arrivals, the network, timed events and the SLO. LoadScenario reads it
// from YAML, strictly: unknown keys are errors.
type Scenario struct {
	// Name names the scenario in reports.
	Name string `yaml:"name"`
	// Description says what the scenario shows.
	Description string `yaml:"description"`
	// DurationS is the simulated time over which requests arrive, seconds.
	// For trace sources 0 means the trace's span.
	DurationS float64 `yaml:"duration_s"`
	// WarmupS excludes requests arriving earlier from the metrics, seconds.
	WarmupS float64 `yaml:"warmup_s"`
	// DrainS is how long after the last arrival the simulation keeps running
	// so that requests finish; 0 means 120.
	DrainS float64 `yaml:"drain_s"`
	// Seed seeds the arrivals and every policy run (the --seed flag overrides it).
	Seed uint64 `yaml:"seed"`
	// SLO is the latency objective goodput counts against.
	SLO SLO `yaml:"slo"`
	// SignalPeriodMs is the engines' signal interval; 0 means 1000.
	SignalPeriodMs float64 `yaml:"signal_period_ms"`
	// ControlPeriodMs is how often feedback policies (switchyard, the
	// feedback loop) recompute weights; 0 means 1000.
	ControlPeriodMs float64 `yaml:"control_period_ms"`
	// SamplePeriodMs is the width of the windows of the traffic-share and
	// utilisation time series; 0 means 5000.
	SamplePeriodMs float64 `yaml:"sample_period_ms"`
	// EngineTypes are the engine models the fleet is built from.
	EngineTypes []EngineType `yaml:"engine_types"`
	// Engines are the fleet's engines.
	Engines []EngineSpec `yaml:"engines"`
	// Clusters are the frontend clusters and their arrivals.
	Clusters []ClusterSpec `yaml:"clusters"`
	// Network gives one-way latency between regions.
	Network Network `yaml:"network"`
	// Events are timed failures, recoveries, capacity drops and demand steps.
	Events []Event `yaml:"events"`
	// Policies tunes the policies.
	Policies PolicyOptions `yaml:"policies"`

	dir string // directory of the scenario file, for relative trace paths
}

// SLO is a latency objective on TTFT and TBT.
type SLO struct {
	// TTFTMs is the largest time to first token that meets the SLO; 0 means 2000.
	TTFTMs float64 `yaml:"ttft_ms"`
	// TBTMs is the largest mean time between tokens that meets the SLO; 0 means 100.
	TBTMs float64 `yaml:"tbt_ms"`
}

// EngineType is an engine model: its batching, speed and KV cache.
type EngineType struct {
	// Name names the type.
	Name string `yaml:"name"`
	// MaxBatch is the largest number of requests decoded together.
	MaxBatch int `yaml:"max_batch"`
	// PrefillMsPerToken is the prefill time per uncached prompt token.
	PrefillMsPerToken float64 `yaml:"prefill_ms_per_token"`
	// TBTBaseMs is the decode step time with one running request.
	TBTBaseMs float64 `yaml:"tbt_base_ms"`
	// TBTPerRequestMs is added to the decode step per extra running request.
	TBTPerRequestMs float64 `yaml:"tbt_per_request_ms"`
	// TBTPerKTokenMs is added to the decode step per 1000 context tokens in the batch.
	TBTPerKTokenMs float64 `yaml:"tbt_per_ktoken_ms"`
	// KVBlocks is the KV cache size in 512-token blocks.
	KVBlocks int `yaml:"kv_blocks"`
	// TargetUtilisation is the switchyard control loop's target utilisation
	// for engines of this type, in place of
	// policies.switchyard.target_utilisation: an operator's extra headroom on
	// a slower type, whose long generations make the end-to-end tail. 0
	// means the policy's.
	TargetUtilisation float64 `yaml:"target_utilisation"`
}

// EngineSpec places Count engines of a type in a region.
type EngineSpec struct {
	// Name names the engine; with Count > 1 the engines are Name-1 … Name-Count.
	Name string `yaml:"name"`
	// Region is the engine's region.
	Region string `yaml:"region"`
	// Type names an engine type.
	Type string `yaml:"type"`
	// Count is the number of such engines; 0 means 1.
	Count int `yaml:"count"`
}

// ClusterSpec is a frontend cluster: its region and its arrivals, from
// exactly one of Poisson, Bursts, Trace and Generator.
type ClusterSpec struct {
	// Name names the cluster.
	Name string `yaml:"name"`
	// Region is the cluster's region.
	Region string `yaml:"region"`
	// Poisson arrivals at a constant rate.
	Poisson *PoissonSource `yaml:"poisson"`
	// Bursts: Poisson arrivals whose rate switches between a base and a burst rate.
	Bursts *BurstSource `yaml:"bursts"`
	// Trace replays a trace file.
	Trace *TraceSource `yaml:"trace"`
	// Generator generates sessions of a workload family (package workload).
	Generator *GeneratorSource `yaml:"generator"`
	// PromptTokens and OutputTokens are the lengths of generated requests
	// (Poisson and bursts); 0 means 256 and 64.
	PromptTokens int `yaml:"prompt_tokens"`
	OutputTokens int `yaml:"output_tokens"`
	// TokenDist is "fixed" (default) or "exponential" (geometric lengths with
	// those means, at least 1).
	TokenDist string `yaml:"token_dist"`
	// Sessions spreads generated requests over this many conversations that
	// share their prompt blocks (0: no sessions, no prefix reuse).
	Sessions int `yaml:"sessions"`
}

// PoissonSource is a constant-rate Poisson process.
type PoissonSource struct {
	// Rate is the arrival rate, req/s.
	Rate float64 `yaml:"rate"`
}

// BurstSource is an on-off modulated Poisson process.
type BurstSource struct {
	// Rate is the base rate, req/s.
	Rate float64 `yaml:"rate"`
	// BurstRate is the rate during a burst, req/s.
	BurstRate float64 `yaml:"burst_rate"`
	// EveryS is the time from one burst's start to the next, seconds.
	EveryS float64 `yaml:"every_s"`
	// BurstS is a burst's length, seconds.
	BurstS float64 `yaml:"burst_s"`
}

// TraceSource replays a trace: the Azure CSV or the Mooncake JSONL.
type TraceSource struct {
	// File is the trace path. A relative path is resolved against the
	// scenario file's directory first and, when no file is there, against
	// the working directory.
	File string `yaml:"file"`
	// Scale multiplies the trace's rate (timestamps are divided by it); 0 means 1.
	Scale float64 `yaml:"scale"`
	// Offset, 0..1, starts the replay at this fraction of the trace's span,
	// wrapping around, so that clusters replaying one trace are not in step.
	Offset float64 `yaml:"offset"`
}

// GeneratorSource generates a session workload with workload.Sessions:
// Family picks the preset (workload.GeneratorDefaults), and every non-zero
// field below replaces the preset's value. Demand events scale its rate.
type GeneratorSource struct {
	// Family is one of workload.Families().
	Family string `yaml:"family"`
	// Rate is the mean request rate, req/s.
	Rate float64 `yaml:"rate"`
	// Tenants, TenantSkew, SystemTokens, FirstTokens, TurnTokens,
	// OutputTokens, Turns, ThinkS and MaxContextTokens override the
	// preset's (see workload.SessionOptions).
	Tenants          int     `yaml:"tenants"`
	TenantSkew       float64 `yaml:"tenant_skew"`
	SystemTokens     int     `yaml:"system_tokens"`
	FirstTokens      int     `yaml:"first_tokens"`
	TurnTokens       int     `yaml:"turn_tokens"`
	OutputTokens     int     `yaml:"output_tokens"`
	Turns            float64 `yaml:"turns"`
	ThinkS           float64 `yaml:"think_s"`
	MaxContextTokens int     `yaml:"max_context_tokens"`
	// SessionIDs sends each request with its session's id (default: none,
	// as most clients send them).
	SessionIDs bool `yaml:"session_ids"`
	// Diurnal swings the rate sinusoidally: period_s and amplitude (0..1).
	Diurnal struct {
		PeriodS   float64 `yaml:"period_s"`
		Amplitude float64 `yaml:"amplitude"`
	} `yaml:"diurnal"`
	// Flash multiplies the rate by factor for burst_s every every_s seconds,
	// the first burst at start_s.
	Flash struct {
		EveryS float64 `yaml:"every_s"`
		BurstS float64 `yaml:"burst_s"`
		StartS float64 `yaml:"start_s"`
		Factor float64 `yaml:"factor"`
	} `yaml:"flash"`
}

// Options returns the workload options of the source for a run of
// duration d and seed.
func (g *GeneratorSource) Options(d time.Duration, seed uint64) (workload.SessionOptions, error) {
	o, err := workload.GeneratorDefaults(g.Family)
	if err != nil {
		return o, err
	}
	o.Rate, o.Duration, o.Seed, o.SessionIDs = g.Rate, d, seed, g.SessionIDs
	setI := func(p *int, v int) {
		if v != 0 {
			*p = v
		}
	}
	setF := func(p *float64, v float64) {
		if v != 0 {
			*p = v
		}
	}
	setI(&o.Tenants, g.Tenants)
	setF(&o.TenantSkew, g.TenantSkew)
	setI(&o.SystemTokens, g.SystemTokens)
	setI(&o.FirstTokens, g.FirstTokens)
	setI(&o.TurnTokens, g.TurnTokens)
	setI(&o.OutputTokens, g.OutputTokens)
	setF(&o.Turns, g.Turns)
	setF(&o.ThinkS, g.ThinkS)
	setI(&o.MaxContextTokens, g.MaxContextTokens)
	o.Diurnal = workload.Diurnal{PeriodS: g.Diurnal.PeriodS, Amplitude: g.Diurnal.Amplitude}
	o.Bursts = workload.Bursts{EveryS: g.Flash.EveryS, BurstS: g.Flash.BurstS, StartS: g.Flash.StartS, Factor: g.Flash.Factor}
	return o, o.Validate()
}

// Network gives the one-way latency from a cluster's region to an engine's region.
type Network struct {
	// LocalMs is the latency within a region; 0 means 1.
	LocalMs float64 `yaml:"local_ms"`
	// RemoteMs is the latency between regions not listed in Between; 0 means 20.
	RemoteMs float64 `yaml:"remote_ms"`
	// Between lists the latency of region pairs (symmetric).
	Between []RegionLink `yaml:"between"`
}

// RegionLink is the one-way latency between two regions.
type RegionLink struct {
	A  string  `yaml:"a"`
	B  string  `yaml:"b"`
	Ms float64 `yaml:"ms"`
}

// Event is a timed event: exactly one of its actions at AtS.
type Event struct {
	// AtS is the event's time, seconds.
	AtS float64 `yaml:"at_s"`
	// Fail takes engines down: running requests are lost, queued ones are
	// returned to their routers, the KV cache is lost.
	Fail *Target `yaml:"fail"`
	// Recover brings failed engines back, with an empty KV cache.
	Recover *Target `yaml:"recover"`
	// Capacity sets engines' speed factor (0.5 halves capacity).
	Capacity *CapacityChange `yaml:"capacity"`
	// Demand multiplies a cluster's arrival rate from AtS on.
	Demand *DemandChange `yaml:"demand"`
}

// Target selects engines: one engine by name or every engine of a region.
type Target struct {
	Engine string `yaml:"engine"`
	Region string `yaml:"region"`
}

// CapacityChange sets the speed factor of the target engines.
type CapacityChange struct {
	Target `yaml:",inline"`
	// Factor multiplies the engines' nominal speed, > 0.
	Factor float64 `yaml:"factor"`
}

// DemandChange multiplies a cluster's arrival rate (relative to its nominal rate).
type DemandChange struct {
	// Cluster names the cluster; empty means every cluster.
	Cluster string `yaml:"cluster"`
	// Factor multiplies the nominal rate, ≥ 0.
	Factor float64 `yaml:"factor"`
}

// DefaultTargetUtilisation is the switchyard control loop's default target
// utilisation (PolicyOptions.Switchyard.TargetUtilisation): engines are
// planned up to 95% of their capacity. It must stay above the load a fleet
// should serve without shedding (the example scenarios run at up to 86%).
const DefaultTargetUtilisation = 0.95

// PolicyOptions tunes the policies; zero values take the defaults.
type PolicyOptions struct {
	// PrefixAffinity tunes the prefix-affinity greedy policy.
	PrefixAffinity struct {
		// LoadWeight is the cost, in prompt blocks, of one request in flight
		// per unit of max batch on an engine; 0 means 16.
		LoadWeight float64 `yaml:"load_weight"`
	} `yaml:"prefix_affinity"`
	// FeedbackLoop tunes the early feedback loop.
	FeedbackLoop struct {
		// Gain is the proportional gain of the weight nudges; 0 means 0.2.
		Gain float64 `yaml:"gain"`
		// Alpha is the EWMA weight of a new latency measurement; 0 means 0.5.
		Alpha float64 `yaml:"alpha"`
	} `yaml:"feedback_loop"`
	// Switchyard tunes the switchyard policy.
	Switchyard struct {
		// Slots is the selection table size (a power of two); 0 means 4096.
		Slots int `yaml:"slots"`
		// Epsilon is the bounded-load slack; 0 means selection.DefaultEpsilon.
		Epsilon float64 `yaml:"epsilon"`
		// AffinityBlocks is how many leading prompt blocks the affinity key
		// hashes when a request has no session; 0 means 1.
		AffinityBlocks int `yaml:"affinity_blocks"`
		// TargetUtilisation is the utilisation the control loop plans engines
		// up to: each engine's capacity in the optimizer's problem is its
		// signalled capacity times this, so that engines keep headroom for
		// the bursts a control period cannot follow and demand beyond it is
		// shed rather than queued; 0 means DefaultTargetUtilisation.
		TargetUtilisation float64 `yaml:"target_utilisation"`
	} `yaml:"switchyard"`
}

// LoadScenario reads and validates a scenario file.
func LoadScenario(path string) (*Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrScenario, err)
	}
	s, err := ParseScenario(path, data)
	if err != nil {
		return nil, err
	}
	s.dir = filepath.Dir(path)
	return s, nil
}

// ParseScenario parses and validates a scenario; name labels errors.
// Relative trace paths resolve against the working directory.
func ParseScenario(name string, data []byte) (*Scenario, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var s Scenario
	if err := dec.Decode(&s); err != nil {
		if err == io.EOF {
			return nil, fmt.Errorf("%w: %s: empty file", ErrScenario, name)
		}
		return nil, fmt.Errorf("%w: %s: %v", ErrScenario, name, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err != io.EOF {
		return nil, fmt.Errorf("%w: %s: more than one YAML document", ErrScenario, name)
	}
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrScenario, name, err)
	}
	return &s, nil
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func fieldf(field string, v any, format string, args ...any) error {
	return fmt.Errorf("%s: %v: %s", field, v, fmt.Sprintf(format, args...))
}

// Validate applies defaults and checks the scenario, returning an error that
// names the first bad field.
func (s *Scenario) Validate() error {
	pos := func(field string, v float64, zeroOK bool) error {
		if !finite(v) || v < 0 || (!zeroOK && v == 0) {
			if zeroOK {
				return fieldf(field, v, "want a finite number ≥ 0")
			}
			return fieldf(field, v, "want a finite number > 0")
		}
		return nil
	}
	for _, c := range []struct {
		f string
		v float64
	}{{"duration_s", s.DurationS}, {"warmup_s", s.WarmupS}, {"drain_s", s.DrainS}, {"slo.ttft_ms", s.SLO.TTFTMs},
		{"slo.tbt_ms", s.SLO.TBTMs}, {"signal_period_ms", s.SignalPeriodMs}, {"control_period_ms", s.ControlPeriodMs},
		{"sample_period_ms", s.SamplePeriodMs}, {"network.local_ms", s.Network.LocalMs}, {"network.remote_ms", s.Network.RemoteMs}} {
		if err := pos(c.f, c.v, true); err != nil {
			return err
		}
	}
	def := func(p *float64, v float64) {
		if *p == 0 {
			*p = v
		}
	}
	def(&s.DrainS, 120)
	def(&s.SLO.TTFTMs, 2000)
	def(&s.SLO.TBTMs, 100)
	def(&s.SignalPeriodMs, 1000)
	def(&s.ControlPeriodMs, 1000)
	def(&s.SamplePeriodMs, 5000)
	def(&s.Network.LocalMs, 1)
	def(&s.Network.RemoteMs, 20)
	if s.WarmupS > 0 && s.DurationS > 0 && s.WarmupS >= s.DurationS {
		return fieldf("warmup_s", s.WarmupS, "want less than duration_s %v", s.DurationS)
	}
	if len(s.EngineTypes) == 0 {
		return fieldf("engine_types", "[]", "want at least one engine type")
	}
	types := map[string]bool{}
	for k := range s.EngineTypes {
		t := &s.EngineTypes[k]
		f := "engine_types[" + strconv.Itoa(k) + "]"
		if !validName(t.Name) {
			return fieldf(f+".name", strconv.Quote(t.Name), "want a name without dots, spaces or wildcards")
		}
		if types[t.Name] {
			return fieldf(f+".name", t.Name, "duplicate engine type")
		}
		types[t.Name] = true
		if t.MaxBatch < 1 || t.MaxBatch > 100000 {
			return fieldf(f+".max_batch", t.MaxBatch, "want 1..100000")
		}
		if u := t.TargetUtilisation; !finite(u) || u < 0 || u > 1 || (u > 0 && u < 0.5) {
			return fieldf(f+".target_utilisation", u, "want 0.5..1 (0: policies.switchyard.target_utilisation)")
		}
		if t.KVBlocks < 1 || t.KVBlocks > 1<<26 {
			return fieldf(f+".kv_blocks", t.KVBlocks, "want 1..%d", 1<<26)
		}
		for _, c := range []struct {
			f      string
			v      float64
			zeroOK bool
		}{{".prefill_ms_per_token", t.PrefillMsPerToken, true}, {".tbt_base_ms", t.TBTBaseMs, false},
			{".tbt_per_request_ms", t.TBTPerRequestMs, true}, {".tbt_per_ktoken_ms", t.TBTPerKTokenMs, true}} {
			if err := pos(f+c.f, c.v, c.zeroOK); err != nil {
				return err
			}
		}
	}
	regions := map[string]bool{}
	names := map[string]bool{}
	if len(s.Engines) == 0 {
		return fieldf("engines", "[]", "want at least one engine")
	}
	for k := range s.Engines {
		e := &s.Engines[k]
		f := "engines[" + strconv.Itoa(k) + "]"
		if !validName(e.Name) {
			return fieldf(f+".name", strconv.Quote(e.Name), "want a name without dots, spaces or wildcards")
		}
		if !validName(e.Region) {
			return fieldf(f+".region", strconv.Quote(e.Region), "want a region name without dots, spaces or wildcards")
		}
		if !types[e.Type] {
			return fieldf(f+".type", strconv.Quote(e.Type), "no engine type of that name")
		}
		if e.Count < 0 || e.Count > 10000 {
			return fieldf(f+".count", e.Count, "want 0..10000")
		}
		for _, n := range e.Names() {
			if names[n] {
				return fieldf(f+".name", n, "duplicate engine name")
			}
			names[n] = true
		}
		regions[e.Region] = true
	}
	if len(s.Clusters) == 0 {
		return fieldf("clusters", "[]", "want at least one cluster")
	}
	clusters := map[string]bool{}
	for k := range s.Clusters {
		c := &s.Clusters[k]
		f := "clusters[" + strconv.Itoa(k) + "]"
		if !validName(c.Name) {
			return fieldf(f+".name", strconv.Quote(c.Name), "want a name without dots, spaces or wildcards")
		}
		if clusters[c.Name] {
			return fieldf(f+".name", c.Name, "duplicate cluster name")
		}
		clusters[c.Name] = true
		if !validName(c.Region) {
			return fieldf(f+".region", strconv.Quote(c.Region), "want a region name without dots, spaces or wildcards")
		}
		n := 0
		if c.Poisson != nil {
			n++
			if err := pos(f+".poisson.rate", c.Poisson.Rate, false); err != nil {
				return err
			}
		}
		if b := c.Bursts; b != nil {
			n++
			for _, x := range []struct {
				f      string
				v      float64
				zeroOK bool
			}{{".rate", b.Rate, true}, {".burst_rate", b.BurstRate, true}, {".every_s", b.EveryS, false}, {".burst_s", b.BurstS, true}} {
				if err := pos(f+".bursts"+x.f, x.v, x.zeroOK); err != nil {
					return err
				}
			}
			if b.BurstS > b.EveryS {
				return fieldf(f+".bursts.burst_s", b.BurstS, "want at most every_s %v", b.EveryS)
			}
		}
		if t := c.Trace; t != nil {
			n++
			if t.File == "" {
				return fieldf(f+".trace.file", `""`, "want a trace file")
			}
			if err := pos(f+".trace.scale", t.Scale, true); err != nil {
				return err
			}
			if t.Scale == 0 {
				t.Scale = 1
			}
			if !finite(t.Offset) || t.Offset < 0 || t.Offset >= 1 {
				return fieldf(f+".trace.offset", t.Offset, "want 0 ≤ offset < 1")
			}
		}
		if g := c.Generator; g != nil {
			n++
			if s.DurationS > 0 {
				if _, err := g.Options(time.Duration(s.DurationS*float64(time.Second)), 0); err != nil {
					return fieldf(f+".generator", g.Family, "%v", err)
				}
			}
		}
		if n != 1 {
			return fieldf(f, c.Name, "want exactly one of poisson, bursts, trace and generator, got %d", n)
		}
		if c.Trace == nil && s.DurationS == 0 {
			return fieldf("duration_s", 0, "want a duration for cluster %s's generated arrivals", c.Name)
		}
		if c.PromptTokens < 0 || c.PromptTokens > 10_000_000 {
			return fieldf(f+".prompt_tokens", c.PromptTokens, "want 0..10000000")
		}
		if c.OutputTokens < 0 || c.OutputTokens > 10_000_000 {
			return fieldf(f+".output_tokens", c.OutputTokens, "want 0..10000000")
		}
		if c.PromptTokens == 0 {
			c.PromptTokens = 256
		}
		if c.OutputTokens == 0 {
			c.OutputTokens = 64
		}
		switch c.TokenDist {
		case "":
			c.TokenDist = "fixed"
		case "fixed", "exponential":
		default:
			return fieldf(f+".token_dist", strconv.Quote(c.TokenDist), `want "fixed" or "exponential"`)
		}
		if c.Sessions < 0 || c.Sessions > 1<<30 {
			return fieldf(f+".sessions", c.Sessions, "want 0..%d", 1<<30)
		}
		regions[c.Region] = true
	}
	for k, l := range s.Network.Between {
		f := "network.between[" + strconv.Itoa(k) + "]"
		if !regions[l.A] {
			return fieldf(f+".a", strconv.Quote(l.A), "no engine or cluster in that region")
		}
		if !regions[l.B] {
			return fieldf(f+".b", strconv.Quote(l.B), "no engine or cluster in that region")
		}
		if err := pos(f+".ms", l.Ms, true); err != nil {
			return err
		}
	}
	for k := range s.Events {
		ev := &s.Events[k]
		f := "events[" + strconv.Itoa(k) + "]"
		if err := pos(f+".at_s", ev.AtS, true); err != nil {
			return err
		}
		n := 0
		target := func(g string, t *Target) error {
			n++
			switch {
			case t.Engine != "" && t.Region != "":
				return fieldf(f+"."+g, t.Engine, "want engine or region, not both")
			case t.Engine != "" && !names[t.Engine]:
				return fieldf(f+"."+g+".engine", strconv.Quote(t.Engine), "no engine of that name")
			case t.Region != "" && !regions[t.Region]:
				return fieldf(f+"."+g+".region", strconv.Quote(t.Region), "no engine in that region")
			case t.Engine == "" && t.Region == "":
				return fieldf(f+"."+g, "{}", "want an engine or a region")
			}
			return nil
		}
		if ev.Fail != nil {
			if err := target("fail", ev.Fail); err != nil {
				return err
			}
		}
		if ev.Recover != nil {
			if err := target("recover", ev.Recover); err != nil {
				return err
			}
		}
		if ev.Capacity != nil {
			if err := target("capacity", &ev.Capacity.Target); err != nil {
				return err
			}
			if err := pos(f+".capacity.factor", ev.Capacity.Factor, false); err != nil {
				return err
			}
		}
		if ev.Demand != nil {
			n++
			if ev.Demand.Cluster != "" && !clusters[ev.Demand.Cluster] {
				return fieldf(f+".demand.cluster", strconv.Quote(ev.Demand.Cluster), "no cluster of that name")
			}
			if err := pos(f+".demand.factor", ev.Demand.Factor, true); err != nil {
				return err
			}
		}
		if n != 1 {
			return fieldf(f, ev.AtS, "want exactly one of fail, recover, capacity and demand, got %d", n)
		}
	}
	po := &s.Policies
	if err := pos("policies.prefix_affinity.load_weight", po.PrefixAffinity.LoadWeight, true); err != nil {
		return err
	}
	def(&po.PrefixAffinity.LoadWeight, 16)
	if err := pos("policies.feedback_loop.gain", po.FeedbackLoop.Gain, true); err != nil {
		return err
	}
	def(&po.FeedbackLoop.Gain, 0.2)
	if a := po.FeedbackLoop.Alpha; !finite(a) || a < 0 || a > 1 {
		return fieldf("policies.feedback_loop.alpha", a, "want 0..1")
	}
	def(&po.FeedbackLoop.Alpha, 0.5)
	if sl := po.Switchyard.Slots; sl != 0 && (sl < 1 || sl > 1<<20 || sl&(sl-1) != 0) {
		return fieldf("policies.switchyard.slots", sl, "want a power of two up to %d", 1<<20)
	}
	if po.Switchyard.Slots == 0 {
		po.Switchyard.Slots = 4096
	}
	if e := po.Switchyard.Epsilon; !finite(e) || e < 0 {
		return fieldf("policies.switchyard.epsilon", e, "want a finite number ≥ 0")
	}
	if b := po.Switchyard.AffinityBlocks; b < 0 || b > 1000 {
		return fieldf("policies.switchyard.affinity_blocks", b, "want 0..1000")
	}
	if po.Switchyard.AffinityBlocks == 0 {
		po.Switchyard.AffinityBlocks = 1
	}
	if u := po.Switchyard.TargetUtilisation; !finite(u) || u < 0 || u > 1 || (u > 0 && u < 0.5) {
		return fieldf("policies.switchyard.target_utilisation", u, "want 0.5..1 (0: %v)", DefaultTargetUtilisation)
	}
	def(&po.Switchyard.TargetUtilisation, DefaultTargetUtilisation)
	return nil
}

// Names returns the engine names an EngineSpec stands for: its name, or
// name-1 … name-count when it stands for several.
func (e *EngineSpec) Names() []string {
	if e.Count <= 1 {
		return []string{e.Name}
	}
	out := make([]string, e.Count)
	for k := range out {
		out[k] = e.Name + "-" + strconv.Itoa(k+1)
	}
	return out
}

// validName reports whether s is a NATS token: non-empty, no dots, spaces or wildcards.
func validName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r == '.' || r == '*' || r == '>' || r == 0x7f {
			return false
		}
	}
	return true
}

// ResolvePath resolves a trace path as the scenario does: an absolute path as
// is; a relative one against the scenario file's directory when a file exists
// there, else against the working directory.
func (s *Scenario) ResolvePath(p string) string {
	if filepath.IsAbs(p) || s.dir == "" {
		return p
	}
	if q := filepath.Join(s.dir, p); fileExists(q) {
		return q
	}
	return p
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// SetTrace replaces the file of every trace source with path (the --trace
// flag); it fails when the scenario has no trace source.
func (s *Scenario) SetTrace(path string) error {
	n := 0
	for k := range s.Clusters {
		if s.Clusters[k].Trace != nil {
			s.Clusters[k].Trace.File = path
			n++
		}
	}
	if n == 0 {
		return fmt.Errorf("%w: --trace %s: the scenario has no trace source to replace", ErrScenario, path)
	}
	return nil
}

// OneWayMs returns the one-way latency between two regions.
func (n *Network) OneWayMs(a, b string) float64 {
	if a == b {
		return n.LocalMs
	}
	for _, l := range n.Between {
		if (l.A == a && l.B == b) || (l.A == b && l.B == a) {
			return l.Ms
		}
	}
	return n.RemoteMs
}
