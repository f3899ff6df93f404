package optimizer

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"
)

// randomPointsProblem builds a small random problem with points profiles, random eligibility,
// health and priority split, for the LP cross-check.
func randomPointsProblem(r *rand.Rand) *Problem {
	nc, ne := 1+r.IntN(4), 1+r.IntN(4)
	p := &Problem{}
	for j := 0; j < ne; j++ {
		n := 1 + r.IntN(4)
		pts := make([][2]float64, n)
		for k := range pts {
			pts[k] = [2]float64{r.Float64() * 120, 100 + r.Float64()*1500}
		}
		pp, err := NewPointsProfile(pts)
		if err != nil {
			panic(err)
		}
		h := 1.0
		if r.IntN(3) == 0 {
			h = 0.3 + 0.7*r.Float64()
		}
		p.Engines = append(p.Engines, Engine{Name: "e" + itoa(j), CapacityRPS: 20 + 100*r.Float64(), Health: h, Profile: pp})
	}
	for i := 0; i < nc; i++ {
		var d [NumPriorities]float64
		for q := range d {
			if r.IntN(2) == 0 {
				d[q] = 1 + 80*r.Float64()
			}
		}
		if d[0]+d[1]+d[2] == 0 {
			d[Standard] = 10
		}
		p.Clusters = append(p.Clusters, Cluster{Name: "c" + itoa(i), Demand: d})
		var row []Link
		for j := 0; j < ne; j++ {
			if r.IntN(4) != 0 {
				row = append(row, Link{Engine: j, Ms: 50 * r.Float64()})
			}
		}
		p.Network = append(p.Network, row)
	}
	return p
}

// lpBounds solves, with gonum's Simplex, the problem in which each engine's cost
// F_j(X) = X·L_j(X) is replaced by its piecewise-linear interpolant on a grid that contains
// every breakpoint of L_j. As F_j is convex the interpolant lies above it, so the LP optimum
// is an upper bound on the true optimum; on each grid interval F_j is quadratic with
// F” = 2·L', so the interpolant exceeds F_j by at most L'·h²/4, and subtracting the largest
// such excess of every engine gives a lower bound. The bounds are exact in principle: they
// close as the grid is refined.
func lpBounds(t testing.TB, p *Problem, price [NumPriorities]float64, sub int) (lower, upper float64) {
	var costs []float64
	type entry struct {
		row, col int
		v        float64
	}
	var entries []entry
	var b []float64
	add := func(cost float64) int { costs = append(costs, cost); return len(costs) - 1 }
	nc, ne := len(p.Clusters), len(p.Engines)
	rowCluster := func(i int) int { return i }
	rowClass := func(i, q int) int { return nc + i*NumPriorities + q }
	rowEngine := func(j int) int { return nc + nc*NumPriorities + 2*j }
	rowConv := func(j int) int { return rowEngine(j) + 1 }
	b = make([]float64, nc+nc*NumPriorities+2*ne)
	for i := range p.Clusters {
		b[rowCluster(i)] = p.Clusters[i].TotalDemand()
		for _, l := range p.Network[i] {
			c := add(l.Ms)
			entries = append(entries, entry{rowCluster(i), c, 1}, entry{rowEngine(l.Engine), c, 1})
		}
		for q := 0; q < NumPriorities; q++ {
			if p.Clusters[i].Demand[q] == 0 {
				continue
			}
			s := add(price[q])
			tt := add(0)
			// The class rows get a tiny slack (1e-9 relative) against degeneracy, on which
			// gonum's Simplex can cycle; it loosens the bounds by at most price × 1e-9 × D.
			b[rowClass(i, q)] = p.Clusters[i].Demand[q] * (1 + 1e-9*float64(1+q+i))
			entries = append(entries, entry{rowCluster(i), s, 1}, entry{rowClass(i, q), s, 1}, entry{rowClass(i, q), tt, 1})
		}
	}
	slack := 0.0
	for j := range p.Engines {
		e := &p.Engines[j]
		curve := e.Profile.Curve(e.CapacityRPS, e.Health)
		cp := curve.Capacity()
		b[rowConv(j)] = 1
		grid := []float64{0}
		if cp > 0 {
			for _, pt := range e.Profile.(*PointsProfile).Points {
				if x := pt[0] * e.Health; x > 0 && x < cp {
					grid = append(grid, x)
				}
			}
			grid = append(grid, cp)
			sort.Float64s(grid)
		}
		var fine []float64
		maxExcess := 0.0
		for g := 0; g < len(grid); g++ {
			fine = append(fine, grid[g])
			if g+1 == len(grid) {
				break
			}
			a, c := grid[g], grid[g+1]
			slope := (curve.Latency(c) - curve.Latency(a)) / (c - a)
			if slope <= 0 {
				continue // F is linear here: the chord is exact, and collinear points make Simplex cycle
			}
			for k := 1; k < sub; k++ {
				fine = append(fine, a+(c-a)*float64(k)/float64(sub))
			}
			h := (c - a) / float64(sub)
			maxExcess = math.Max(maxExcess, slope*h*h/4)
		}
		slack += maxExcess
		for _, x := range fine {
			c := add(x * curve.Latency(x))
			entries = append(entries, entry{rowEngine(j), c, -x}, entry{rowConv(j), c, 1})
		}
	}
	// Drop the rows of empty priority classes.
	used := make([]bool, len(b))
	for _, e := range entries {
		used[e.row] = true
	}
	rowMap := make([]int, len(b))
	var b2 []float64
	for r := range b {
		rowMap[r] = len(b2)
		if used[r] {
			b2 = append(b2, b[r])
		}
	}
	A := mat.NewDense(len(b2), len(costs), nil)
	for _, e := range entries {
		A.Set(rowMap[e.row], e.col, A.At(rowMap[e.row], e.col)+e.v)
	}
	b = b2
	opt, _, err := lp.Simplex(costs, A, b, 1e-10, nil)
	if err != nil {
		t.Fatalf("simplex: %v", err)
	}
	return opt - slack, opt
}

func TestLPCrossCheck(t *testing.T) {
	r := rand.New(rand.NewPCG(42, 1))
	// Under -race the first 40 of the same seeded instances: the race detector adds nothing
	// to this single-goroutine code and makes the 220 instances (about 4 s without it) take
	// about 50 s.
	instances := 220
	switch {
	case testing.Short():
		instances = 20
	case raceEnabled:
		instances = 40
	}
	worst, uncertified := 0.0, 0
	for n := 0; n < instances; n++ {
		p := randomPointsProblem(r)
		// The LP is of the latency objective alone: no congestion term.
		opt := Options{MaxSweeps: 2000, Congestion: -1}
		opt.ShedPriceMs = [NumPriorities]float64{Critical: 20000, Standard: 6000, Sheddable: 1500 + 1000*r.Float64()}
		sol, err := NewSolver(opt).Solve(p, nil)
		if err != nil {
			t.Fatalf("instance %d: %v", n, err)
		}
		if !sol.Diagnostics.Converged {
			uncertified++
			t.Logf("instance %d: certificate not closed: relative gap %.3g after %d sweeps", n, sol.Diagnostics.RelGap, sol.Diagnostics.Iterations)
		}
		for j := range sol.Engines {
			if sol.Engines[j].LoadRPS > sol.Engines[j].CapacityRPS*(1+1e-12) {
				t.Errorf("instance %d: engine %d over capacity: %+v", n, j, sol.Engines[j])
			}
		}
		t0 := time.Now()
		lower, upper := lpBounds(t, p, opt.ShedPriceMs, 128)
		if testing.Verbose() && time.Since(t0) > 100*time.Millisecond {
			t.Logf("instance %d: simplex took %v (%d clusters, %d engines)", n, time.Since(t0), len(p.Clusters), len(p.Engines))
		}
		got := sol.Diagnostics.Objective
		rel := math.Abs(got-upper) / math.Max(upper, 1)
		worst = math.Max(worst, rel)
		// Within the sandwich (allowing the tolerance above the upper bound) and within 1e-3
		// of the LP optimum (or of the lower bound when the grid leaves the bounds apart).
		relLower := math.Abs(got-lower) / math.Max(lower, 1)
		certifiedOK := !sol.Diagnostics.Converged || got <= upper*(1+2e-4)+1e-6
		if got < lower-1e-6*math.Abs(lower) || !certifiedOK || math.Min(rel, relLower) > 1e-3 {
			t.Errorf("instance %d: objective %.6f outside LP bounds [%.6f, %.6f] (rel %.2g); gap %.3g", n, got, lower, upper, rel, sol.Diagnostics.RelGap)
		}
	}
	t.Logf("%d instances, worst relative difference from the LP %.3g; %d without a closed certificate", instances, worst, uncertified)
}
