package optimizer

import (
	"testing"
	"time"
)

func TestNewtonDbg3(t *testing.T) {
	sz := benchSizes()[3]
	p := randomProblem(11, sz.nc, sz.ne, sz.elig, sz.load)
	s := NewSolver(DefaultOptions())
	s.setup(p)
	s.warm(p, nil)
	t0 := time.Now()
	ok := s.newtonSolve()
	t.Logf("%s cold ok=%v %v relgap %.3g steps %d evals %d", sz.name, ok, time.Since(t0), s.newt.m.relGap, s.newt.steps, s.newt.evals)
	// component sizes
	big := 0
	for r := range s.newt.cstart[:len(s.newt.cstart)-1] {
		big = max(big, s.newt.cstart[r+1]-s.newt.cstart[r])
	}
	t.Logf("largest component %d", big)

}
