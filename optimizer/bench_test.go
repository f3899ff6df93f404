package optimizer

import (
	"fmt"
	"math"
	"testing"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"
)

// perturb returns a copy of p with every cluster's demand changed by ±1% (alternating).
func perturb(p *Problem) *Problem {
	q := *p
	q.Clusters = append([]Cluster(nil), p.Clusters...)
	for i := range q.Clusters {
		f := 1.01
		if i%2 == 1 {
			f = 0.99
		}
		for c := range q.Clusters[i].Demand {
			q.Clusters[i].Demand[c] *= f
		}
	}
	return &q
}

// stepDemand returns p with every cluster's demand moved by 1%: up for the
// clusters of one parity and down for the others, the parity alternating
// with k.
func stepDemand(p *Problem, k int) *Problem {
	q := *p
	q.Clusters = append([]Cluster(nil), p.Clusters...)
	for i := range q.Clusters {
		f := 1.01
		if (i+k)%2 == 1 {
			f = 0.99
		}
		for c := range q.Clusters[i].Demand {
			q.Clusters[i].Demand[c] *= f
		}
	}
	return &q
}

func benchSizes() []struct {
	name         string
	nc, ne, elig int
	load         float64
	split        bool
} {
	return []struct {
		name         string
		nc, ne, elig int
		load         float64
		split        bool
	}{
		{"3x3", 3, 3, 3, 0.8, false},
		{"10x100", 10, 100, 100, 0.7, false},
		{"100x1000", 100, 1000, 1000, 0.7, false},
		{"1000x10000-sparse50", 1000, 10000, 50, 0.7, false},
		// Demand at 150% of capacity: the optimum sheds (the Newton path with the shed
		// modelled, docs/optimizer.md); cold and warm-chain. The split sizes divide
		// each cluster's demand 20% critical, 50% standard, 30% sheddable.
		{"100x1000-overload150", 100, 1000, 1000, 1.5, false},
		{"50x500-overload150-split", 50, 500, 500, 1.5, true},
		{"100x1000-overload150-split", 100, 1000, 1000, 1.5, true},
	}
}

func BenchmarkSolve(b *testing.B) {
	for _, sz := range benchSizes() {
		p := randomProblem(11, sz.nc, sz.ne, sz.elig, sz.load)
		if sz.name == "3x3" {
			p = caseStudy()
		}
		if sz.split {
			p = overloaded(11, sz.nc, sz.ne, sz.load)
		}
		b.Run(sz.name+"/cold", func(b *testing.B) {
			s := NewSolver(DefaultOptions())
			var sol *Solution
			c0, n := cpuTime(), 0
			for b.Loop() {
				var err error
				if sol, err = s.Solve(p, nil); err != nil {
					b.Fatal(err)
				}
				n++
			}
			b.ReportMetric(float64((cpuTime()-c0).Microseconds())/1000/float64(n), "cpu-ms/op")
			b.ReportMetric(float64(sol.Diagnostics.Iterations), "sweeps")
			b.ReportMetric(float64(s.newton.Steps()), "newton-steps")
			b.ReportMetric(sol.Diagnostics.RelGap, "relgap")
			b.ReportMetric(b2f(sol.Diagnostics.OutOfTime), "out-of-time")
			if sz.load > 1 {
				// Overloaded: not required to converge (see docs/optimizer.md), but
				// required to shed by priority across clusters (priority.go): short-rps
				// is how far the traffic served per class falls below the most possible.
				short, totalCap := lexShortfall(p, s.Options(), sol), 0.0
				for _, e := range sol.Engines {
					totalCap += e.CapacityRPS
				}
				b.ReportMetric(short, "short-rps")
				if short > 1e-6*totalCap {
					b.Fatalf("%s cold: the traffic served by class falls %.3g req/s short of the most possible", sz.name, short)
				}
				return
			}
			if !sol.Diagnostics.Converged {
				b.Fatalf("%s cold: relative gap %.3g above the tolerance", sz.name, sol.Diagnostics.RelGap)
			}
		})
		// warm-chain is the service's situation: every solve starts from the
		// previous one's solution, and the demand moves by 1% each time (half
		// the clusters up, half down, alternating), so no solve repeats the
		// problem its predecessor solved.
		b.Run(sz.name+"/warm-chain", func(b *testing.B) {
			s := NewSolver(DefaultOptions())
			prev, err := s.Solve(p, nil)
			if err != nil {
				b.Fatal(err)
			}
			q, k := p, 0
			c0, n := cpuTime(), 0
			worst := 0.0
			for b.Loop() {
				q = stepDemand(q, k)
				k++
				if prev, err = s.Solve(q, prev); err != nil {
					b.Fatal(err)
				}
				n++
				g := prev.Diagnostics.SolveRelGap
				worst = math.Max(worst, g)
				if !(g <= s.Options().Tolerance) {
					b.Fatalf("%s warm-chain step %d: the solve certified a relative gap of %.3g, above the tolerance", sz.name, k, g)
				}
			}
			b.ReportMetric(float64((cpuTime()-c0).Microseconds())/1000/float64(n), "cpu-ms/op")
			b.ReportMetric(worst, "max-solve-relgap")
		})
		if sz.load > 1 {
			continue // overloaded: cold and warm-chain only
		}
		b.Run(sz.name+"/warm", func(b *testing.B) {
			s := NewSolver(DefaultOptions())
			prev, err := s.Solve(p, nil)
			if err != nil {
				b.Fatal(err)
			}
			q := perturb(p)
			var sol *Solution
			c0, n := cpuTime(), 0
			for b.Loop() {
				if sol, err = s.Solve(q, prev); err != nil {
					b.Fatal(err)
				}
				n++
			}
			b.ReportMetric(float64((cpuTime()-c0).Microseconds())/1000/float64(n), "cpu-ms/op")
			// relgap is the gap of the weights returned, after the dead band kept some
			// clusters' previous weights; solve-relgap is what the solve itself certified.
			b.ReportMetric(float64(sol.Diagnostics.Iterations), "sweeps")
			b.ReportMetric(float64(s.newton.Steps()), "newton-steps")
			b.ReportMetric(sol.Diagnostics.RelGap, "relgap")
			b.ReportMetric(sol.Diagnostics.SolveRelGap, "solve-relgap")
			if g := sol.Diagnostics.SolveRelGap; !(g <= s.Options().Tolerance) {
				b.Fatalf("%s warm: the solve certified a relative gap of %.3g, above the tolerance", sz.name, g)
			}
		})
	}
}

// BenchmarkSolveVsSimplex compares the solver with gonum's Simplex on the same 20×50 instance
// with points profiles; the Simplex solves the piecewise-linear version of TestLPCrossCheck.
func BenchmarkSolveVsSimplex(b *testing.B) {
	p := randomProblem(13, 20, 50, 50, 0.7)
	for j := range p.Engines {
		c := p.Engines[j].CapacityRPS
		base := p.Engines[j].Profile.(QueueProfile).BaseMs
		pp, err := NewPointsProfile([][2]float64{{0, base}, {0.5 * c, 1.5 * base}, {0.8 * c, 3 * base}, {c, 8 * base}})
		if err != nil {
			b.Fatal(err)
		}
		p.Engines[j].Profile = pp
	}
	price := DefaultOptions().ShedPriceMs
	b.Run("solver", func(b *testing.B) {
		s := NewSolver(DefaultOptions())
		for b.Loop() {
			if _, err := s.Solve(p, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("gonum-simplex", func(b *testing.B) {
		for b.Loop() {
			lpBounds(b, p, price, 4)
		}
	})
}

var _ = fmt.Sprint
var _ = mat.NewDense
var _ = lp.Simplex

func b2f(v bool) float64 {
	if v {
		return 1
	}
	return 0
}
