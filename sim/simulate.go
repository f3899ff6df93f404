package sim

import (
	"context"
	"fmt"
	"math"
	"sync"

	"github.com/switchyard-dev/switchyard/sim/scenario"
)

// Options configures Run.
type Options struct {
	// Policies lists the policies to run, in report order; nil means all.
	Policies []string
	// Seed replaces the scenario's seed when SeedSet.
	Seed    uint64
	SeedSet bool
	// Parallel is how many policies run at once; 0 means 1.
	Parallel int
	// Progress, when set, is called with a policy's name and its progress
	// (0..1) from the goroutine running it.
	Progress func(policy string, done float64)
	// CalibrationRequests is how many requests measure each point of an
	// engine type's true profile; 0 means 20000. Fewer make tests faster
	// and the lower bound noisier.
	CalibrationRequests int
	// Context, when set, stops the runs early when it is done; Run then
	// returns its error.
	Context context.Context
}

// EngineInfo describes one engine of the fleet.
type EngineInfo struct {
	Name        string  `json:"name"`
	Region      string  `json:"region"`
	Type        string  `json:"type"`
	CapacityRPS float64 `json:"capacity_rps"`
}

// Report is the outcome of a scenario: every policy's result on the same
// arrivals, and the fluid lower bound.
type Report struct {
	// Scenario is the scenario's name.
	Scenario string `json:"scenario"`
	// Seed is the seed used.
	Seed uint64 `json:"seed"`
	// Arrivals counts all requests; MeasuredFromS and MeasuredToS bound the
	// arrivals that count in the metrics.
	Arrivals      int     `json:"arrivals"`
	MeasuredFromS float64 `json:"measured_from_s"`
	MeasuredToS   float64 `json:"measured_to_s"`
	// OfferedRPS is the mean arrival rate over the measured period, and
	// OfferedUtilisation that rate over the fleet's nominal capacity.
	OfferedRPS         float64 `json:"offered_rps"`
	OfferedUtilisation float64 `json:"offered_utilisation"`
	// Engines are the fleet's engines, indexed like the time series.
	Engines []EngineInfo `json:"engines"`
	// Profiles are the engine types' calibrated true profiles.
	Profiles []Profile `json:"profiles"`
	// BoundProfiles are the profiles the lower bound uses: measured with a
	// perfect cache when the arrivals name their prompt blocks, else
	// Profiles.
	BoundProfiles []Profile `json:"bound_profiles"`
	// LowerBoundE2EMeanMs is the fluid lower bound on the mean end-to-end latency.
	LowerBoundE2EMeanMs float64    `json:"lower_bound_e2e_mean_ms"`
	LowerBound          LowerBound `json:"lower_bound"`
	// Order lists the policies run, and Policies their results by name.
	Order    []string          `json:"order"`
	Policies map[string]Result `json:"policies"`
}

// Run simulates every requested policy on the scenario's arrivals.
func Run(sc *scenario.Scenario, opts Options) (*Report, error) {
	seed := sc.Seed
	if opts.SeedSet {
		seed = opts.Seed
	}
	names := opts.Policies
	if names == nil {
		names = PolicyNames()
	}
	for _, n := range names {
		if _, err := newPolicy(n, sc); err != nil {
			return nil, err
		}
	}
	arrivals, err := sc.Arrivals(seed)
	if err != nil {
		return nil, err
	}
	if len(arrivals) == 0 {
		return nil, fmt.Errorf("sim: scenario %s generates no requests", sc.Name)
	}
	return RunArrivals(sc, arrivals, names, seed, opts)
}

// RunArrivals is Run on given arrivals (sorted by time).
func RunArrivals(sc *scenario.Scenario, arrivals []scenario.Arrival, names []string, seed uint64, opts Options) (*Report, error) {
	f, err := compile(sc, arrivals[len(arrivals)-1].AtMs)
	if err != nil {
		return nil, err
	}
	mix := arrivals
	if len(mix) > calibMix {
		mix = mix[:calibMix]
	}
	profiles := make([]Profile, len(sc.EngineTypes))
	used := make([]bool, len(sc.EngineTypes))
	for j := range f.engines {
		used[f.engines[j].typeIdx] = true
	}
	for ti := range sc.EngineTypes {
		if !used[ti] {
			profiles[ti] = Profile{Type: sc.EngineTypes[ti].Name}
			continue
		}
		if profiles[ti], err = calibrate(sc, ti, mix, nil, seed, opts.CalibrationRequests); err != nil {
			return nil, err
		}
	}
	boundProfiles := profiles
	if hits := perfectHits(arrivals); hits != nil {
		boundProfiles = make([]Profile, len(profiles))
		for ti := range sc.EngineTypes {
			if !used[ti] {
				boundProfiles[ti] = profiles[ti]
				continue
			}
			if boundProfiles[ti], err = calibrate(sc, ti, mix, hits[:len(mix)], seed, opts.CalibrationRequests); err != nil {
				return nil, err
			}
		}
	}
	rep := &Report{Scenario: sc.Name, Seed: seed, Arrivals: len(arrivals), MeasuredFromS: f.measureFrom / 1000,
		MeasuredToS: f.measureTo / 1000, Profiles: profiles, BoundProfiles: boundProfiles, Order: names, Policies: map[string]Result{}}
	totalCap := 0.0
	var mixPrompt, mixOutput float64
	for i := range mix {
		mixPrompt += float64(mix[i].Prompt)
		mixOutput += float64(mix[i].Output)
	}
	mixPrompt /= float64(len(mix))
	mixOutput /= float64(len(mix))
	for j := range f.engines {
		e := &f.engines[j]
		e.capacity = profiles[e.typeIdx].CapacityRPS
		e.idleMs = profiles[e.typeIdx].IdleMs
		e.mixPrompt, e.mixOutput = mixPrompt, mixOutput
		e.prefillWeight = engineCost(e.typ).PrefillWeight(e.typ.MaxBatch, int(mixPrompt), int(math.Max(mixOutput, 1)))
		totalCap += e.capacity
		rep.Engines = append(rep.Engines, EngineInfo{Name: e.name, Region: e.region, Type: e.typ.Name, CapacityRPS: e.capacity})
	}
	measured := 0
	for i := range arrivals {
		if t := arrivals[i].AtMs; t >= f.measureFrom && t < f.measureTo {
			measured++
		}
	}
	if span := (f.measureTo - f.measureFrom) / 1000; span > 0 {
		rep.OfferedRPS = float64(measured) / span
		rep.OfferedUtilisation = rep.OfferedRPS / totalCap
	}
	if rep.LowerBound, err = lowerBound(f, arrivals, boundProfiles); err != nil {
		return nil, err
	}
	rep.LowerBoundE2EMeanMs = rep.LowerBound.E2EMeanMs

	results := make([]Result, len(names))
	par := max(1, opts.Parallel)
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	for k, name := range names {
		pol, _ := newPolicy(name, sc)
		r := newRun(f, arrivals, pol, seed)
		r.ctx = opts.Context
		if opts.Progress != nil {
			r.progress = func(x float64) { opts.Progress(name, x) }
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			r.simulate(true)
			results[k] = r.m.result(r, name)
			r.reqs = nil
		}()
	}
	wg.Wait()
	if opts.Context != nil && opts.Context.Err() != nil {
		return nil, fmt.Errorf("sim: scenario %s: %w", sc.Name, opts.Context.Err())
	}
	for k, name := range names {
		rep.Policies[name] = results[k]
	}
	return rep, nil
}

// Gap returns how far a policy's mean end-to-end latency is above the lower
// bound, as a fraction (0.02 is 2%).
func (r *Report) Gap(policy string) float64 {
	res, ok := r.Policies[policy]
	if !ok || !(r.LowerBoundE2EMeanMs > 0) {
		return math.NaN()
	}
	return res.E2EMeanMs/r.LowerBoundE2EMeanMs - 1
}
