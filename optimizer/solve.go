package optimizer

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Options configures the solver. DefaultOptions returns the recommended values.
type Options struct {
	// Tolerance is the target relative optimality gap (see Diagnostics.RelGap); 0 means 1e-4.
	Tolerance float64
	// MaxSweeps bounds the number of passes over all clusters; 0 means 5000.
	MaxSweeps int
	// ShedPriceMs is the cost in ms of shedding one req/s of each priority class, indexed by
	// Priority. It should be far above any latency and fall with priority. Zero entries take
	// the defaults (critical 1e9, standard 1e8, sheddable 1e7).
	ShedPriceMs [NumPriorities]float64
	// ProximalMs is the anti-churn price: moving one req/s of a cluster's traffic away from the
	// previous solution's flow to an engine costs this many ms (an L1 proximal term). 0 disables.
	ProximalMs float64
	// DeadBand keeps a cluster's previous weights when the new ones differ from them by less
	// than this total-variation distance (0..1). 0 disables.
	DeadBand float64
	// TimeBudget bounds the wall time of one Solve; 0 means DefaultTimeBudget and a negative
	// value disables the bound. The fast paths (Newton, level solver, auction) stop at half of
	// it, and the sweeps stop when it has run out (after at least one sweep): the solution is
	// then the feasible point reached, with the gap certified for it, Diagnostics.OutOfTime set
	// and a note saying so. A large overloaded problem can otherwise take minutes (see
	// docs/optimizer.md).
	TimeBudget time.Duration
}

// DefaultTimeBudget is the time budget of a solve when Options.TimeBudget is 0.
const DefaultTimeBudget = 2 * time.Second

// DefaultOptions returns the recommended options: tolerance 1e-4, a proximal price of 1 ms per
// req/s moved and a dead band of 0.01.
func DefaultOptions() Options {
	return Options{
		Tolerance:   1e-4,
		MaxSweeps:   5000,
		ShedPriceMs: defaultShedPrice,
		ProximalMs:  1,
		DeadBand:    0.01,
		TimeBudget:  DefaultTimeBudget,
	}
}

var defaultShedPrice = [NumPriorities]float64{Critical: 1e9, Standard: 1e8, Sheddable: 1e7}

func (o Options) withDefaults() Options {
	if !(o.Tolerance > 0) {
		o.Tolerance = 1e-4
	}
	if o.MaxSweeps <= 0 {
		o.MaxSweeps = 5000
	}
	for q := range o.ShedPriceMs {
		if !(o.ShedPriceMs[q] > 0) || math.IsInf(o.ShedPriceMs[q], 0) {
			o.ShedPriceMs[q] = defaultShedPrice[q]
		}
	}
	if !(o.ProximalMs > 0) || math.IsInf(o.ProximalMs, 0) {
		o.ProximalMs = 0
	}
	if !(o.DeadBand > 0) {
		o.DeadBand = 0
	}
	if o.TimeBudget == 0 {
		o.TimeBudget = DefaultTimeBudget
	}
	return o
}

// Solver solves problems with block-coordinate equilibration (see docs/optimizer.md). It reuses
// its buffers between calls, so a Solver must not be used by several goroutines at once; use one
// Solver per goroutine.
type Solver struct {
	opt         Options
	equilibrium bool // least-latency: equalise average, not marginal, latency

	order [NumPriorities]int // priority classes by ascending shed price

	// per cluster
	start  []int
	demand []float64
	mu     []float64
	shed   []float64
	anchor []bool // cluster has a previous solution to stay close to
	// per edge (CSR over the network rows)
	eng             []int32
	dist, x, x0, xo []float64
	room, thr, dx   []float64
	// per engine
	curves             []Curve
	capv, X, lam, fp   []float64
	lat, capMarg, bidv []float64

	offers []offer
	p      *Problem
	auc    auctionState
	dual   dualState
	newt   newtonState
	prio   prioState

	// links counts the changes of the network rows' engines seen by setup, and dists those of
	// the rows' engines or latencies (views built from the rows record the counts they were
	// built at).
	links, dists uint64

	bfDist         []float64
	bfPred, bfMark []int
	cycle          []int
	saved          []float64
	users          []int
	bidHi, lamHi   []float64
	gj, gmin       []float64 // per engine, in gapWith
	dev, anc       []float64 // per cluster, from gapWith
	keep           []bool    // per cluster, in deadBand
	dbLim          []float64 // per engine, in deadBand
	// rows holds the engine lists of the solutions' clusters, built at the links count
	// rowsLinks and shared by the solutions (read-only) while the network rows stay the same.
	rows      []int
	rowsLinks uint64
	// out, when set, is the solution that gapWith writes the clusters' routing into (rowOut);
	// served and costs hold each cluster's served traffic and latency cost for it.
	out           *Solution
	served, costs []float64

	// fastEnd and end are the deadlines of the fast paths and of the whole solve (zero: none);
	// outOfTime records that one of them was reached.
	fastEnd, end time.Time
	outOfTime    bool
}

type offer struct{ price, amount float64 }

// NewSolver returns a solver with the given options (zero fields take their defaults as
// documented on Options).
func NewSolver(opt Options) *Solver {
	return &Solver{opt: opt.withDefaults()}
}

// Options returns the solver's effective options.
func (s *Solver) Options() Options { return s.opt }

// growRaw returns b resized to n elements without clearing them, reallocating when its
// capacity is short; for buffers that the caller overwrites entirely.
func growRaw[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

// grow returns b resized to n zeroed elements, reallocating when its capacity is short.
func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	b = b[:n]
	clear(b)
	return b
}

func (s *Solver) cost(j int, x float64) float64 {
	if s.equilibrium {
		return s.curves[j].Latency(x)
	}
	return s.curves[j].Marginal(x)
}

func (s *Solver) inv(j int, m float64) (float64, float64) {
	if s.equilibrium {
		return s.curves[j].InverseLatency(m)
	}
	return s.curves[j].InverseMarginal(m)
}

// Solve solves p, warm-starting from prev (which may be nil, or the solution of a different
// but related problem: clusters and engines are matched by name). The returned solution's
// weights are deterministic functions of p, prev and the options.
func (s *Solver) Solve(p *Problem, prev *Solution) (*Solution, error) {
	t0 := time.Now()
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("optimizer: invalid problem: %w", err)
	}
	s.fastEnd, s.end, s.outOfTime = time.Time{}, time.Time{}, false
	if b := s.opt.TimeBudget; b > 0 {
		s.fastEnd, s.end = t0.Add(b/2), t0.Add(b)
	}
	s.setup(p)
	// Problems above levelsFirstClusters clusters take the Newton path first, which needs no
	// warm-started flows.
	newtonFirst := !s.equilibrium && len(p.Clusters) > levelsFirstClusters
	s.warm(p, prev, !newtonFirst)
	var notes []string
	for j := range p.Engines {
		if pp, ok := p.Engines[j].Profile.(*PointsProfile); ok {
			for _, n := range pp.Notes {
				notes = append(notes, fmt.Sprintf("engine %s: %s", p.Engines[j].Name, n))
			}
		}
	}
	var first *measures // the certificate of the fast path's point, when it computed one
	path := ""          // the fast path whose point the sweeps start from
	if !s.equilibrium {
		// On small problems the level solver from the previous levels (warm) or from a common
		// level (cold) settles in a few rounds, exactly. On larger ones, and when it does not
		// settle, the Newton path (newton.go) solves the problem and certifies its point (when
		// the optimum sheds, with the shed modelled; when that point's certificate does not
		// close, the sweeps go on from it); when that fails, the level solver runs (if it has
		// not yet), and when it does not settle, the auction finds better starting levels and
		// the level solver runs again from them. If that fails too, the sweeps start from the auction's routing.
		ok, levels := false, !newtonFirst
		rounds, bids := 0, 0
		if levels {
			rounds, ok = s.dualSolve(s.dualRounds(p, prev != nil))
			path = PathLevels
		}
		if !ok {
			if levels {
				s.setup(p)
				s.warm(p, prev, false)
			}
			// The shed mode only where the Newton path comes first: on small problems the
			// sweeps settle overloaded problems in well under a second too, and the points of
			// the two paths, both within the tolerance, differ (the simulator's region-outage
			// scenario, 3 clusters, had its TTFT p99 go from 56 to 147 ms).
			if ok = s.newtonSolve(!levels); ok {
				first = &s.newt.m
			}
			path = PathNewton
			if s.newt.partial {
				// The Newton path with the shed modelled settled but did not close its
				// certificate (at levels of shed prices the flows it reads off the levels
				// are exact only to about 1e-8/ε req/s, and the latencies are steep there):
				// the sweeps go on from its point, and one usually closes the gap.
				ok = true
				notes = append(notes, fmt.Sprintf("Newton path with shedding: relative gap %.3g after %d steps; sweeps from its point", s.newt.m.relGap, s.newt.steps))
			}
		}
		if !ok && !levels {
			s.setup(p)
			s.warm(p, prev, true)
			rounds, ok = s.dualSolve(s.dualRounds(p, prev != nil))
			path = PathLevels
		}
		if !ok && s.outOfTime {
			// The fast paths used up their half of the time budget: the sweeps start from
			// the previous solution's flows (or from zero) and use the rest.
			s.setup(p)
			s.warm(p, prev, true)
			notes = append(notes, fmt.Sprintf("fast path (levels: %d rounds) ran out of its half of the time budget; sweeps from the previous solution or from zero", rounds))
		}
		if !ok && !s.outOfTime {
			s.setup(p)
			s.warm(p, prev, true)
			path = PathAuction
			if bids, ok = s.auctionSolve(); !ok {
				s.auctionSave()
				var r int
				r, ok = s.dualSolve(s.dualRounds(p, true))
				rounds += r
				if !ok {
					s.auctionRestore()
				}
			}
		}
		if !ok && !s.outOfTime {
			notes = append(notes, fmt.Sprintf("fast path (levels: %d rounds, auction: %d bids) did not balance; solved by sweeps from the auction's routing", rounds, bids))
		}
	}
	sweeps, m := s.iterate(p, first)
	switch {
	case path == "":
		path = PathSweeps
	case sweeps > 0:
		path += "+" + PathSweeps
	}
	if m.relGap > s.opt.Tolerance {
		notes = append(notes, fmt.Sprintf("relative gap %.3g above tolerance %.3g after %d sweeps", m.relGap, s.opt.Tolerance, sweeps))
	}
	if s.outOfTime {
		notes = append(notes, fmt.Sprintf("time budget %v ran out after %d sweeps: returning the feasible point reached (relative gap %.3g certified)", s.opt.TimeBudget, sweeps, m.relGap))
	}
	solveRelGap := m.relGap
	kept := s.deadBand(p, prev)
	if kept > 0 && !s.equilibrium {
		// Previous weights kept for a changed demand may shed by priority no longer.
		s.enforcePriority()
	}
	sol := s.newSolution(p, "optimal")
	if kept > 0 {
		// The certificate of the weights returned, and their routing written in the same
		// pass over the links.
		s.out = sol
		m = s.measure(false)
		s.out = nil
		notes = append(notes, fmt.Sprintf("dead band %.3g: kept the previous weights of %d clusters", s.opt.DeadBand, kept))
	} else {
		for i := range p.Clusters {
			s.rowOut(sol, i)
		}
	}
	s.finishSolution(sol, notes)
	sol.Diagnostics.Objective = m.objective
	sol.Diagnostics.Gap = m.gap
	sol.Diagnostics.RelGap = m.relGap
	sol.Diagnostics.SolveRelGap = solveRelGap
	sol.Diagnostics.Iterations = sweeps
	sol.Diagnostics.Path = path
	sol.Diagnostics.Converged = m.relGap <= s.opt.Tolerance
	sol.Diagnostics.OutOfTime = s.outOfTime
	sol.Diagnostics.Duration = time.Since(t0)
	return sol, nil
}

// levelsFirstClusters is the largest number of clusters for which Solve tries the level solver
// before the Newton path: on small problems it settles in a few rounds (the case study in 3,
// 10×100 in 37 cold and 7 after a 1% change), cheaper than the Newton path's continuation,
// and its ties are exact.
const levelsFirstClusters = 20

// setup builds the index-based representation of p in the solver's buffers.
func (s *Solver) setup(p *Problem) {
	nc, ne := len(p.Clusters), len(p.Engines)
	s.p = p
	s.order = [NumPriorities]int{int(Sheddable), int(Standard), int(Critical)}
	slices.SortStableFunc(s.order[:], func(a, b int) int {
		if s.opt.ShedPriceMs[a] < s.opt.ShedPriceMs[b] {
			return -1
		}
		if s.opt.ShedPriceMs[a] > s.opt.ShedPriceMs[b] {
			return 1
		}
		return 0
	})
	// The network rows are compared with the previous setup's while they are copied: when
	// their engines are the same (as on warm re-solves of one deployment), views built from
	// them (dualLinks, the solutions' engine lists) stay valid, and when their latencies are
	// the same too, so do the views' latencies.
	same := len(s.start) == nc+1
	s.start = growRaw(s.start, nc+1)
	edges := 0
	for i, row := range p.Network {
		same = same && s.start[i] == edges
		s.start[i] = edges
		edges += len(row)
	}
	same = same && s.start[nc] == edges && len(s.eng) == edges
	sameDist := true
	s.start[nc] = edges
	s.demand = grow(s.demand, nc)
	s.mu = grow(s.mu, nc)
	s.shed = grow(s.shed, nc)
	s.anchor = grow(s.anchor, nc)
	for i := range p.Clusters {
		s.demand[i] = p.Clusters[i].TotalDemand()
		s.mu[i] = math.NaN()
	}
	s.eng = growRaw(s.eng, edges)
	s.dist = growRaw(s.dist, edges)
	// x and x0 are written by warm; the scratch per edge is written by updateCluster before
	// it is read (deadBand clears dx).
	s.x = growRaw(s.x, edges)
	s.x0 = growRaw(s.x0, edges)
	s.xo = growRaw(s.xo, edges)
	s.room = growRaw(s.room, edges)
	s.thr = growRaw(s.thr, edges)
	s.dx = growRaw(s.dx, edges)
	for i, row := range p.Network {
		k := s.start[i]
		eng, dist := s.eng[k:k+len(row)], s.dist[k:k+len(row)]
		for r, l := range row {
			j := int32(l.Engine)
			same = same && eng[r] == j
			sameDist = sameDist && dist[r] == l.Ms
			eng[r], dist[r] = j, l.Ms
		}
	}
	if !same || s.links == 0 {
		s.links++
	}
	if !same || !sameDist || s.dists == 0 {
		s.dists++
	}
	s.curves = grow(s.curves, ne)
	s.capv = grow(s.capv, ne)
	s.X = grow(s.X, ne)
	s.lam = grow(s.lam, ne)
	s.fp = grow(s.fp, ne)
	s.lat = grow(s.lat, ne)
	s.capMarg = grow(s.capMarg, ne)
	s.bidv = grow(s.bidv, ne)
	s.bidHi = grow(s.bidHi, ne)
	s.lamHi = grow(s.lamHi, ne)
	for j := range p.Engines {
		e := &p.Engines[j]
		c := e.Profile.Curve(e.CapacityRPS, e.Health)
		s.curves[j] = c
		s.capv[j] = math.Max(0, c.Capacity())
		s.capMarg[j] = s.cost(j, s.capv[j])
	}
}

// warm initialises the anchors (x0), the levels and the flows from prev (matched by name),
// the flows clipped to the capacities. With flows false it leaves the flows, loads and shed
// alone: the Newton path needs only the anchors and the levels, and writes the rest.
func (s *Solver) warm(p *Problem, prev *Solution, flows bool) {
	for i := range s.shed {
		s.shed[i] = s.demand[i]
	}
	if prev == nil {
		clear(s.x)
		clear(s.x0)
		return
	}
	same := len(prev.Clusters) == len(p.Clusters) && len(prev.Engines) == len(p.Engines)
	for j := 0; same && j < len(p.Engines); j++ {
		same = prev.Engines[j].Name == p.Engines[j].Name
	}
	var engIdx map[string]int
	if !same {
		engIdx = make(map[string]int, len(prev.Engines))
		for j := range prev.Engines {
			engIdx[prev.Engines[j].Name] = j
		}
	}
	var clIdx map[string]int
	// The loads and each cluster's served traffic are summed while the flows are copied; the
	// clipping passes run only when some engine is over its capacity.
	served := s.shed // scratch until the end: the cluster's warm-started traffic
	for i := range p.Clusters {
		e0, e1 := s.start[i], s.start[i+1]
		x, x0 := s.x[e0:e1], s.x0[e0:e1]
		served[i] = 0
		pi := i
		if !(same && prev.Clusters[i].Name == p.Clusters[i].Name) {
			if clIdx == nil {
				clIdx = make(map[string]int, len(prev.Clusters))
				for c := range prev.Clusters {
					clIdx[prev.Clusters[c].Name] = c
				}
			}
			var ok bool
			if pi, ok = clIdx[p.Clusters[i].Name]; !ok {
				clear(x)
				clear(x0)
				continue
			}
		}
		pc := &prev.Clusters[pi]
		s.anchor[i] = true
		if !math.IsNaN(pc.level) {
			s.mu[i] = pc.level
		}
		D := s.demand[i]
		sum := 0.0
		if engIdx == nil && s.sameRow(pc.Engines, e0, e1) {
			// The usual warm start: the same engines in the same order.
			ws := pc.Weights[:len(x)]
			if !flows {
				for r, w := range ws {
					x0[r] = w * D
				}
				continue
			}
			for r, j := range s.eng[e0:e1] {
				v := ws[r] * D
				x0[r], x[r] = v, v
				s.X[j] += v
				sum += v
			}
			served[i] = sum
			continue
		}
		r := 0
		for k := e0; k < e1; k++ {
			// Both rows are sorted by engine index; with the same engines advance a cursor.
			w := 0.0
			if engIdx == nil {
				for r < len(pc.Engines) && pc.Engines[r] < int(s.eng[k]) {
					r++
				}
				if r < len(pc.Engines) && pc.Engines[r] == int(s.eng[k]) {
					w = pc.Weights[r]
				}
			} else if pj, ok := engIdx[p.Engines[s.eng[k]].Name]; ok {
				for q, e := range pc.Engines {
					if e == pj {
						w = pc.Weights[q]
						break
					}
				}
			}
			s.x0[k] = w * D
			s.x[k] = w * D
			s.X[s.eng[k]] += w * D
			sum += w * D
		}
		served[i] = sum
	}
	if !flows {
		return
	}
	over := false
	for j := range s.X {
		if s.X[j] > s.capv[j] {
			over = true
			break
		}
	}
	if over {
		// Clip to capacity and rebuild the loads and the clusters' traffic.
		for k, j := range s.eng {
			if s.X[j] > s.capv[j] {
				s.x[k] *= s.capv[j] / s.X[j]
			}
		}
		clear(s.X)
		for i := range p.Clusters {
			sum := 0.0
			for k := s.start[i]; k < s.start[i+1]; k++ {
				s.X[s.eng[k]] += s.x[k]
				sum += s.x[k]
			}
			served[i] = sum
		}
	}
	for i := range p.Clusters {
		sum := served[i]
		if sum > s.demand[i] {
			f := s.demand[i] / sum
			for k := s.start[i]; k < s.start[i+1]; k++ {
				s.X[s.eng[k]] -= s.x[k] * (1 - f)
				s.x[k] *= f
			}
			sum = s.demand[i]
		}
		s.shed[i] = math.Max(0, s.demand[i]-sum)
	}
	for j := range s.X {
		s.X[j] = math.Min(math.Max(s.X[j], 0), s.capv[j])
	}
}

// sameRow reports whether a previous solution's row lists the same engines as the network
// row of links e0..e1: at once when the solution shares the row built for the current links.
func (s *Solver) sameRow(prev []int, e0, e1 int) bool {
	row := s.eng[e0:e1]
	if len(prev) != len(row) {
		return false
	}
	if len(row) == 0 || s.rowsLinks == s.links && len(s.rows) == len(s.eng) && &prev[0] == &s.rows[e0] {
		return true
	}
	for k, j := range row {
		if prev[k] != int(j) {
			return false
		}
	}
	return true
}

// iterate runs Gauss-Seidel sweeps over the clusters until the gap is within tolerance. first
// is the certificate of the current point when the caller has computed it (nil: compute it).
func (s *Solver) iterate(p *Problem, first *measures) (int, measures) {
	nc := len(p.Clusters)
	var m measures
	if first != nil {
		m = *first
	} else {
		m = s.measure(true)
	}
	sweeps := 0
	for sweeps < s.opt.MaxSweeps && m.relGap > s.opt.Tolerance && (sweeps == 0 || !s.expired(s.end)) {
		if sweeps%2 == 0 {
			for i := 0; i < nc; i++ {
				s.updateCluster(i)
			}
		} else {
			for i := nc - 1; i >= 0; i-- {
				s.updateCluster(i)
			}
		}
		sweeps++
		s.exchange()
		s.cancelCycles(100)
		m = s.measure(true)
	}
	// Whatever stopped the sweeps, the point returned sheds by priority across clusters
	// (priority.go); at an optimum there is nothing to move.
	if !s.equilibrium && s.enforcePriority() > 0 {
		m = s.measure(true)
	}
	return sweeps, m
}

// expired reports whether the deadline end (zero: none) has passed, and records it in
// outOfTime.
func (s *Solver) expired(end time.Time) bool {
	if end.IsZero() || time.Now().Before(end) {
		return false
	}
	s.outOfTime = true
	return true
}

func (s *Solver) kappa(i int) float64 {
	if s.anchor[i] {
		return s.opt.ProximalMs
	}
	return 0
}

// flow returns cluster-edge k's flow at level mu and its derivative.
func (s *Solver) flow(k int, mu, kappa float64) (float64, float64) {
	j := int(s.eng[k])
	base := s.dist[k]
	xo, room := s.xo[k], s.room[k]
	if kappa == 0 {
		if mu <= s.thr[k] {
			return 0, 0
		}
		l, d := s.inv(j, mu-base)
		v := l - xo
		if v <= 0 {
			return 0, 0
		}
		if v >= room {
			return room, 0
		}
		return v, d
	}
	x0 := s.x0[k]
	var v, d float64
	if mu-kappa > s.thr[k] {
		l, dd := s.inv(j, mu-base-kappa)
		if l-xo > x0 {
			v, d = l-xo, dd
			goto clip
		}
	}
	if mu+kappa > s.thr[k] {
		l, dd := s.inv(j, mu-base+kappa)
		if l-xo < x0 {
			v, d = l-xo, dd
		} else {
			v, d = x0, 0
		}
	} else {
		v, d = 0, 0
	}
clip:
	if v <= 0 {
		return 0, 0
	}
	if v >= room {
		return room, 0
	}
	return v, d
}

func (s *Solver) flowSum(e0, e1 int, mu, kappa float64) (float64, float64) {
	sum, ds := 0.0, 0.0
	for k := e0; k < e1; k++ {
		v, d := s.flow(k, mu, kappa)
		sum += v
		ds += d
	}
	return sum, ds
}

// root finds a level mu in [a, b] with flowSum(mu) = T, given flowSum(a) ≤ T ≤ flowSum(b),
// by Newton's method safeguarded with bisection.
func (s *Solver) root(e0, e1 int, T, a, b, guess, kappa float64) (float64, float64) {
	tol := 1e-13 * T
	mu := guess
	if !(mu > a && mu < b) {
		mu = a + math.Min(0.5*(b-a), 0.25*(math.Abs(a)+1))
	}
	for it := 0; it < 300; it++ {
		A, dA := s.flowSum(e0, e1, mu, kappa)
		diff := A - T
		if math.Abs(diff) <= tol {
			return mu, mu
		}
		if diff < 0 {
			a = mu
		} else {
			b = mu
		}
		if b-a <= 1e-15*math.Max(math.Abs(a), math.Abs(b)) {
			return b, a
		}
		next := math.NaN()
		if dA > 0 {
			next = mu - diff/dA
		}
		if !(next > a && next < b) {
			if b-a > 4*(math.Abs(a)+1) {
				next = a + 2*(math.Abs(a)+1)
			} else {
				next = 0.5 * (a + b)
			}
		}
		mu = next
	}
	return b, a
}

// updateCluster re-optimises cluster i's flows and shed given all other clusters' flows.
func (s *Solver) updateCluster(i int) {
	e0, e1 := s.start[i], s.start[i+1]
	kappa := s.kappa(i)
	lo := math.Inf(1)
	for k := e0; k < e1; k++ {
		j := s.eng[k]
		s.X[j] -= s.x[k]
		xo := math.Max(s.X[j], 0)
		s.xo[k] = xo
		s.room[k] = math.Max(s.capv[j]-xo, 0)
		s.thr[k] = s.dist[k] + s.cost(int(j), xo)
		if t := s.thr[k] - kappa; t < lo {
			lo = t
		}
	}
	D := s.demand[i]
	var mu, shed float64
	switch {
	case D <= 0:
		mu, shed = math.NaN(), 0
		for k := e0; k < e1; k++ {
			s.x[k] = 0
		}
	case e0 == e1:
		mu, shed = math.Inf(1), D
	default:
		var below float64
		mu, below, shed = s.level(i, e0, e1, D, lo, kappa)
		sum := 0.0
		for k := e0; k < e1; k++ {
			s.x[k], s.dx[k] = s.flow(k, mu, kappa)
			sum += s.x[k]
		}
		if below < mu && sum > D-shed {
			// The flows jump between below and mu (flat marginal costs): interpolate.
			sumBelow := 0.0
			for k := e0; k < e1; k++ {
				s.xo[k], _ = s.flow(k, below, kappa) // xo is free again: reuse as scratch
				sumBelow += s.xo[k]
			}
			if f := (D - shed - sumBelow) / (sum - sumBelow); f >= 0 && f <= 1 {
				sum = 0
				for k := e0; k < e1; k++ {
					s.x[k] = s.xo[k] + f*(s.x[k]-s.xo[k])
					sum += s.x[k]
				}
			}
		}
		s.fixResidual(e0, e1, D-shed-sum)
		sum = 0
		for k := e0; k < e1; k++ {
			sum += s.x[k]
		}
		shed = math.Max(0, D-sum)
	}
	for k := e0; k < e1; k++ {
		s.X[s.eng[k]] += s.x[k]
	}
	s.mu[i], s.shed[i] = mu, shed
}

// level finds cluster i's marginal-cost level and its shed: the classes whose shed price is
// below the level are shed entirely, one whose price equals it partly, and the engines take the
// rest. lo is a level at which no engine takes any flow.
func (s *Solver) level(i, e0, e1 int, D, lo, kappa float64) (mu, below, shed float64) {
	dem := &s.p.Clusters[i].Demand
	cum := 0.0
	a := lo
	for _, q := range s.order {
		P := s.opt.ShedPriceMs[q]
		AP := 0.0
		if P > lo {
			AP, _ = s.flowSum(e0, e1, P, kappa)
		}
		if AP+cum >= D {
			T := D - cum
			if T <= 0 {
				return a, a, cum
			}
			mu, below := s.root(e0, e1, T, math.Max(a, lo), P, s.mu[i], kappa)
			return mu, below, cum
		}
		if AP+cum+dem[q] >= D {
			return P, P, D - AP
		}
		cum += dem[q]
		a = math.Max(a, P)
	}
	// Unreachable in exact arithmetic (all classes shed covers D); shed everything.
	P := s.opt.ShedPriceMs[s.order[NumPriorities-1]]
	return P, P, D
}

// fixResidual adds r (a rounding residual, positive or negative) to the cluster's flows,
// preferring edges whose flow is still moving with the level.
func (s *Solver) fixResidual(e0, e1 int, r float64) {
	if r == 0 {
		return
	}
	best := -1
	for k := e0; k < e1; k++ {
		if s.dx[k] > 0 && (best < 0 || s.dx[k] > s.dx[best]) {
			best = k
		}
	}
	if best >= 0 {
		v := math.Min(math.Max(s.x[best]+r, 0), s.room[best])
		r -= v - s.x[best]
		s.x[best] = v
	}
	for k := e0; k < e1 && r != 0; k++ {
		if r < 0 && s.x[k] > 0 || r > 0 && s.x[k] < s.room[k] && s.x[k] > 0 {
			v := math.Min(math.Max(s.x[k]+r, 0), s.room[k])
			r -= v - s.x[k]
			s.x[k] = v
		}
	}
}

type measures struct {
	gap, relGap, objective, latCost, proxCost, shedCost float64
}

// shedCost returns the cost of shedding amount s of cluster i, cheapest classes first.
func (s *Solver) shedCost(i int, amount float64) float64 {
	dem := &s.p.Clusters[i].Demand
	c := 0.0
	for _, q := range s.order {
		if amount <= 0 {
			break
		}
		t := math.Min(amount, dem[q])
		c += t * s.opt.ShedPriceMs[q]
		amount -= t
	}
	return c
}

// measure computes the objective and the duality gap certificate of the current flows; with
// updatePrices it first updates the capacity prices of engines at their hard limit.
func (s *Solver) measure(updatePrices bool) measures {
	// fp is a subgradient of each engine's cost at its load. At a kink of the profile any
	// value between the left and right derivative is valid; the one nearest the valuation
	// (level minus network latency) of the engine's users makes the certificate tight.
	// The users' pass is needed only when some engine sits at a kink (left and right
	// derivatives apart by more than rounding), as at the corners of points profiles.
	kinks, full := false, false
	for j := range s.X {
		s.lat[j] = s.curves[j].Latency(s.X[j])
		right := s.cost(j, s.X[j])
		left := right
		if s.X[j] > 0 {
			left = s.cost(j, s.X[j]*(1-1e-12))
		}
		s.fp[j], s.bidv[j] = right, left // bidv: scratch for the left derivative
		if left < right*(1-1e-9) {
			kinks = true
		}
		if s.capv[j] > 0 && s.X[j] >= s.capv[j]*(1-1e-9) {
			full = true
		}
	}
	if kinks {
		for j := range s.X {
			s.fp[j] = math.Inf(1)
		}
		for i := range s.demand {
			if math.IsNaN(s.mu[i]) || math.IsInf(s.mu[i], 0) {
				continue
			}
			for k := s.start[i]; k < s.start[i+1]; k++ {
				if j := s.eng[k]; s.x[k] > 0 && s.mu[i]-s.dist[k] < s.fp[j] {
					s.fp[j] = s.mu[i] - s.dist[k]
				}
			}
		}
		for j := range s.X {
			right := s.cost(j, s.X[j])
			s.fp[j] = math.Min(math.Max(s.fp[j], s.bidv[j]), right)
		}
	}
	if updatePrices && !full {
		// No engine at its hard limit: no capacity prices.
		clear(s.lam)
		return s.gapWith(s.lam)
	}
	if updatePrices {
		// The capacity price of an engine at its limit is what its users value it at beyond
		// its marginal cost fp (level minus network latency minus fp). Away from the optimum
		// users disagree; both the least and the greatest valuation give valid certificates,
		// and the smaller gap is kept.
		for j := range s.bidv {
			s.bidv[j], s.bidHi[j] = math.Inf(1), 0
		}
		for i := range s.start[:len(s.start)-1] {
			if !(s.demand[i] > 0) || math.IsNaN(s.mu[i]) || math.IsInf(s.mu[i], 0) {
				continue
			}
			for k := s.start[i]; k < s.start[i+1]; k++ {
				j := s.eng[k]
				b := s.mu[i] - s.dist[k] - s.fp[j]
				if s.x[k] > 0 && b < s.bidv[j] {
					s.bidv[j] = b
				}
				if b > s.bidHi[j] {
					s.bidHi[j] = b
				}
			}
		}
		for j := range s.lam {
			s.lam[j], s.lamHi[j] = 0, 0
			if s.capv[j] > 0 && s.X[j] >= s.capv[j]*(1-1e-9) {
				if !math.IsInf(s.bidv[j], 1) && s.bidv[j] > 0 {
					s.lam[j] = s.bidv[j]
				}
				s.lamHi[j] = s.bidHi[j]
			}
		}
		mLo := s.gapWith(s.lam)
		if slices.Equal(s.lam, s.lamHi) {
			return mLo // no engine at its limit, or users that agree: one certificate
		}
		mHi := s.gapWith(s.lamHi)
		if mHi.gap < mLo.gap {
			copy(s.lam, s.lamHi)
			return mHi
		}
		return mLo
	}
	return s.gapWith(s.lam)
}

// gapWith computes the objective and the duality gap with capacity prices lam. It also leaves
// in dev and anc, per anchored cluster, Σ|x − x0| and Σ x0 over its links (deadBand reads them).
func (s *Solver) gapWith(lam []float64) measures {
	var m measures
	gap := 0.0
	// Per engine: the linearised cost fp + λ of a unit of flow (g), and the same for the lower
	// bound's cheapest option, +Inf for an engine of zero capacity: it can never take traffic
	// (its capacity price may be taken as infinite), so it does not lower the bound.
	s.gj = growRaw(s.gj, len(lam))
	s.gmin = growRaw(s.gmin, len(lam))
	for j := range lam {
		gap += lam[j] * (s.capv[j] - s.X[j])
		s.gj[j] = s.fp[j] + lam[j]
		s.gmin[j] = math.Inf(1)
		if s.capv[j] > 0 {
			s.gmin[j] = s.gj[j]
		}
	}
	s.dev = growRaw(s.dev, len(s.demand))
	s.anc = growRaw(s.anc, len(s.demand))
	gj, gmin, lat := s.gj, s.gmin, s.lat
	var latCost, proxCost, shedCost float64
	for i := range s.demand {
		e0, e1 := s.start[i], s.start[i+1]
		D := s.demand[i]
		s.dev[i], s.anc[i] = 0, 0
		if s.out != nil {
			s.rowOut(s.out, i) // while the cluster's links are in cache
		}
		if D <= 0 {
			continue
		}
		kappa := s.kappa(i)
		eng, dist, x, x0 := s.eng[e0:e1], s.dist[e0:e1], s.x[e0:e1], s.x0[e0:e1]
		// One pass over the links: the cost at the linearised prices, the latency, the
		// distance from the anchor and the cheapest option; the offers of the anchor's flows
		// are collected against the running cheapest option (a superset of those below the
		// final one, filtered below).
		served, cost, minG := 0.0, 0.0, math.Inf(1)
		offers := s.offers[:0]
		if s.anchor[i] {
			dev, anc := 0.0, 0.0
			for r, j := range eng {
				xr, x0r, dr := x[r], x0[r], dist[r]
				g := dr + gj[j]
				served += g * xr
				cost += xr * (dr + lat[j])
				dev += math.Abs(xr - x0r)
				anc += x0r
				if gm := dr + gmin[j]; gm < minG {
					minG = gm
				}
				if kappa > 0 && x0r > 0 && g-2*kappa < minG {
					offers = append(offers, offer{g - kappa, x0r})
				}
			}
			s.dev[i], s.anc[i] = dev, anc
		} else {
			for r, j := range eng {
				xr, dr := x[r], dist[r]
				served += (dr + gj[j]) * xr
				cost += xr * (dr + lat[j])
				if g := dr + gmin[j]; g < minG {
					minG = g
				}
			}
		}
		latCost += cost
		anchorSum := 0.0
		if kappa > 0 {
			anchorSum = s.anc[i]
			prox := kappa * s.dev[i]
			proxCost += prox
			served += prox
			minG += kappa
		}
		sc := s.shedCost(i, s.shed[i])
		shedCost += sc
		// Lower bound: cheapest way to carry D at the linearised costs.
		w := 0
		if anchorSum > 0 {
			for _, o := range offers {
				if o.price < minG {
					offers[w] = o
					w++
				}
			}
		}
		offers = offers[:w]
		dem := &s.p.Clusters[i].Demand
		for q := range dem {
			if dem[q] > 0 && s.opt.ShedPriceMs[q] < minG {
				offers = append(offers, offer{s.opt.ShedPriceMs[q], dem[q]})
			}
		}
		slices.SortFunc(offers, func(a, b offer) int {
			switch {
			case a.price < b.price:
				return -1
			case a.price > b.price:
				return 1
			}
			return 0
		})
		lb, left := kappa*anchorSum, D
		if !(kappa > 0) {
			lb = 0
		}
		for _, o := range offers {
			t := math.Min(left, o.amount)
			lb += t * o.price
			left -= t
			if left <= 0 {
				break
			}
		}
		if left > 1e-12*D && !math.IsInf(minG, 1) {
			lb += left * minG
		}
		s.offers = offers
		gap += served + sc - lb
	}
	m.latCost, m.proxCost, m.shedCost = latCost, proxCost, shedCost
	switch {
	case math.IsNaN(gap):
		gap = math.Inf(1)
	case gap < 0:
		gap = 0
	}
	m.gap = gap
	m.objective = m.latCost + m.proxCost + m.shedCost
	switch den := m.latCost + m.proxCost; {
	case den > 0:
		m.relGap = gap / den
	case m.objective > 0:
		m.relGap = gap / m.objective
	case gap > 0:
		m.relGap = math.Inf(1)
	}
	return m
}

// shedPriceFloor returns the lowest shed price of a class that some cluster sheds (+Inf when
// nothing is shed).
func (s *Solver) shedPriceFloor() float64 {
	P := math.Inf(1)
	for i := range s.demand {
		if !(s.shed[i] > 1e-9*s.demand[i]) {
			continue
		}
		for q, D := range s.p.Clusters[i].Demand {
			if D > 0 {
				P = math.Min(P, s.opt.ShedPriceMs[q])
			}
		}
	}
	return P
}

// deadBand restores the previous weights of clusters whose new weights moved less than the
// dead band, as long as no engine is pushed over its hard limit. It returns how many it kept.
// It reads each cluster's distance from its previous flows (dev, anc) from the last
// certificate, which was computed at the current flows (iterate ends with one).
func (s *Solver) deadBand(p *Problem, prev *Solution) int {
	if prev == nil || s.opt.DeadBand <= 0 {
		return 0
	}
	kept := 0
	s.keep = grow(s.keep, len(p.Clusters))
	keep := s.keep
	// Each engine's limit for the kept weights: its hard limit, and, when some traffic is
	// shed, no load beyond both the solve's and the one at which its marginal cost reaches
	// the cheapest shed price (there a stale 1% can multiply an engine's latency).
	s.dbLim = growRaw(s.dbLim, len(s.X))
	copy(s.dbLim, s.capv)
	if P := s.shedPriceFloor(); !math.IsInf(P, 1) {
		for j := range s.dbLim {
			if s.capv[j] > 0 {
				x, _ := s.curves[j].InverseMarginal(P)
				s.dbLim[j] = math.Min(s.capv[j], math.Max(s.X[j], x))
			}
		}
	}
	for i := range p.Clusters {
		D := s.demand[i]
		if !s.anchor[i] || D <= 0 {
			continue
		}
		prevShed := math.Max(0, D-s.anc[i])
		tv := (s.dev[i] + math.Abs(s.shed[i]-prevShed)) / (2 * D)
		if tv >= s.opt.DeadBand || tv == 0 {
			continue
		}
		for k := s.start[i]; k < s.start[i+1]; k++ {
			s.X[s.eng[k]] += s.x0[k] - s.x[k]
		}
		keep[i] = true
		kept++
	}
	// Revert kept clusters on engines pushed over their limit.
	over := false
	for j := range s.X {
		if s.X[j] > s.dbLim[j] {
			over = true
			break
		}
	}
	for i := range p.Clusters {
		if !over || !keep[i] {
			continue
		}
		e0, e1 := s.start[i], s.start[i+1]
		over := false
		for k := e0; k < e1; k++ {
			if j := s.eng[k]; s.X[j] > s.dbLim[j] {
				over = true
				break
			}
		}
		if over {
			for k := e0; k < e1; k++ {
				s.X[s.eng[k]] -= s.x0[k] - s.x[k]
			}
			keep[i] = false
			kept--
		}
	}
	for i := range p.Clusters {
		if !keep[i] {
			continue
		}
		e0, e1 := s.start[i], s.start[i+1]
		copy(s.x[e0:e1], s.x0[e0:e1])
		s.shed[i] = math.Max(0, s.demand[i]-s.anc[i]) // anc: the sum of x0 over the row
	}
	for j := range s.X {
		s.X[j] = math.Max(0, s.X[j])
	}
	return kept
}
