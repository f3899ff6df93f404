package flow_test

import (
	"math"
	"testing"

	"github.com/switchyard-dev/switchyard/optimizer/flow/flowtest"
)

// TestUpdateClusterCertified checks that one cluster's equilibration is its optimum, that
// the certificate says so, and that what does not fit is shed.
func TestUpdateClusterCertified(t *testing.T) {
	for _, c := range []struct {
		name   string
		demand float64
		curves []flowtest.Linear
		flows  []float64
		shed   float64
	}{
		// Equal marginal costs: 10 + 2·x1 = 20 + 2·x2 with x1 + x2 = 30.
		{"interior", 30, []flowtest.Linear{{A: 10, B: 1, Cap: 100}, {A: 20, B: 1, Cap: 100}}, []float64{17.5, 12.5}, 0},
		{"one engine idle", 4, []flowtest.Linear{{A: 10, B: 1, Cap: 100}, {A: 20, B: 1, Cap: 100}}, []float64{4, 0}, 0},
		{"limit binds", 30, []flowtest.Linear{{A: 10, B: 1, Cap: 10}, {A: 20, B: 1, Cap: 100}}, []float64{10, 20}, 0},
		{"shed", 150, []flowtest.Linear{{A: 10, B: 1, Cap: 50}, {A: 20, B: 1, Cap: 60}}, []float64{50, 60}, 40},
	} {
		s := flowtest.NewState(1e-9, []float64{c.demand}, [][]float64{make([]float64, len(c.curves))}, c.curves)
		s.UpdateCluster(0)
		for k, want := range c.flows {
			if math.Abs(s.Flow[k]-want) > 1e-9*c.demand {
				t.Errorf("%s: flow %d = %.12g, want %.12g", c.name, k, s.Flow[k], want)
			}
		}
		if math.Abs(s.Shed[0]-c.shed) > 1e-9*c.demand {
			t.Errorf("%s: shed %.12g, want %.12g", c.name, s.Shed[0], c.shed)
		}
		if v := flowtest.Conserved(s); v > 1e-9*c.demand {
			t.Errorf("%s: bookkeeping off by %g req/s", c.name, v)
		}
		if m := s.Measure(true); !(m.RelGap <= 1e-9) {
			t.Errorf("%s: relative gap %g at the optimum", c.name, m.RelGap)
		}
	}
}
