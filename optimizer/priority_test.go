package optimizer

import (
	"math"
	"testing"
	"time"
)

// maxFlow is a small Dinic max-flow over float capacities, the reference of the priority
// tests (independent of the solver's augmenting paths in priority.go).
type maxFlow struct {
	head, next, to []int
	capa           []float64
	level, it      []int
}

func newMaxFlow(n int) *maxFlow {
	f := &maxFlow{head: make([]int, n), level: make([]int, n), it: make([]int, n)}
	for v := range f.head {
		f.head[v] = -1
	}
	return f
}

func (f *maxFlow) add(u, v int, c float64) {
	f.to = append(f.to, v, u)
	f.capa = append(f.capa, c, 0)
	f.next = append(f.next, f.head[u], f.head[v])
	f.head[u], f.head[v] = len(f.to)-2, len(f.to)-1
}

func (f *maxFlow) bfs(s, t int, eps float64) bool {
	for v := range f.level {
		f.level[v] = -1
	}
	f.level[s] = 0
	q := []int{s}
	for h := 0; h < len(q); h++ {
		for e := f.head[q[h]]; e >= 0; e = f.next[e] {
			if w := f.to[e]; f.capa[e] > eps && f.level[w] < 0 {
				f.level[w] = f.level[q[h]] + 1
				q = append(q, w)
			}
		}
	}
	return f.level[t] >= 0
}

func (f *maxFlow) dfs(v, t int, push, eps float64) float64 {
	if v == t {
		return push
	}
	for ; f.it[v] >= 0; f.it[v] = f.next[f.it[v]] {
		e := f.it[v]
		if w := f.to[e]; f.capa[e] > eps && f.level[w] == f.level[v]+1 {
			if d := f.dfs(w, t, math.Min(push, f.capa[e]), eps); d > 0 {
				f.capa[e] -= d
				f.capa[e^1] += d
				return d
			}
		}
	}
	return 0
}

func (f *maxFlow) run(s, t int, eps float64) float64 {
	total := 0.0
	for f.bfs(s, t, eps) {
		copy(f.it, f.head)
		for {
			d := f.dfs(s, t, math.Inf(1), eps)
			if d <= eps {
				break
			}
			total += d
		}
	}
	return total
}

// classCaps returns, per engine, the load up to which it may serve class q: where its marginal
// cost plus the largest network latency reaches the class's shed price (beyond, serving costs
// more than shedding), at most its hard limit.
func classCaps(p *Problem, opt Options, q Priority) []float64 {
	maxDist := 0.0
	for _, row := range p.Network {
		for _, l := range row {
			maxDist = math.Max(maxDist, l.Ms)
		}
	}
	caps := make([]float64, len(p.Engines))
	for j := range p.Engines {
		e := &p.Engines[j]
		c := e.Profile.Curve(e.CapacityRPS, e.Health)
		if c.Capacity() > 0 {
			x, _ := c.InverseMarginal(opt.ShedPriceMs[q] - maxDist)
			caps[j] = math.Min(math.Max(x, 0), c.Capacity())
		}
	}
	return caps
}

// lexMaxServed returns, per class q, the most traffic of class q and the dearer classes that
// any routing can serve with every engine loaded at most to classCaps(q): a max-flow from the
// clusters' demand of those classes to the engines.
func lexMaxServed(p *Problem, opt Options) [NumPriorities]float64 {
	var out [NumPriorities]float64
	nc, ne := len(p.Clusters), len(p.Engines)
	for q := Critical; q <= Sheddable; q++ {
		caps := classCaps(p, opt, q)
		f := newMaxFlow(nc + ne + 2)
		src, sink := nc+ne, nc+ne+1
		for i := range p.Clusters {
			c := 0.0
			for r := Critical; r <= q; r++ {
				c += p.Clusters[i].Demand[r]
			}
			f.add(src, i, c)
			for _, l := range p.Network[i] {
				f.add(i, nc+l.Engine, math.Inf(1))
			}
		}
		for j := range caps {
			f.add(nc+j, sink, caps[j])
		}
		out[q] = f.run(src, sink, 1e-12)
	}
	return out
}

// servedByClass returns, per class q, the traffic sol serves of class q and the dearer ones.
func servedByClass(p *Problem, sol *Solution) [NumPriorities]float64 {
	var served [NumPriorities]float64
	for i, c := range sol.Clusters {
		for q := Critical; q <= Sheddable; q++ {
			cum, shed := 0.0, 0.0
			for r := Critical; r <= q; r++ {
				cum += p.Clusters[i].Demand[r]
				shed += c.ShedByPriority[r]
			}
			served[q] += cum - shed
		}
	}
	return served
}

// lexShortfall returns the largest amount, over the classes q, by which the traffic sol serves
// of class q and the dearer ones falls short of lexMaxServed (0 when it does not).
func lexShortfall(p *Problem, opt Options, sol *Solution) float64 {
	ref, served := lexMaxServed(p, opt), servedByClass(p, sol)
	short := 0.0
	for q := range ref {
		short = math.Max(short, ref[q]-served[q])
	}
	return short
}

// checkPriority checks that sol sheds by priority across clusters: the traffic served of each
// class and the dearer ones is at least what lexMaxServed allows (less a relative 1e-6 of the
// capacity), and no cluster sheds a class while an engine it may use has room for that class
// or serves a cheaper class of some cluster (to 1e-6 of the engine's capacity). It returns the
// number of violations reported.
func checkPriority(t *testing.T, name string, p *Problem, opt Options, sol *Solution) int {
	t.Helper()
	bad := 0
	ref := lexMaxServed(p, opt)
	totalCap := 0.0
	for _, e := range sol.Engines {
		totalCap += e.CapacityRPS
	}
	served := servedByClass(p, sol)
	// cheaper[i][q]: cluster i serves traffic of a class cheaper than q.
	cheaper := make([][NumPriorities]bool, len(p.Clusters))
	for i, c := range sol.Clusters {
		for q := Critical; q <= Sheddable; q++ {
			cum := 0.0
			for r := Critical; r <= q; r++ {
				cum += p.Clusters[i].Demand[r]
			}
			cheaper[i][q] = c.DemandRPS-c.ShedRPS > cum+1e-6*c.DemandRPS
		}
	}
	for q := Critical; q <= Sheddable; q++ {
		if served[q] < ref[q]-1e-6*totalCap {
			bad++
			t.Errorf("%s: served %.6f req/s of %s and dearer classes, the most possible is %.6f", name, served[q], q, ref[q])
		}
	}
	for q := Critical; q <= Sheddable; q++ {
		caps := classCaps(p, opt, q)
		// cheapUser[j]: engine j serves a cluster that serves a class cheaper than q.
		cheapUser := make([]bool, len(p.Engines))
		for i, c := range sol.Clusters {
			if !cheaper[i][q] {
				continue
			}
			for k, j := range c.Engines {
				if c.FlowsRPS[k] > 1e-6*sol.Engines[j].CapacityRPS {
					cheapUser[j] = true
				}
			}
		}
		for _, c := range sol.Clusters {
			if c.ShedByPriority[q] <= 1e-6*c.DemandRPS {
				continue
			}
			for _, j := range c.Engines {
				e := &sol.Engines[j]
				room := caps[j] - e.LoadRPS
				if room > 1e-6*e.CapacityRPS || cheapUser[j] {
					bad++
					t.Errorf("%s: cluster %s sheds %.6f req/s of %s while engine %s has %.6f req/s of room for it (cheaper users: %v)",
						name, c.Name, c.ShedByPriority[q], q, e.Name, room, cheapUser[j])
					break
				}
			}
			if bad > 20 {
				t.Fatalf("%s: too many violations", name)
			}
		}
	}
	return bad
}

// TestPriorityAcrossClustersUnderBudget: large overloaded problems split by priority, solved
// under a 50 ms time budget (far too short to converge), return points that shed by priority
// across clusters: served traffic per class lexicographically maximal, no cluster shedding a
// class that an engine it may use could serve instead of a cheaper one.
func TestPriorityAcrossClustersUnderBudget(t *testing.T) {
	for _, tc := range []struct {
		seed   uint64
		nc, ne int
		load   float64
		elig   int
	}{
		{7, 50, 500, 1.5, 500},
		{8, 100, 1000, 1.5, 1000},
		{9, 100, 1000, 1.2, 40},
		{10, 60, 300, 2.0, 300},
	} {
		p := randomProblem(tc.seed, tc.nc, tc.ne, tc.elig, tc.load)
		// Uneven splits, so that clusters differ in what they may shed.
		for i := range p.Clusters {
			d := p.Clusters[i].Demand[Standard]
			f := float64(i%5) / 10 // critical share 0..0.4
			p.Clusters[i].Demand = [NumPriorities]float64{Critical: f * d, Standard: (0.9 - f) * d, Sheddable: 0.1 * d}
		}
		opt := DefaultOptions()
		opt.TimeBudget = 50 * time.Millisecond
		sol := solve(t, p, nil, opt)
		name := itoa(tc.nc) + "x" + itoa(tc.ne) + "-load" + itoa(int(100*tc.load))
		t.Logf("%s: rel gap %.3g, out of time %v, sweeps %d, shed %.1f", name, sol.Diagnostics.RelGap, sol.Diagnostics.OutOfTime, sol.Diagnostics.Iterations, sol.ShedRPS)
		checkPriority(t, name, p, opt, sol)
		// Warm from that point after a 1% change of demand: the dead band keeps the previous
		// weights of clusters that moved little, which must not undo the order.
		q := perturb(p)
		warm := solve(t, q, sol, opt)
		t.Logf("%s warm: rel gap %.3g, out of time %v, notes %q", name, warm.Diagnostics.RelGap, warm.Diagnostics.OutOfTime, warm.Diagnostics.Notes)
		checkPriority(t, name+" warm", q, opt, warm)
	}
}
