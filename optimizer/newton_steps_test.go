package optimizer

import "testing"

// TestNewtonStagesDoNotSwing solves sparse problems on which the Newton path's line search
// once accepted steps that lowered the dual because the largest unmet demand fell: a stage
// then swung between two points until its step budget ran out, and the continuation retried
// it with smaller falls (121–133 steps on these seeds, 67–79 without the swing). The solves
// must certify their gap, and the path must not spend the swing's steps again.
func TestNewtonStagesDoNotSwing(t *testing.T) {
	for _, seed := range []uint64{1, 2, 4} {
		p := randomProblem(seed, 100, 1000, 50, 0.7)
		o := DefaultOptions()
		o.TimeBudget = -1 // a loaded host must not cut the solve short
		s := NewSolver(o)
		sol, err := s.Solve(p, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !sol.Diagnostics.Converged {
			t.Fatalf("seed %d: relative gap %.3g above the tolerance", seed, sol.Diagnostics.RelGap)
		}
		if steps := s.newton.Steps(); steps > 100 {
			t.Errorf("seed %d: %d Newton steps, want at most 100 (a stage swings)", seed, steps)
		}
	}
}
