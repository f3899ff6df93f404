package scenario

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/workload"
)

// Arrival is one request arriving at a frontend cluster. Arrivals are
// generated once per scenario and shared, read-only, by every policy run.
type Arrival struct {
	// AtMs is the arrival time at the frontend, ms from the start.
	AtMs float64
	// Cluster is the index of the frontend cluster.
	Cluster int32
	// Prompt and Output are the request's lengths in tokens (Output ≥ 1).
	Prompt, Output int32
	// Blocks names the prompt's 512-token blocks (nil: no prefix information).
	Blocks []uint64
	// Session is the conversation id (0: none).
	Session uint64
	// Key is the affinity key routers use: the session's hash, else the hash
	// of the leading prompt blocks, else 0 (no affinity).
	Key uint64
}

// rateFn is a piecewise-constant rate: rate(t) and the next time it may change.
type rateFn func(t float64) (rate, next float64)

// demandFactor returns the demand multiplier of cluster c at time t (ms) and
// the time of the next demand event after t.
func (s *Scenario) demandFactor(evs []Event, c int, t float64) (float64, float64) {
	f, next := 1.0, math.Inf(1)
	for _, ev := range evs {
		d := ev.Demand
		if d == nil || (d.Cluster != "" && d.Cluster != s.Clusters[c].Name) {
			continue
		}
		at := ev.AtS * 1000
		if at <= t {
			f = d.Factor
		} else {
			next = at
			break
		}
	}
	return f, next
}

// SortedEvents returns the events ordered by time (stable).
func (s *Scenario) SortedEvents() []Event {
	evs := slices.Clone(s.Events)
	slices.SortStableFunc(evs, func(a, b Event) int {
		switch {
		case a.AtS < b.AtS:
			return -1
		case a.AtS > b.AtS:
			return 1
		}
		return 0
	})
	return evs
}

// Arrivals generates the scenario's arrivals for seed: every cluster's
// Poisson, burst or trace source, with demand steps applied, merged in time
// order. Trace files are read from disk.
func (s *Scenario) Arrivals(seed uint64) ([]Arrival, error) {
	var all []Arrival
	traces := map[string][]workload.Request{}
	evs := s.SortedEvents()
	for c := range s.Clusters {
		cs := &s.Clusters[c]
		rng := rand.New(rand.NewPCG(seed, 0xA77_1000+uint64(c)))
		var got []Arrival
		switch {
		case cs.Poisson != nil:
			r := cs.Poisson.Rate
			got = s.generate(c, rng, func(t float64) (float64, float64) {
				f, next := s.demandFactor(evs, c, t)
				return r * f, next
			})
		case cs.Bursts != nil:
			b := *cs.Bursts
			got = s.generate(c, rng, func(t float64) (float64, float64) {
				f, next := s.demandFactor(evs, c, t)
				period, burst := b.EveryS*1000, b.BurstS*1000
				k := math.Floor(t / period)
				phase := t - k*period
				rate, edge := b.Rate, (k+1)*period
				if phase < burst {
					rate, edge = b.BurstRate, k*period+burst
				}
				return rate * f, math.Min(next, edge)
			})
		case cs.Generator != nil:
			o, err := cs.Generator.Options(time.Duration(s.DurationS*float64(time.Second)), seed^mixSeed(uint64(c)))
			if err != nil {
				return nil, fmt.Errorf("sim: clusters[%d].generator: %w", c, err)
			}
			reqs, err := workload.Sessions(o)
			if err != nil {
				return nil, fmt.Errorf("sim: clusters[%d].generator: %w", c, err)
			}
			got = s.generated(evs, c, rng, reqs)
		default:
			path := s.ResolvePath(cs.Trace.File)
			reqs, ok := traces[path]
			if !ok {
				var err error
				if reqs, err = workload.Load(path); err != nil {
					return nil, fmt.Errorf("sim: clusters[%d].trace.file: %w", c, err)
				}
				traces[path] = reqs
			}
			got = s.replay(evs, c, rng, reqs)
		}
		all = append(all, got...)
	}
	slices.SortStableFunc(all, func(a, b Arrival) int {
		switch {
		case a.AtMs < b.AtMs:
			return -1
		case a.AtMs > b.AtMs:
			return 1
		}
		return int(a.Cluster) - int(b.Cluster)
	})
	ab := s.Policies.Switchyard.AffinityBlocks
	for k := range all {
		all[k].Key = affinityKey(&all[k], ab)
	}
	return all, nil
}

// affinityKey returns the routing key of a request: its session's hash, else
// the hash of its first n prompt blocks, else 0.
func affinityKey(a *Arrival, n int) uint64 {
	if a.Session != 0 {
		return selection.Mix64(a.Session ^ 0x5e55_10e1_d0d0_0001)
	}
	if len(a.Blocks) == 0 {
		return 0
	}
	h := uint64(0x9e3f_1c00_d0d0_0003)
	for k := 0; k < n && k < len(a.Blocks); k++ {
		h = selection.Mix64(h ^ a.Blocks[k])
	}
	return h | 1
}

// length draws a token length with mean m: m itself, or geometric on 1, 2, …
// with mean m.
func length(rng *rand.Rand, m int, exponential bool) int32 {
	if !exponential || m <= 1 {
		return int32(m)
	}
	p := 1 / float64(m)
	u := 1 - rng.Float64() // (0, 1]
	n := math.Ceil(math.Log(u) / math.Log1p(-p))
	return int32(max(1, min(n, 10_000_000)))
}

// generate draws Poisson arrivals of cluster c with a piecewise-constant rate
// over [0, duration).
func (s *Scenario) generate(c int, rng *rand.Rand, rate rateFn) []Arrival {
	cs := &s.Clusters[c]
	end := s.DurationS * 1000
	exp := cs.TokenDist == "exponential"
	var out []Arrival
	t := 0.0
	for {
		e := rng.ExpFloat64()
		for {
			r, next := rate(t)
			r /= 1000 // per ms
			if r > 0 && t+e/r < next {
				t += e / r
				break
			}
			if r > 0 {
				e -= r * (next - t)
			}
			t = next
			if t >= end {
				return out
			}
		}
		if t >= end {
			return out
		}
		a := Arrival{AtMs: t, Cluster: int32(c), Prompt: length(rng, cs.PromptTokens, exp), Output: length(rng, cs.OutputTokens, exp)}
		if cs.Sessions > 0 {
			sess := uint64(rng.IntN(cs.Sessions)) + 1
			a.Session = uint64(c+1)<<32 | sess
			n := (int(a.Prompt) + workload.BlockTokens - 1) / workload.BlockTokens
			a.Blocks = make([]uint64, n)
			for b := range a.Blocks {
				a.Blocks[b] = uint64(c+1)<<48 | sess<<20 | uint64(b)
			}
		}
		out = append(out, a)
	}
}

// mixSeed derives a cluster's generator seed, so that clusters with the
// same generator draw different sessions.
func mixSeed(c uint64) uint64 { return selection.Mix64(c + 0x6e0e_0001) }

// generated turns generated requests into arrivals of cluster c, thinned or
// duplicated by demand steps as a replayed trace is.
func (s *Scenario) generated(evs []Event, c int, rng *rand.Rand, reqs []workload.Request) []Arrival {
	out := make([]Arrival, 0, len(reqs))
	for _, r := range reqs {
		t := float64(r.At) / 1e6
		f, _ := s.demandFactor(evs, c, t)
		copies := int(f)
		if rng.Float64() < f-float64(copies) {
			copies++
		}
		for k := 0; k < copies; k++ {
			a := Arrival{AtMs: t, Cluster: int32(c), Prompt: int32(r.PromptTokens), Output: int32(max(1, r.OutputTokens)), Session: r.Session, Blocks: r.Blocks}
			if k > 0 {
				a.AtMs += rng.Float64() * 50
			}
			out = append(out, a)
		}
	}
	return out
}

// replay turns a trace into arrivals of cluster c: rotated by the source's
// offset, compressed by its scale, repeated (with fresh block ids) when the
// scenario's duration is longer than the trace, and thinned or duplicated by
// demand steps.
func (s *Scenario) replay(evs []Event, c int, rng *rand.Rand, reqs []workload.Request) []Arrival {
	src := s.Clusters[c].Trace
	n := len(reqs)
	first := float64(reqs[0].At) / 1e6
	span := float64(reqs[n-1].At)/1e6 - first
	if n > 1 {
		span += span / float64(n-1) // one mean gap, so that a wrapped replay keeps its rate
	} else {
		span = 1000
	}
	shift := src.Offset * span
	end := s.DurationS * 1000
	if end == 0 {
		end = span / src.Scale
	}
	var out []Arrival
	for cycle := 0; ; cycle++ {
		base := float64(cycle) * span
		if base/src.Scale >= end {
			break
		}
		for _, r := range reqs {
			t := float64(r.At)/1e6 - first - shift
			if t < 0 {
				t += span
			}
			t = (t + base) / src.Scale
			if t >= end {
				continue
			}
			f, _ := s.demandFactor(evs, c, t)
			copies := int(f)
			if rng.Float64() < f-float64(copies) {
				copies++
			}
			for k := 0; k < copies; k++ {
				a := Arrival{AtMs: t, Cluster: int32(c), Prompt: int32(r.PromptTokens), Output: int32(max(1, r.OutputTokens)), Session: r.Session}
				if k > 0 {
					a.AtMs += rng.Float64() * 50
				}
				if len(r.Blocks) > 0 {
					if cycle == 0 {
						a.Blocks = r.Blocks
					} else {
						a.Blocks = make([]uint64, len(r.Blocks))
						for b, id := range r.Blocks {
							a.Blocks[b] = id ^ uint64(cycle)<<52
						}
					}
				}
				out = append(out, a)
			}
		}
	}
	return out
}
