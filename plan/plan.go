// Package plan turns the control plane's state into the optimizer's problem
// for one model and the optimizer's solution into per-cluster weight
// snapshots. It is pure: no NATS, no clock, no I/O. The optimizer service
// calls it with the engine, demand and RTT states it reads from its buckets;
// the simulator calls it with the same messages built from its simulated
// engines and routers, so that what the simulator plans is what ships.
package plan

import (
	"math"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/optimizer"
)

// MaxLatencyMs is the largest latency a snapshot may carry (messages' limit: a day).
const MaxLatencyMs = 24 * 3600 * 1000.0

// Defaults of the planning inputs a caller has no measurement for.
const (
	// DefaultMinDemandRPS is the least demand a cluster is planned for: a
	// cluster with no measured demand yet still gets a route.
	DefaultMinDemandRPS = 1.0
	// DefaultPriorBaseMs is the base latency assumed for an engine that
	// reports no idle latency of its own, until its fit has samples; it
	// only orders engines before any measurement, since an engine's own
	// idle latency, then its fit, replace it.
	DefaultPriorBaseMs = 500.0
)

// Engine is one engine's input to a model's problem.
type Engine struct {
	// Name names the engine.
	Name string
	// CapacityRPS is the engine's capacity at full health, req/s, as its
	// state reports it (messages.EngineState.CapacityRPS).
	CapacityRPS float64
	// Health is the share of the capacity the plan may use, 0..1: the
	// state's health with whatever the caller discounts (penalties, slow
	// start, operator actions). An engine of no usable capacity is left out.
	Health float64
	// BaseMs is the base latency of the engine's queue profile, ms: its
	// latency fit (FitSample, FitPrior), else its prior.
	BaseMs float64
}

// Cluster is one frontend cluster of a model and its measured demand (nil
// when none is measured yet: it is planned for MinDemandRPS).
type Cluster struct {
	Name   string
	Demand *messages.DemandState
}

// Targets are the shares of an engine's capacity the plan fills.
type Targets struct {
	// Common applies to every engine not in PerEngine.
	Common float64
	// PerEngine overrides Common by engine name.
	PerEngine map[string]float64
}

// Of returns the target utilisation of the named engine.
func (t Targets) Of(engine string) float64 {
	if tu, ok := t.PerEngine[engine]; ok {
		return tu
	}
	return t.Common
}

// Input is what one model's problem is built from.
type Input struct {
	Engines  []Engine
	Clusters []Cluster
	// Network returns the network latency a request of a cluster pays on
	// an engine, ms (the round trip the routers measure, or the configured
	// latency), and false when none is known: the engine may then not serve
	// the cluster.
	Network func(cluster, engine string) (float64, bool)
	// Targets scale each engine's capacity in the problem.
	Targets Targets
	// MinDemandRPS is the least demand a cluster is planned for.
	MinDemandRPS float64
}

// Problem builds the optimizer's problem for in: the engines of usable
// capacity (in order) at their target utilisation, and one cluster per
// in.Clusters (in order) with its demand and its links to the engines it
// has a latency for.
func Problem(in Input) *optimizer.Problem {
	p := &optimizer.Problem{}
	for _, e := range in.Engines {
		if !(e.CapacityRPS*e.Health > 0) {
			continue
		}
		p.Engines = append(p.Engines, optimizer.Engine{Name: e.Name, CapacityRPS: e.CapacityRPS * in.Targets.Of(e.Name), Health: e.Health,
			Profile: optimizer.QueueProfile{BaseMs: e.BaseMs}})
	}
	for _, c := range in.Clusters {
		var row []optimizer.Link
		for j := range p.Engines {
			if ms, ok := in.Network(c.Name, p.Engines[j].Name); ok {
				row = append(row, optimizer.Link{Engine: j, Ms: ms})
			}
		}
		p.Clusters = append(p.Clusters, optimizer.Cluster{Name: c.Name, Demand: Demand(c.Demand, in.MinDemandRPS)})
		p.Network = append(p.Network, row)
	}
	return p
}

// Demand returns the demand per priority class to plan for d: its fast
// rates by class, else its fast total rate as standard demand, scaled up
// to at least minRPS in total (standard minRPS when nothing is measured),
// so that a cluster just starting is planned a route.
func Demand(d *messages.DemandState, minRPS float64) [optimizer.NumPriorities]float64 {
	var dem [optimizer.NumPriorities]float64
	if d != nil {
		if len(d.RPSByPriority) > 0 {
			dem[optimizer.Critical] = d.RPSByPriority[messages.PriorityCritical].Fast
			dem[optimizer.Standard] = d.RPSByPriority[messages.PriorityStandard].Fast
			dem[optimizer.Sheddable] = d.RPSByPriority[messages.PrioritySheddable].Fast
		} else {
			dem[optimizer.Standard] = d.RPS.Fast
		}
	}
	total := dem[0] + dem[1] + dem[2]
	switch {
	case !(total > 0):
		dem = [optimizer.NumPriorities]float64{optimizer.Standard: minRPS}
	case total < minRPS:
		for q := range dem {
			dem[q] *= minRPS / total
		}
	}
	return dem
}

// Snapshot renders cluster i of sol, the solution of p, as model's weight
// snapshot, without time, writer, generation or slot table: weights and
// shed fraction summing to 1, each engine's planned utilisation relative to
// the common target (an engine planned to a lower target of its own shows
// its plan as the lower share it is, so that routers comparing planned
// utilisations keep it there), its predicted latency (network plus
// engine-side), and the shed fraction by class when the plan sheds.
func Snapshot(model string, p *optimizer.Problem, sol *optimizer.Solution, i int, t Targets) *messages.WeightSnapshot {
	cr := &sol.Clusters[i]
	snap := &messages.WeightSnapshot{
		Model: model, Cluster: cr.Name,
		Weights:     make(map[string]float64, len(cr.Engines)),
		Utilisation: make(map[string]float64, len(cr.Engines)),
		LatencyMs:   make(map[string]float64, len(cr.Engines)),
		DemandRPS:   cr.DemandRPS,
	}
	shed := clamp01(cr.ShedFraction)
	sum := shed
	for k, j := range cr.Engines {
		w := clamp01(cr.Weights[k])
		if w < 1e-9 {
			w = 0
		}
		name := p.Engines[j].Name
		snap.Weights[name] = w
		sum += w
		er := &sol.Engines[j]
		if u := er.Utilisation * t.Of(name) / t.Common; u >= 0 && !math.IsInf(u, 0) {
			snap.Utilisation[name] = math.Min(u, 1e6)
		}
		if l := p.Network[i][k].Ms + er.LatencyMs; l >= 0 && !math.IsInf(l, 0) {
			snap.LatencyMs[name] = math.Min(l, MaxLatencyMs)
		}
	}
	if sum > 0 {
		for e := range snap.Weights {
			snap.Weights[e] /= sum
		}
		shed /= sum
	} else {
		shed = 1
	}
	snap.ShedFraction = shed
	if cr.ShedRPS > 0 {
		snap.ShedByPriority = map[string]float64{}
		for q := range optimizer.NumPriorities {
			if d := p.Clusters[i].Demand[q]; d > 0 {
				snap.ShedByPriority[optimizer.Priority(q).String()] = clamp01(cr.ShedByPriority[q] / d)
			}
		}
	}
	if g := sol.Diagnostics.RelGap; g >= 0 && !math.IsInf(g, 0) {
		snap.Gap = g
	} else if !(g < 0) {
		snap.Gap = 1 // NaN or +Inf: no certificate
	}
	return snap
}

// Distance returns the total-variation distance between two snapshots' routing
// (weights and shed fraction), and whether shedding started or stopped.
func Distance(a, b *messages.WeightSnapshot) (tv float64, shedFlip bool) {
	for e, w := range a.Weights {
		tv += math.Abs(w - b.Weights[e])
	}
	for e, w := range b.Weights {
		if _, ok := a.Weights[e]; !ok {
			tv += w
		}
	}
	tv += math.Abs(a.ShedFraction - b.ShedFraction)
	const eps = 1e-6
	return tv / 2, (a.ShedFraction > eps) != (b.ShedFraction > eps)
}

// FitSample is the latency-fit sample of one engine state: its slow
// windows, relative to its effective capacity.
func FitSample(st *messages.EngineState) optimizer.Sample {
	return optimizer.Sample{TimeMs: st.Time, LoadRPS: st.LoadRPS.Slow, CapacityRPS: st.CapacityRPS * st.Health,
		TTFTMs: st.TTFTMs.Slow, TBTMs: st.TBTMs.Slow, OutputTokens: st.OutputTokens.Slow}
}

// FitPrior is the base latency an engine's fit starts from: its own
// idle-latency estimate when it reports one, else prior.
func FitPrior(st *messages.EngineState, prior float64) float64 {
	if st.BaseLatencyMs > 0 {
		return st.BaseLatencyMs
	}
	return prior
}

// BaseMs is the base latency to plan engine st with: fit's (nil: none
// yet), else the prior, and never below the engine's own idle latency.
func BaseMs(fit *optimizer.BaseFit, st *messages.EngineState, prior float64) float64 {
	return fit.BaseMs(FitPrior(st, prior), st.BaseLatencyMs)
}

func clamp01(v float64) float64 {
	if !(v > 0) {
		return 0
	}
	return math.Min(v, 1)
}
