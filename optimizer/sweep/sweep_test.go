package sweep_test

import (
	"testing"

	"github.com/switchyard-dev/switchyard/optimizer/flow/flowtest"
	"github.com/switchyard-dev/switchyard/optimizer/sweep"
)

// TestRunCertified checks that the sweeps alone, from nothing routed, reach a point the
// certificate accepts on the small cases.
func TestRunCertified(t *testing.T) {
	for _, c := range flowtest.Cases() {
		st := c.New(1e-6)
		s := sweep.Solver{State: st}
		n, m := s.Run(nil)
		if n == 0 {
			t.Errorf("%s: no sweep from nothing routed", c.Name)
		}
		if !(m.RelGap <= st.Opt.Tolerance) {
			t.Errorf("%s: relative gap %g after %d sweeps", c.Name, m.RelGap, n)
		}
		flowtest.Check(t, c.Name, st, true)
	}
}
