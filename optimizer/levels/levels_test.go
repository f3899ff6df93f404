package levels_test

import (
	"testing"

	"github.com/switchyard-dev/switchyard/optimizer/flow/flowtest"
	"github.com/switchyard-dev/switchyard/optimizer/levels"
)

// TestSolveCertified checks that the level solver settles the small cases from a cold start
// at a point the certificate accepts, but for the shed one: from a cold start it does not
// settle where the demand exceeds the capacity, and Solve goes on to the next path.
func TestSolveCertified(t *testing.T) {
	for _, c := range flowtest.Cases() {
		st := c.New(1e-6)
		s := levels.Solver{State: st}
		_, ok := s.Solve(s.Rounds(false))
		if want := c.Name != "shed"; ok != want {
			t.Errorf("%s: settled %v, want %v", c.Name, ok, want)
		}
		if ok {
			flowtest.Check(t, c.Name, st, true)
		}
	}
}
