package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/switchyard-dev/switchyard/optimizer"
	"github.com/switchyard-dev/switchyard/sim/scenario"
)

// Calibration sizes: how many of the scenario's first requests make the mix
// that characterises an engine type, and how many requests measure each point
// of its true profile by default.
const (
	calibMix      = 100000
	calibRequests = 20000
)

// calibLoads returns the loads, as fractions of capacity, of a true profile's points.
func calibLoads() []float64 {
	return []float64{0.02, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.84, 0.88, 0.9, 0.92, 0.94, 0.96, 0.98}
}

// Profile is an engine type's true latency curve, measured by simulating one
// engine alone on the scenario's request mix.
type Profile struct {
	// Type names the engine type.
	Type string `json:"type"`
	// CapacityRPS is the saturation throughput, req/s.
	CapacityRPS float64 `json:"capacity_rps"`
	// IdleMs is the engine-side latency at (nearly) zero load, ms.
	IdleMs float64 `json:"idle_ms"`
	// Points are (load req/s, mean engine-side latency ms) pairs.
	Points [][2]float64 `json:"points"`
}

// fixedPolicy sends everything to engine 0.
type fixedPolicy struct{ noControl }

func (fixedPolicy) pick(*run, int, *scenario.Arrival) int { return 0 }

// perfectHits returns, for each arrival, the prompt tokens a perfect cache
// would hold when it arrives: the leading blocks that some earlier arrival
// already carried (so that some engine computed them), whatever engine it
// went to and however long ago. That is the prefill no routing can avoid
// subtracted from the prompt; nil when no arrival names its blocks.
func perfectHits(arrivals []scenario.Arrival) []int32 {
	out, named := make([]int32, len(arrivals)), false
	seen := map[uint64]bool{}
	for i := range arrivals {
		a := &arrivals[i]
		k := 0
		for k < len(a.Blocks) && seen[a.Blocks[k]] {
			k++
		}
		out[i] = int32(max(0, min(k*512, int(a.Prompt)-1)))
		for _, id := range a.Blocks {
			seen[id], named = true, true
		}
	}
	if !named {
		return nil
	}
	return out
}

// calibrate measures engine type t on the request shapes of mix. With
// floor, request k of the mix has at least floor[k] prompt tokens cached
// whatever the engine's cache holds (the bound's perfect cache).
func calibrate(sc *scenario.Scenario, ti int, mix []scenario.Arrival, floor []int32, seed uint64, n int) (Profile, error) {
	if n <= 0 {
		n = calibRequests
	}
	t := &sc.EngineTypes[ti]
	p := Profile{Type: t.Name}
	if len(mix) == 0 {
		return p, fmt.Errorf("sim: calibrate engine type %s: no requests", t.Name)
	}
	rng := rand.New(rand.NewPCG(seed, 0xCA11+uint64(ti)))
	shapes := func(n int, rate float64) []scenario.Arrival {
		out := make([]scenario.Arrival, n)
		at := 0.0
		for k := range out {
			src := mix[k%len(mix)]
			cycle := uint64(k / len(mix))
			a := scenario.Arrival{Prompt: src.Prompt, Output: src.Output, Blocks: src.Blocks}
			if cycle > 0 && len(src.Blocks) > 0 {
				a.Blocks = make([]uint64, len(src.Blocks))
				for b, id := range src.Blocks {
					a.Blocks[b] = id ^ cycle<<56
				}
			}
			if rate > 0 {
				at += rng.ExpFloat64() / rate * 1000
			}
			a.AtMs = at
			out[k] = a
		}
		return out
	}
	one := func(arr []scenario.Arrival, from float64) *run {
		f := &fleet{
			sc:       &scenario.Scenario{SLO: scenario.SLO{TTFTMs: math.Inf(1), TBTMs: math.Inf(1)}, SignalPeriodMs: 1000},
			engines:  []engineDesc{{name: "e", region: "r", typ: t, typeIdx: ti, capacity: 1}},
			clusters: []clusterDesc{{name: "c", region: "r"}},
			oneWay:   [][]float64{{0}},
		}
		f.measureFrom = from
		f.measureTo = math.Inf(1)
		f.horizon = math.Inf(1)
		r := newRun(f, arr, fixedPolicy{}, seed)
		if floor != nil {
			r.hitFloor = make([]int32, len(arr))
			for k := range arr {
				r.hitFloor[k] = floor[k%len(mix)]
			}
		}
		return r
	}
	// Saturation: everything at once; throughput between the 20th and 80th percentile completions.
	sat := shapes(n, 0)
	r := one(sat, 0)
	var finished []float64
	r.onFinish = func(t float64) { finished = append(finished, t) }
	r.simulate(false)
	nf := len(finished)
	if nf < 10 {
		return p, fmt.Errorf("sim: calibrate engine type %s: only %d of %d requests finished", t.Name, nf, len(sat))
	}
	slices.Sort(finished)
	lo, hi := nf/5, 4*nf/5
	if d := finished[hi] - finished[lo]; d > 0 {
		p.CapacityRPS = float64(hi-lo) / d * 1000
	} else {
		return p, fmt.Errorf("sim: calibrate engine type %s: no time between completions", t.Name)
	}
	for _, u := range calibLoads() {
		rate := u * p.CapacityRPS
		arr := shapes(n, rate)
		r := one(arr, arr[len(arr)/5].AtMs)
		r.simulate(false)
		res := r.m.result(r, "calibration")
		if math.IsNaN(res.E2EMeanMs) {
			return p, fmt.Errorf("sim: calibrate engine type %s at %.3g req/s: nothing finished", t.Name, rate)
		}
		p.Points = append(p.Points, [2]float64{rate, res.E2EMeanMs})
	}
	p.IdleMs = p.Points[0][1]
	return p, nil
}

// scaled returns the profile of an engine running at speed f: f times the
// load at 1/f times the latency.
func (p *Profile) scaled(f float64) [][2]float64 {
	out := make([][2]float64, len(p.Points))
	for k, pt := range p.Points {
		out[k] = [2]float64{pt[0] * f, pt[1] / f}
	}
	return out
}

// LowerBound is the fluid lower bound over the measured period: per phase
// between timed events, the optimizer's mean latency with the true profiles
// and the phase's mean demand, weighted by the requests served. On a
// workload with prefix information the profiles are measured with a perfect
// cache (see perfectHits): every request computes only the prefill that no
// routing could have avoided, so that KV reuse cannot take a policy below
// the bound.
type LowerBound struct {
	// E2EMeanMs is the bound on the mean end-to-end latency, ms.
	E2EMeanMs float64 `json:"e2e_mean_ms"`
	// Phases are the per-phase solutions.
	Phases []BoundPhase `json:"phases"`
}

// BoundPhase is the lower bound of one phase.
type BoundPhase struct {
	// FromS and ToS bound the phase, seconds.
	FromS float64 `json:"from_s"`
	ToS   float64 `json:"to_s"`
	// DemandRPS is the phase's mean demand and ShedRPS what the optimum sheds.
	DemandRPS float64 `json:"demand_rps"`
	ShedRPS   float64 `json:"shed_rps"`
	// MeanLatencyMs is the optimum's mean end-to-end latency, ms.
	MeanLatencyMs float64 `json:"mean_latency_ms"`
	// MaxUtilisation is the largest engine utilisation of the optimum.
	MaxUtilisation float64 `json:"max_utilisation"`
}

// lowerBound computes the fluid lower bound of the fleet on arrivals.
func lowerBound(f *fleet, arrivals []scenario.Arrival, profiles []Profile) (LowerBound, error) {
	var lb LowerBound
	cuts := []float64{f.measureFrom}
	for _, te := range f.events {
		if te.at > f.measureFrom && te.at < f.measureTo {
			cuts = append(cuts, te.at)
		}
	}
	cuts = append(cuts, f.measureTo)
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	up := make([]bool, len(f.engines))
	speed := make([]float64, len(f.engines))
	for j := range up {
		up[j], speed[j] = true, 1
	}
	applied := 0
	opt := optimizer.DefaultOptions()
	opt.ProximalMs, opt.DeadBand, opt.Congestion = 0, 0, -1
	opt.Tolerance = 1e-6
	opt.TimeBudget = -1 // offline: exact and reproducible rather than on time
	solver := optimizer.NewSolver(opt)
	var wsum, lsum float64
	for k := 0; k+1 < len(cuts); k++ {
		t0, t1 := cuts[k], cuts[k+1]
		for applied < len(f.events) && f.events[applied].at <= t0 {
			te := &f.events[applied]
			for _, j := range te.engines {
				switch te.kind {
				case tFail:
					up[j] = false
				case tRecover:
					up[j] = true
				case tCapacity:
					speed[j] = te.factor
				}
			}
			applied++
		}
		dur := (t1 - t0) / 1000
		if dur <= 0 {
			continue
		}
		counts := make([]float64, len(f.clusters))
		for i := range arrivals {
			if a := &arrivals[i]; a.AtMs >= t0 && a.AtMs < t1 {
				counts[a.Cluster]++
			}
		}
		prob := &optimizer.Problem{}
		var idx []int
		for j := range f.engines {
			if !up[j] {
				continue
			}
			pr := &profiles[f.engines[j].typeIdx]
			pp, err := optimizer.NewPointsProfile(pr.scaled(speed[j]))
			if err != nil {
				return lb, fmt.Errorf("sim: lower bound: engine %s profile: %w", f.engines[j].name, err)
			}
			prob.Engines = append(prob.Engines, optimizer.Engine{Name: f.engines[j].name, CapacityRPS: pr.CapacityRPS * speed[j], Health: 1, Profile: pp})
			idx = append(idx, j)
		}
		total := 0.0
		for c := range f.clusters {
			cl := optimizer.Cluster{Name: f.clusters[c].name}
			cl.Demand[optimizer.Standard] = counts[c] / dur
			total += counts[c] / dur
			row := make([]optimizer.Link, len(idx))
			for q, j := range idx {
				row[q] = optimizer.Link{Engine: q, Ms: f.rtt(c, j)}
			}
			prob.Clusters = append(prob.Clusters, cl)
			prob.Network = append(prob.Network, row)
		}
		ph := BoundPhase{FromS: t0 / 1000, ToS: t1 / 1000, DemandRPS: total}
		if len(idx) > 0 && total > 0 {
			sol, err := solver.Solve(prob, nil)
			if err != nil {
				return lb, fmt.Errorf("sim: lower bound phase %gs–%gs: %w", t0/1000, t1/1000, err)
			}
			ph.ShedRPS, ph.MeanLatencyMs = sol.ShedRPS, sol.MeanLatencyMs
			for _, e := range sol.Engines {
				ph.MaxUtilisation = math.Max(ph.MaxUtilisation, e.Utilisation)
			}
			w := (total - sol.ShedRPS) * dur
			wsum += w
			lsum += w * sol.MeanLatencyMs
		}
		lb.Phases = append(lb.Phases, ph)
	}
	lb.E2EMeanMs = math.NaN()
	if wsum > 0 {
		lb.E2EMeanMs = lsum / wsum
	}
	return lb, nil
}
