package newton_test

import (
	"testing"

	"github.com/switchyard-dev/switchyard/optimizer/flow/flowtest"
	"github.com/switchyard-dev/switchyard/optimizer/newton"
)

// TestSolveCertified checks that the Newton path solves the small cases without a binding
// limit from a cold start, and that its certificate is the state's. Where a hard limit binds
// or the demand exceeds the capacity of these few engines it gives up, and Solve goes on to
// the next path.
func TestSolveCertified(t *testing.T) {
	settles := map[string]bool{"interior": true, "partial network": true}
	for _, c := range flowtest.Cases() {
		st := c.New(1e-6)
		s := newton.Solver{State: st}
		ok := s.Solve(true)
		if ok != settles[c.Name] {
			t.Errorf("%s: settled %v, want %v (partial %v)", c.Name, ok, settles[c.Name], s.Partial())
		}
		if !ok {
			continue
		}
		if s.Steps() == 0 {
			t.Errorf("%s: settled in no step", c.Name)
		}
		if got := st.Measure(true).RelGap; got != s.Cert().RelGap {
			t.Errorf("%s: certificate %g, the state's %g", c.Name, s.Cert().RelGap, got)
		}
		flowtest.Check(t, c.Name, st, true)
	}
}
