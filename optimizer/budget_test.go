package optimizer

import (
	"math"
	"strings"
	"testing"
	"time"
)

// overloaded returns randomProblem(seed, nc, ne, ne, load) with each cluster's demand split
// 20% critical, 50% standard, 30% sheddable.
func overloaded(seed uint64, nc, ne int, load float64) *Problem {
	p := randomProblem(seed, nc, ne, ne, load)
	for i := range p.Clusters {
		d := p.Clusters[i].Demand[Standard]
		p.Clusters[i].Demand = [NumPriorities]float64{Critical: 0.2 * d, Standard: 0.5 * d, Sheddable: 0.3 * d}
	}
	return p
}

// TestTimeBudgetOverloaded: a large overloaded problem, which the solver does not settle
// quickly (docs/optimizer.md), stops at its time budget with a feasible point, the gap
// certified for it and a note; the shed covers the excess and goes by priority, within each
// cluster and across clusters.
func TestTimeBudgetOverloaded(t *testing.T) {
	p := overloaded(7, 50, 500, 1.5)
	opt := DefaultOptions()
	opt.TimeBudget = 300 * time.Millisecond
	t0 := time.Now()
	sol := solve(t, p, nil, opt)
	took := time.Since(t0)
	d := sol.Diagnostics
	t.Logf("took %v, rel gap %.3g, sweeps %d, out of time %v, shed %.1f", took, d.RelGap, d.Iterations, d.OutOfTime, sol.ShedRPS)
	// One sweep always runs after the budget's first half; under -race on a loaded machine it
	// can take a while, hence the slack.
	if took > opt.TimeBudget+3*time.Second {
		t.Errorf("solve took %v with a budget of %v", took, opt.TimeBudget)
	}
	if !d.Converged && !d.OutOfTime {
		t.Fatalf("neither converged nor out of time: %+v", d)
	}
	if d.OutOfTime {
		found := false
		for _, n := range d.Notes {
			found = found || strings.Contains(n, "time budget")
		}
		if !found {
			t.Errorf("out of time without a note: %q", d.Notes)
		}
	}
	if !(d.RelGap >= 0) || math.IsInf(d.RelGap, 0) {
		t.Errorf("relative gap %v not certified", d.RelGap)
	}
	totalCap, totalDemand := 0.0, 0.0
	for _, e := range sol.Engines {
		totalCap += e.CapacityRPS
		if e.LoadRPS > e.CapacityRPS*(1+1e-9) {
			t.Errorf("engine %s: load %g above capacity %g", e.Name, e.LoadRPS, e.CapacityRPS)
		}
	}
	var shed [NumPriorities]float64
	for i, c := range sol.Clusters {
		totalDemand += c.DemandRPS
		sum := c.ShedFraction
		for _, w := range c.Weights {
			sum += w
		}
		if math.Abs(sum-1) > 1e-9 {
			t.Errorf("cluster %s: weights and shed sum to %g", c.Name, sum)
		}
		dem := p.Clusters[i].Demand
		// Within a cluster: sheddable before standard before critical.
		if c.ShedByPriority[Standard] > 1e-9 && c.ShedByPriority[Sheddable] < dem[Sheddable]*(1-1e-9) {
			t.Errorf("cluster %s sheds standard %g before all sheddable (%g of %g)", c.Name, c.ShedByPriority[Standard], c.ShedByPriority[Sheddable], dem[Sheddable])
		}
		if c.ShedByPriority[Critical] > 1e-9 && c.ShedByPriority[Standard] < dem[Standard]*(1-1e-9) {
			t.Errorf("cluster %s sheds critical %g before all standard", c.Name, c.ShedByPriority[Critical])
		}
		for q := range shed {
			shed[q] += c.ShedByPriority[q]
		}
	}
	excess := totalDemand - totalCap
	if sol.ShedRPS < excess-1e-6 || sol.ShedRPS > excess+0.01*totalCap {
		t.Errorf("shed %g, excess %g (capacity %g)", sol.ShedRPS, excess, totalCap)
	}
	// Across clusters too, whatever point the budget stopped at (priority.go).
	checkPriority(t, "50x500-load150", p, opt, sol)
	t.Logf("shed by priority %v, sheddable demand %g", shed, 0.3*totalDemand)
}

// TestOverloadedConverges: problems whose optimum sheds a third of the demand solve to the
// tolerance (the cycle canceller's shed edges, cycles.go), shed the excess and shed by
// priority across clusters: all sheddable traffic before any standard, no critical.
func TestOverloadedConverges(t *testing.T) {
	for _, split := range []bool{false, true} {
		// 20×200 split by priority takes about 0.4 s (9 s under -race): 12×120 instead.
		p := randomProblem(7, 20, 200, 200, 1.5)
		if split {
			p = overloaded(7, 12, 120, 1.5)
		}
		// No time budget: under -race on a shared machine the solve can take longer than
		// the default; this test is about the point, TestTimeBudgetOverloaded about time.
		opt := DefaultOptions()
		opt.TimeBudget = -1
		sol := solve(t, p, nil, opt)
		d := sol.Diagnostics
		if !d.Converged || d.OutOfTime {
			t.Fatalf("split %v: relative gap %.3g, out of time %v, notes %q", split, d.RelGap, d.OutOfTime, d.Notes)
		}
		totalCap, totalDemand := 0.0, 0.0
		var shed, dem [NumPriorities]float64
		for _, e := range sol.Engines {
			totalCap += e.CapacityRPS
		}
		for i, c := range sol.Clusters {
			totalDemand += c.DemandRPS
			for q := range shed {
				shed[q] += c.ShedByPriority[q]
				dem[q] += p.Clusters[i].Demand[q]
			}
		}
		// Queue profiles stop where the marginal cost reaches the shed price: within 0.3%
		// of capacity (as in TestShedByPriority).
		excess := totalDemand - totalCap
		if sol.ShedRPS < excess-1e-6 || sol.ShedRPS > excess+0.003*totalCap {
			t.Errorf("split %v: shed %g, excess %g", split, sol.ShedRPS, excess)
		}
		if shed[Critical] > 1e-6 {
			t.Errorf("split %v: critical shed %g", split, shed[Critical])
		}
		if split && shed[Sheddable] < dem[Sheddable]*(1-1e-6) {
			t.Errorf("split %v: sheddable shed %g of %g while standard shed %g", split, shed[Sheddable], dem[Sheddable], shed[Standard])
		}
	}
}
