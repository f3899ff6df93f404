package optimizer

import (
	_ "strings"
	"testing"
	"time"
)

func TestNewtonDbg2(t *testing.T) {
	for _, sz := range benchSizes()[:3] {
		p := randomProblem(11, sz.nc, sz.ne, sz.elig, sz.load)
		if sz.name == "3x3" {
			p = caseStudy()
		}
		s := NewSolver(DefaultOptions())
		s.setup(p)
		s.warm(p, nil)
		t0 := time.Now()
		ok := s.newtonSolve()
		t.Logf("%s cold ok=%v %v relgap %.3g steps %d evals %d", sz.name, ok, time.Since(t0), s.newt.m.relGap, s.newt.steps, s.newt.evals)
		prev := s.solution(p, "x", nil)
		q := perturb(p)
		s.newt.steps, s.newt.evals = 0, 0
		s.setup(q)
		s.warm(q, prev)
		t0 = time.Now()
		ok = s.newtonSolve()
		t.Logf("%s warm ok=%v %v relgap %.3g steps %d evals %d", sz.name, ok, time.Since(t0), s.newt.m.relGap, s.newt.steps, s.newt.evals)
	}
}
