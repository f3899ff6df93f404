package optimizer

import (
	"math"
	"testing"
)

// TestShareShed: with capacity short, the clusters that can use the same
// engines shed the same fraction of the class being shed, dearer classes
// are served first, and every engine's load stays as the solver left it.
func TestShareShed(t *testing.T) {
	drained := func(p *Problem) { p.Engines[2].Health = 0 } // engine-c drained: 200 of capacity for 250
	cases := []struct {
		name   string
		modify func(*Problem)
		want   map[string][NumPriorities]float64 // shed fraction per cluster and class
	}{
		// The queue profile keeps each engine 0.2% below its capacity (see
		// docs/optimizer.md): 200 of capacity serve 199.6.
		{"drain drill: a fifth each", drained, map[string][NumPriorities]float64{
			"A": {Standard: 50.4 / 250}, "B": {Standard: 50.4 / 250}, "C": {Standard: 50.4 / 250}}},
		{"sheddable first, then in proportion", func(p *Problem) {
			drained(p)
			// 30 req/s of C's demand sheddable: all of it goes, and
			// 20 req/s of standard in proportion (220 standard for 200).
			p.Clusters[2].Demand = [NumPriorities]float64{Standard: 10, Sheddable: 30}
		}, map[string][NumPriorities]float64{
			"A": {Standard: 20.4 / 220}, "B": {Standard: 20.4 / 220}, "C": {Standard: 20.4 / 220, Sheddable: 1}}},
		{"enough capacity: nothing to share", func(*Problem) {}, map[string][NumPriorities]float64{
			"A": {}, "B": {}, "C": {}}},
		// A and B share the 10.4 req/s that engines a and b cannot serve.
		{"C may use engine-c only: it sheds what that cannot serve", func(p *Problem) {
			p.Engines[2].CapacityRPS = 20
			p.Network[2] = []Link{{Engine: 2, Ms: 1}}
		}, map[string][NumPriorities]float64{"A": {Standard: 10.4 / 210}, "B": {Standard: 10.4 / 210}, "C": {Standard: 20.04 / 40}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := caseStudy()
			c.modify(p)
			sol, err := NewSolver(Options{}).Solve(p, nil)
			if err != nil {
				t.Fatal(err)
			}
			loads := make([]float64, len(sol.Engines))
			for j := range sol.Engines {
				loads[j] = sol.Engines[j].LoadRPS
			}
			ShareShed(p, sol)
			perEngine := make([]float64, len(sol.Engines))
			for i, cr := range sol.Clusters {
				for q := range NumPriorities {
					got := 0.0
					if d := p.Clusters[i].Demand[q]; d > 0 {
						got = cr.ShedByPriority[q] / d
					}
					if math.Abs(got-c.want[cr.Name][q]) > 1e-4 {
						t.Errorf("cluster %s class %s: shed %.4f, want %.4f", cr.Name, Priority(q), got, c.want[cr.Name][q])
					}
				}
				sum := cr.ShedFraction
				for k, j := range cr.Engines {
					sum += cr.Weights[k]
					perEngine[j] += cr.FlowsRPS[k]
				}
				if math.Abs(sum-1) > 1e-6 {
					t.Errorf("cluster %s: weights and shed sum to %v", cr.Name, sum)
				}
			}
			for j := range loads {
				if math.Abs(perEngine[j]-loads[j]) > 1e-6 {
					t.Errorf("engine %s: load %v after ShareShed, %v before", sol.Engines[j].Name, perEngine[j], loads[j])
				}
			}
		})
	}
}
