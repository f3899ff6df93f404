package auction_test

import (
	"testing"

	"github.com/switchyard-dev/switchyard/optimizer/auction"
	"github.com/switchyard-dev/switchyard/optimizer/flow/flowtest"
)

// TestSolve checks that the auction leaves a consistent point on the small cases, certified
// when it says so, and that Restore brings back what Save kept.
func TestSolve(t *testing.T) {
	for _, c := range flowtest.Cases() {
		st := c.New(1e-6)
		s := auction.Solver{State: st}
		bids, ok := s.Solve()
		if bids == 0 && !ok {
			t.Errorf("%s: no bid and no point", c.Name)
		}
		flowtest.Check(t, c.Name, st, ok)
		s.Save()
		flows := append([]float64(nil), st.Flow...)
		clear(st.Flow)
		s.Restore()
		for k := range flows {
			if st.Flow[k] != flows[k] {
				t.Errorf("%s: flow %d restored as %g, saved %g", c.Name, k, st.Flow[k], flows[k])
			}
		}
		flowtest.Check(t, c.Name+" restored", st, false)
	}
}
