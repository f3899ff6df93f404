// Package newton holds the Newton path: Newton's method on the clusters' levels of a
// regularised dual, with a continuation in the regularisation, optionally with the shed
// modelled (docs/optimizer.md). It solves large problems in a few dozen factorisations.
package newton

import (
	"math"
	"slices"

	"github.com/switchyard-dev/switchyard/optimizer/flow"
)

// Solver runs the Newton path on a flow.State; it keeps its buffers, the order of each
// engine's links by latency and the last solve's θ between solves.
type Solver struct {
	*flow.State
	newt newtonState
}

// The Newton path solves a regularised version of the problem on the clusters' levels. Adding
// (ε_j/2)·Σ_i x_ij² to every engine's cost makes the split of an engine among the clusters that
// bid for it unique and continuous in the levels: at levels μ, engine j's price p_j solves
//
//	Σ_i max(0, μ_i − d_ij − p_j) / ε_j = X_j(p_j)      (X_j = F_j'^{-1}, the engine's supply)
//
// and cluster i gets x_ij = max(0, μ_i − d_ij − p_j)/ε_j. The dual function of the regularised
// problem, q(μ) = Σ_i μ_i D_i − Σ_j h_j(μ), is concave and continuously differentiable, its
// gradient is the clusters' unmet demand r_i = D_i − Σ_j x_ij, and its Hessian is, per engine
// with bidders A (those above the price), −(1/ε_j)(I_A − 1_A 1_Aᵀ/(|A| + ε_j X_j'(p_j))). It
// has as many variables as clusters and decomposes over the components of clusters linked by
// shared engines, so a Newton step costs one pass over the links plus a dense factorisation per
// component. Newton steps with a line search on q solve it; ε is lowered in stages
// (continuation) from a coarse split that links many clusters to a fine one.
//
// At the regularised optimum the marginal cost d_ij + F_j'(X_j) of every engine a cluster uses
// is within ε_j·x_ij of its level and no unused engine is cheaper than the level, so the duality
// gap of the unregularised problem is at most Σ_i D_i·max_j ε_j x_ij: with ε_j = θ·M/C_j (M the
// market-clearing marginal cost, C_j the capacity) the relative gap is of the order of θ. The
// certificate is computed afterwards by the same code as for every other path.
//
// When the optimum sheds, the clusters' dual terms Σ_q D_iq·min(μ_i, P_q) are kinked at the
// shed prices P_q; the shed mode (newtonRun with shed) regularises them like the engines'
// splits, so that the unmet demand includes a shed that grows linearly over a band of δ above
// each price (newtonShed).

// newtonState holds the buffers of the Newton path.
type newtonState struct {
	act        []bool    // cluster takes part: positive demand and links
	eps        []float64 // per engine regularisation
	m0         []float64 // marginal cost at zero load per engine (+Inf: no capacity)
	p, sl      []float64 // per engine price and supply slope X'(p)
	px         []float64 // per engine supply X(p) at p, when the last evaluation read it; else NaN
	astart     []int     // engine j's bidders above its price: alink/ax[astart[j]:astart[j+1]]
	alink      []int32   // engine-major link index of each bidder
	ax         []float64 // its flow
	served, r  []float64 // per cluster served traffic and unmet demand
	mu, trial  []float64 // levels and trial levels
	saved      []float64 // levels of the last settled stage
	lv         []float64 // levels of the clusters that take part, -Inf for the others
	step       []float64 // Newton step
	uf         []int32   // union-find over clusters (components of the Hessian)
	loc        []int32   // index of a cluster within its component
	cstart     []int     // members of component roots, by counting sort
	cmem       []int32
	boff       []int     // offset of each component root's block in mat
	mat        []float64 // dense Hessian blocks of the components
	rhs        []float64
	first      []int   // envelope of each row, for cholSolve
	perm, rank []int   // reverse Cuthill-McKee order of a block and its inverse
	deg        []int   // degree of each row of a block
	adj        []int32 // adjacency lists of a block: adj[adjStart[l]:adjStart[l+1]]
	adjStart   []int
	pmat, prhs []float64 // the permuted block and right-hand side
	// Per engine, its links in the order of their network latency (then of their position):
	// position in the dual's engine-major view (ecl, ein), cluster and latency; built at the
	// Solver's counts of network-row changes ordLinks and ordDists.
	spos, scl          []int32
	sdist              []float64
	ordLinks, ordDists uint64
	seenLinks          uint64    // the Solver's count when the Newton path last ran
	ordered            bool      // the order is in place for this solve
	sortBuf            []latLink // scratch for sorting one engine's links
	steps, evals       int       // Newton steps and evaluations of the last solve
	theta              float64   // the θ of the last successful solve
	// shed is set while the path models shedding (newtonRun): each class's shed is
	// regularised over delta ms above its price (newtonShed).
	shed  bool
	delta float64
	// partial is set when the shed mode settled but its certificate did not close: its
	// point (flows, shed, levels) is in the solver's buffers for the sweeps to go on from.
	partial bool
	m       flow.Measures // the certificate of its point
}

func (n *newtonState) find(i int32) int32 {
	for n.uf[i] != i {
		n.uf[i] = n.uf[n.uf[i]]
		i = n.uf[i]
	}
	return i
}

// Solve runs the Newton path. It starts from the levels in s.Mu (warm, when every
// cluster that takes part has one) or from a common level, and on success leaves flows, loads,
// shed and levels in the solver's buffers. When the optimum sheds demand (levels reach shed
// prices, or the demand exceeds every reachable engine's capacity) and shed is set, it runs
// again with the shed modelled: each class's shed is regularised like the engines' splits
// (newtonShed), with the regularisation scaled to the latencies rather than to the levels. It
// fails (reports false) when the steps do not converge; the caller then takes the other paths
// from a fresh setup. When the shed mode settles but its certificate does not close, it fails
// with Partial set and its point in the buffers, for the sweeps to go on from.
func (s *Solver) Solve(shed bool) bool {
	s.newt.partial = false
	ok, sheds := s.newtonRun(false)
	if ok || !sheds || !shed || s.OutOfTime {
		return ok
	}
	ok, _ = s.newtonRun(true)
	return ok
}

// newtonRun runs the Newton path without (shed false) or with the shed modelled. Without, it
// also reports whether it gave up because the optimum sheds.
func (s *Solver) newtonRun(shed bool) (ok, sheds bool) {
	n := &s.newt
	nc, ne := len(s.Demand), len(s.Load)
	n.shed = shed
	s.EngineView()
	n.ordered = s.newtonOrder()
	n.act = flow.Grow(n.act, nc)
	n.served = flow.Grow(n.served, nc)
	n.r = flow.Grow(n.r, nc)
	n.mu = flow.Grow(n.mu, nc)
	n.trial = flow.Grow(n.trial, nc)
	n.step = flow.Grow(n.step, nc)
	n.uf = flow.Grow(n.uf, nc)
	n.loc = flow.Grow(n.loc, nc)
	n.eps = flow.Grow(n.eps, ne)
	n.m0 = flow.Grow(n.m0, ne)
	n.p = flow.Grow(n.p, ne)
	n.sl = flow.Grow(n.sl, ne)
	n.px = flow.Grow(n.px, ne)
	n.astart = flow.Grow(n.astart, ne+1)
	n.steps, n.evals = 0, 0
	warm := true
	some := false
	for i := 0; i < nc; i++ {
		if s.Demand[i] > 0 && s.Start[i+1] > s.Start[i] {
			n.act[i] = true
			some = true
			if math.IsNaN(s.Mu[i]) || math.IsInf(s.Mu[i], 0) {
				warm = false
			}
		}
	}
	if !some {
		return false, false
	}
	// Demand beyond the capacity of every engine the clusters may use is shed: leave it to the
	// other paths at once (a regional overload shows as levels at shed prices later).
	total, reach := 0.0, 0.0
	for i, a := range n.act {
		if a {
			total += s.Demand[i]
		}
	}
	for j := 0; j < ne; j++ {
		for _, i := range s.ECl[s.EStart[j]:s.EStart[j+1]] {
			if n.act[i] {
				reach += s.Cap[j]
				break
			}
		}
	}
	if total >= reach && !shed {
		return false, true
	}
	for j := 0; j < ne; j++ {
		n.m0[j] = math.Inf(1)
		if s.Cap[j] > 0 {
			n.m0[j] = s.Curves[j].Marginal(0)
		}
		n.p[j], n.px[j] = math.NaN(), math.NaN()
	}
	var M float64
	if warm {
		sum, w := 0.0, 0.0
		for i := 0; i < nc; i++ {
			if n.act[i] {
				n.mu[i] = s.Mu[i]
				sum += s.Mu[i] * s.Demand[i]
				w += s.Demand[i]
			}
		}
		M = sum / w
	} else {
		M = s.newtonColdLevels()
	}
	if shed {
		// The levels of clusters that shed are shed prices, far above any latency; the
		// regularisation is scaled to the latencies instead (newtonShedScale), and so is the
		// width of the shed's regularisation.
		M = s.newtonShedScale()
	}
	if !(M > 0) || math.IsInf(M, 0) {
		return false, false
	}
	// Continuation: θ falls ten-fold per stage from 0.01 (cold) to the tolerance, then
	// four-fold while the certificate is above it (at most three times). A stage that does not
	// settle within its step budget is retried from the last settled levels with a smaller
	// fall (the square root of the last), as on problems with many small overlapping regions
	// where a ten-fold fall re-splits too many shared engines at once; when the first stage
	// does not settle, the solve starts again at θ = 0.1.
	thetaEnd := s.Opt.Tolerance
	theta, fall := 1e-2, 10.0
	if shed {
		// Ten-fold falls from the first stage failed on 100×1000 at 150% (15 steps each,
		// twice, before the retries with smaller falls): 34 steps instead of 49.
		fall = math.Sqrt(10)
	}
	if warm {
		theta = thetaEnd
		if !shed && n.theta > 0 && n.theta < theta {
			theta = n.theta // the previous solve needed a finer split
		}
	}
	if warm && shed {
		// A cluster that shed part of a class sits at its shed price; the regularised
		// problem sheds nothing there: start in the middle of the class's band instead.
		delta := theta * M
		for i, a := range n.act {
			if !a {
				continue
			}
			for q, D := range s.Classes[i] {
				if P := s.Opt.ShedPriceMs[q]; D > 0 && math.Abs(n.mu[i]-P) <= delta {
					n.mu[i] = P + delta/2
				}
			}
		}
	}
	settled := math.NaN() // θ of the last settled stage
	n.saved = append(n.saved[:0], n.mu...)
	extra := 0
	for {
		if s.Expired(s.FastEnd) {
			return false, false
		}
		for j := 0; j < ne; j++ {
			if s.Cap[j] > 0 {
				n.eps[j] = theta * M / s.Cap[j]
			}
		}
		n.delta = theta * M
		tol := 1e-8
		if theta > thetaEnd*(1+1e-9) {
			tol = newtonStageTol // an intermediate stage only provides a start
		}
		steps := newtonStageSteps
		if shed && math.IsNaN(settled) {
			// From a cold start (levels at the cheapest shed price) the first stage
			// takes 20 to 50 steps, the later ones a few.
			steps = newtonShedFirstSteps
		}
		if !s.newtonStage(steps, tol) {
			if !shed && !s.newtonSheds() {
				return false, true // levels at shed prices: the optimum sheds
			}
			if math.IsNaN(settled) && warm && shed {
				// The first stage from the previous levels did not settle: start cold.
				s.newtonColdLevels()
				n.saved = append(n.saved[:0], n.mu...)
				warm, theta = false, 1e-2
				continue
			}
			if math.IsNaN(settled) && !warm && theta < 0.1 {
				// The first stage did not settle: start again from a coarser split, and
				// fall from it by less, as after any stage that did not settle.
				copy(n.mu, n.saved)
				theta = 0.1
				fall = math.Sqrt(fall)
				continue
			}
			if math.IsNaN(settled) || fall < 1.1 {
				return false, false
			}
			copy(n.mu, n.saved)
			fall = math.Sqrt(fall)
			theta = settled / fall
			continue
		}
		settled = theta
		n.saved = append(n.saved[:0], n.mu...)
		if theta > thetaEnd*(1+1e-9) {
			theta = math.Max(theta/fall, thetaEnd)
			continue
		}
		if !shed && !s.newtonSheds() {
			return false, true
		}
		s.newtonFlows()
		if n.m = s.Measure(true); n.m.RelGap <= s.Opt.Tolerance {
			if !shed {
				n.theta = theta
			}
			return true, false
		}
		if extra++; extra > 3 || shed {
			n.partial = shed
			return false, false
		}
		theta /= 4
	}
}

// newtonSheds reports whether the levels are below the shed prices of every class with
// demand: the Newton path does not model shedding, so an optimum that sheds is left to the
// other paths.
func (s *Solver) newtonSheds() bool {
	n := &s.newt
	for i := range n.act {
		if !n.act[i] {
			continue
		}
		dem := &s.Classes[i]
		for q := range dem {
			if dem[q] > 0 && !(n.mu[i] < s.Opt.ShedPriceMs[q]) {
				return false
			}
		}
	}
	return true
}

// newtonStageSteps is the step budget of one continuation stage.
const newtonStageSteps = 15

// newtonShedFirstSteps is the step budget of the first stage in shed mode.
const newtonShedFirstSteps = 60

// newtonStageTol is the relative unmet demand at which an intermediate stage stops.
const newtonStageTol = 1e-2

// newtonStage runs Newton steps at the current ε until the unmet demand of every cluster is
// within tol of its demand.
func (s *Solver) newtonStage(maxSteps int, tol float64) bool {
	n := &s.newt
	nc := len(s.Demand)
	q := s.newtonEval(n.mu)
	tLast := 1.0
	for it := 0; it < maxSteps; it++ {
		res := s.newtonResidual()
		if res <= tol {
			return true
		}
		// The deadline is checked per step, not only per stage: the first stage of the
		// shed mode has 60 steps, seconds under -race.
		if s.Expired(s.FastEnd) {
			return false
		}
		n.steps++
		if !s.newtonStep() {
			return false
		}
		// Cap the step so that a cluster with no engine above its price (a flat direction)
		// does not jump far.
		big, slope := 0.0, 0.0
		for i := 0; i < nc; i++ {
			if n.act[i] {
				big = math.Max(big, math.Abs(n.step[i]))
				slope += n.r[i] * n.step[i]
			}
		}
		maxStep := 0.5 * math.Abs(s.newtonScale())
		// Start the line search from 8 times the last accepted step length: after a step that
		// needed halving, the next full step usually does too.
		t := min(1, 8*tLast)
		if big*t > maxStep {
			t = maxStep / big
		}
		accepted := false
		for ls := 0; ls < 40; ls++ {
			for i := 0; i < nc; i++ {
				n.trial[i] = n.mu[i]
				if n.act[i] {
					n.trial[i] += t * n.step[i]
				}
			}
			qt := s.newtonEval(n.trial)
			n.evals++
			// Accept a sufficient ascent of the dual (Armijo), or a fall of the largest
			// unmet demand by a tenth where the dual is flat to its rounding (there the
			// Armijo test reads noise). A step that lowers the dual by more than rounding is
			// never accepted: on 1000×10,000 such steps made a stage swing between two
			// points (the residual falling one way, the dual rising the other) until its
			// step budget ran out.
			if qt >= q+1e-4*t*slope || s.newtonResidual() < 0.9*res && qt >= q-1e-10*math.Abs(q) {
				q = qt
				tLast = t
				accepted = true
				break
			}
			t *= 0.5
		}
		if !accepted {
			return false
		}
		n.mu, n.trial = n.trial, n.mu
	}
	return false
}

// newtonScale returns the mean level (a scale for step caps).
func (s *Solver) newtonScale() float64 {
	n := &s.newt
	sum, w := 0.0, 0.0
	for i, a := range n.act {
		if a {
			sum += math.Abs(n.mu[i])
			w++
		}
	}
	return sum / w
}

// newtonResidual returns the largest unmet demand relative to the cluster's demand.
func (s *Solver) newtonResidual() float64 {
	n := &s.newt
	res := 0.0
	for i, a := range n.act {
		if a {
			res = math.Max(res, math.Abs(n.r[i])/s.Demand[i])
		}
	}
	return res
}

// newtonOrder sorts every engine's links by network latency (spos, scl, sdist), so that an
// evaluation stops scanning an engine's links at the first whose latency puts even the
// highest level below the engine's threshold. It sorts only on a solve that finds the links
// of the previous Newton solve (a one-off solve does not pay for it), and reports whether
// the order is in place. When only the latencies changed since the last sort, the previous
// order is nearly sorted and an insertion sort restores it.
func (s *Solver) newtonOrder() bool {
	n := &s.newt
	edges := len(s.ECl)
	if n.seenLinks != s.Links {
		n.seenLinks = s.Links
		return false
	}
	fresh := n.ordLinks != s.Links || len(n.spos) != edges
	if !fresh && n.ordDists == s.Dists {
		return true
	}
	n.spos = flow.GrowRaw(n.spos, edges)
	n.scl = flow.GrowRaw(n.scl, edges)
	n.sdist = flow.GrowRaw(n.sdist, edges)
	for j := 0; j+1 < len(s.EStart); j++ {
		e0, e1 := s.EStart[j], s.EStart[j+1]
		pos := n.spos[e0:e1]
		sorted := false
		if !fresh {
			// Insertion sort from the previous order, unless the latencies moved so much
			// that it would take many shifts.
			sorted = true
			budget := 8 * len(pos)
			for q := 1; q < len(pos) && sorted; q++ {
				for r := q; r > 0 && linkBefore(s.EDist, pos[r], pos[r-1]); r-- {
					pos[r], pos[r-1] = pos[r-1], pos[r]
					if budget--; budget < 0 {
						sorted = false
						break
					}
				}
			}
		}
		if !sorted {
			n.sortBuf = n.sortBuf[:0]
			for e := e0; e < e1; e++ {
				n.sortBuf = append(n.sortBuf, latLink{s.EDist[e], int32(e)})
			}
			slices.SortFunc(n.sortBuf, func(a, b latLink) int {
				switch {
				case a.ms < b.ms || a.ms == b.ms && a.e < b.e:
					return -1
				case a.ms == b.ms && a.e == b.e:
					return 0
				}
				return 1
			})
			for q, l := range n.sortBuf {
				pos[q] = l.e
			}
		}
		for q, e := range pos {
			n.scl[e0+q] = s.ECl[e]
			n.sdist[e0+q] = s.EDist[e]
		}
	}
	n.ordLinks, n.ordDists = s.Links, s.Dists
	return true
}

// latLink is a link (position e in the dual's engine-major view) and its network latency.
type latLink struct {
	ms float64
	e  int32
}

// linkBefore reports whether link a comes before link b in the order of newtonOrder.
func linkBefore(dist []float64, a, b int32) bool {
	return dist[a] < dist[b] || dist[a] == dist[b] && a < b
}

// newtonEval computes, at levels mu, every engine's price, its bidders and their flows, the
// clusters' unmet demand (n.r) and the regularised dual function, which it returns.
func (s *Solver) newtonEval(mu []float64) float64 {
	n := &s.newt
	ne := len(s.Load)
	clear(n.served)
	n.alink = n.alink[:0]
	n.ax = n.ax[:0]
	// Levels with -Inf for the clusters that do not take part: they never bid.
	n.lv = flow.GrowRaw(n.lv, len(mu))
	lv := n.lv
	top := math.Inf(-1) // the highest level
	for i, a := range n.act {
		lv[i] = math.Inf(-1)
		if a {
			lv[i] = mu[i]
			top = math.Max(top, mu[i])
		}
	}
	h := 0.0
	for j := 0; j < ne; j++ {
		n.astart[j] = len(n.alink)
		e0, e1 := s.EStart[j], s.EStart[j+1]
		if e0 == e1 || math.IsInf(n.m0[j], 1) {
			continue
		}
		scl, sdist, spos, reach := s.ECl[e0:e1], s.EDist[e0:e1], []int32(nil), math.Inf(1)
		if n.ordered {
			scl, sdist, spos, reach = n.scl[e0:e1], n.sdist[e0:e1], n.spos[e0:e1], top
		}
		eps, c := n.eps[j], s.Cap[j]
		// One pass, by ascending latency: the top bid, and the candidates above the running
		// threshold (the top bid so far minus ε·C, and at least m0), filtered again once the
		// top bid is known. Nobody below bmax − ε·C can be above the price. The pass stops at
		// the first link at which the highest level bids no more than the threshold: the
		// bids of that link and of all later ones (farther) are at most that. (Without the
		// order, the links are in cluster order and the pass does not stop: reach is +Inf.)
		cs := len(n.alink)
		m0, band := n.m0[j], eps*c
		bmax, thr := math.Inf(-1), m0
		for q, i := range scl {
			dq := sdist[q]
			if reach-dq <= thr {
				break
			}
			b := lv[i] - dq
			if b <= thr {
				continue
			}
			if b > bmax {
				bmax = b
				if thr = b - band; thr < m0 { // m0 and the bids are finite
					thr = m0
				}
			}
			if spos != nil {
				n.alink = append(n.alink, spos[q])
			} else {
				n.alink = append(n.alink, int32(e0+q))
			}
			n.ax = append(n.ax, b)
		}
		if !(bmax > n.m0[j]) {
			n.p[j], n.px[j] = bmax, math.NaN()
			n.alink, n.ax = n.alink[:cs], n.ax[:cs]
			continue
		}
		lo := thr
		w := cs
		for q := cs; q < len(n.ax); q++ {
			if n.ax[q] > lo {
				n.alink[w], n.ax[w] = n.alink[q], n.ax[q]
				w++
			}
		}
		n.alink, n.ax = n.alink[:w], n.ax[:w]
		bids := n.ax[cs:]
		// G(p) = Σ (b − p)+/ε − X(p), decreasing; G(lo) ≥ 0 > G(bmax).
		a, b := lo, bmax
		// Start from the last price: its supply, read at the end of the last evaluation
		// (px), is known.
		pr, px := n.p[j], n.px[j]
		known := !math.IsNaN(px)
		if !(pr > a && pr < b) {
			pr, known = b-0.5*math.Min(b-a, eps*c), false
		}
		var sl float64
		n.px[j] = math.NaN() // until the loop ends at a price it read the supply at
		for it := 0; it < 100; it++ {
			sum, cnt := 0.0, 0
			for _, v := range bids {
				if v > pr {
					sum += v - pr
					cnt++
				}
			}
			var x, dx float64
			if known {
				x, dx, known = px, n.sl[j], false
			} else {
				x, dx = s.Curves[j].InverseMarginal(pr)
			}
			sl = dx
			g := sum/eps - x
			// The bids are exact only to their rounding: stop at a residual of that order.
			if math.Abs(g) <= 1e-13*(c+x)+4e-16*float64(cnt+1)*math.Abs(pr)/eps {
				n.px[j] = x
				break
			}
			if g > 0 {
				a = pr
			} else {
				b = pr
			}
			if b-a <= 1e-15*(math.Abs(a)+math.Abs(b)) {
				n.px[j] = x
				break
			}
			next := pr - g/(-float64(cnt)/eps-dx)
			if !(next > a && next < b) {
				next = 0.5 * (a + b)
			}
			pr = next
		}
		n.p[j], n.sl[j] = pr, sl
		// Keep the bidders above the price, with their flows.
		w = cs
		X, bx, xx := 0.0, 0.0, 0.0
		for q, v := range bids {
			if v > pr {
				x := (v - pr) / eps
				n.alink[w] = n.alink[cs+q]
				n.ax[w] = x
				w++
				X += x
				bx += v * x
				xx += x * x
				n.served[s.ECl[n.alink[w-1]]] += x
			}
		}
		n.alink, n.ax = n.alink[:w], n.ax[:w]
		h += bx - X*s.Curves[j].Latency(X) - 0.5*eps*xx
	}
	n.astart[ne] = len(n.alink)
	q := -h
	for i, a := range n.act {
		n.r[i] = 0
		if a {
			n.r[i] = s.Demand[i] - n.served[i]
			q += mu[i] * s.Demand[i]
			if n.shed {
				sh, conj, _ := s.newtonShed(i, mu[i])
				n.r[i] -= sh
				q -= conj
			}
		}
	}
	return q
}

// newtonShed returns, in shed mode, cluster i's regularised shed at level mu, the conjugate of
// its shed cost there and the derivative of the shed: class q's shed costs P_q·s +
// δ·s²/(2·D_q), so that it is shed from level P_q and entirely from P_q + δ.
func (s *Solver) newtonShed(i int, mu float64) (shed, conj, slope float64) {
	n := &s.newt
	dem := &s.Classes[i]
	for q, D := range dem {
		if !(D > 0) {
			continue
		}
		switch t := mu - s.Opt.ShedPriceMs[q]; {
		case t <= 0:
		case t < n.delta:
			shed += D * t / n.delta
			conj += D * t * t / (2 * n.delta)
			slope += D / n.delta
		default:
			shed += D
			conj += D * (t - n.delta/2)
		}
	}
	return shed, conj, slope
}

// newtonColdLevels sets the levels of a cold start, one common level plus each cluster's
// nearest network latency, and returns the common level.
func (s *Solver) newtonColdLevels() float64 {
	n := &s.newt
	common := s.CommonLevel()
	M := common
	if n.shed {
		// Demand above the capacity puts the common level at the supply's pole: start in
		// the regularised shed of the cheapest class instead.
		common = math.Min(common, s.cheapestShedPrice()+0.5*s.Opt.Tolerance*s.newtonShedScale())
	}
	for i := range n.act {
		if !n.act[i] {
			continue
		}
		lo := math.Inf(1)
		for k := s.Start[i]; k < s.Start[i+1]; k++ {
			lo = math.Min(lo, s.Dist[k])
		}
		n.mu[i] = common + lo
	}
	return M
}

// cheapestShedPrice returns the lowest shed price of a class with demand (+Inf: none).
func (s *Solver) cheapestShedPrice() float64 {
	P := math.Inf(1)
	for i := range s.Classes {
		for q, D := range s.Classes[i] {
			if D > 0 {
				P = math.Min(P, s.Opt.ShedPriceMs[q])
			}
		}
	}
	return P
}

// newtonShedScale returns the latency scale of the regularisation in shed mode: the mean
// engine-side latency, weighted by capacity, where each engine's marginal cost reaches the
// lowest shed price of a class with demand (the latencies at which the optimum starts to shed).
func (s *Solver) newtonShedScale() float64 {
	P := s.cheapestShedPrice()
	sum, w := 0.0, 0.0
	for j := range s.Curves {
		if c := s.Cap[j]; c > 0 {
			x, _ := s.Curves[j].InverseMarginal(P)
			sum += c * s.Curves[j].Latency(x)
			w += c
		}
	}
	if !(w > 0) {
		return math.NaN()
	}
	return sum / w
}

// newtonStep computes the Newton step (n.step) from the last evaluation: it solves
// J·step = r per component of the Hessian J.
func (s *Solver) newtonStep() bool {
	n := &s.newt
	nc, ne := len(s.Demand), len(s.Load)
	for i := range n.uf {
		n.uf[i] = int32(i)
	}
	for j := 0; j < ne; j++ {
		a0, a1 := n.astart[j], n.astart[j+1]
		if a1-a0 < 2 {
			continue
		}
		r0 := n.find(s.ECl[n.alink[a0]])
		for _, e := range n.alink[a0+1 : a1] {
			r1 := n.find(s.ECl[e])
			if r0 != r1 {
				if r1 < r0 {
					r0, r1 = r1, r0
				}
				n.uf[r1] = r0
			}
		}
	}
	n.cstart = flow.Grow(n.cstart, nc+1)
	for i := 0; i < nc; i++ {
		if n.act[i] {
			n.cstart[n.find(int32(i))+1]++
		}
	}
	for i := 0; i < nc; i++ {
		n.cstart[i+1] += n.cstart[i]
	}
	n.cmem = flow.Grow(n.cmem, n.cstart[nc])
	fill := n.loc // scratch, overwritten below
	for i := 0; i < nc; i++ {
		fill[i] = int32(n.cstart[i])
	}
	for i := 0; i < nc; i++ {
		if n.act[i] {
			r := n.find(int32(i))
			n.cmem[fill[r]] = int32(i)
			fill[r]++
		}
	}
	for r := 0; r < nc; r++ {
		mem := n.cmem[n.cstart[r]:n.cstart[r+1]]
		for l, i := range mem {
			n.loc[i] = int32(l)
		}
	}
	// An engine belongs to the component of its bidders: assemble every component's dense
	// block in one pass over the engines, each block at its offset in one buffer.
	n.boff = flow.GrowRaw(n.boff, nc)
	total := 0
	for r := 0; r < nc; r++ {
		n.boff[r] = total
		m := n.cstart[r+1] - n.cstart[r]
		total += m * m
	}
	boff := n.boff
	n.mat = flow.Grow(n.mat, total)
	n.rhs = flow.Grow(n.rhs, nc)
	for j := 0; j < ne; j++ {
		a0, a1 := n.astart[j], n.astart[j+1]
		if a0 == a1 {
			continue
		}
		eps, sl := n.eps[j], n.sl[j]
		if a1-a0 == 1 {
			i := s.ECl[n.alink[a0]]
			r := n.find(i)
			m := n.cstart[r+1] - n.cstart[r]
			l := int(n.loc[i])
			n.mat[boff[r]+l*m+l] += sl / (1 + eps*sl)
			continue
		}
		cnt := float64(a1 - a0)
		c := 1 / (cnt + eps*sl)
		r := n.find(s.ECl[n.alink[a0]])
		m := n.cstart[r+1] - n.cstart[r]
		blk := n.mat[boff[r] : boff[r]+m*m]
		for _, e := range n.alink[a0:a1] {
			la := int(n.loc[s.ECl[e]])
			blk[la*m+la] += 1 / eps
			for _, f := range n.alink[a0:a1] {
				lb := int(n.loc[s.ECl[f]])
				blk[la*m+lb] -= c / eps
			}
		}
	}
	if n.shed {
		for i := 0; i < nc; i++ {
			if !n.act[i] {
				continue
			}
			if _, _, sl := s.newtonShed(i, n.mu[i]); sl > 0 {
				r := n.find(int32(i))
				m := n.cstart[r+1] - n.cstart[r]
				l := int(n.loc[i])
				n.mat[boff[r]+l*m+l] += sl
			}
		}
	}
	for r := 0; r < nc; r++ {
		mem := n.cmem[n.cstart[r]:n.cstart[r+1]]
		m := len(mem)
		if m == 0 {
			continue
		}
		blk := n.mat[boff[r] : boff[r]+m*m]
		if m == 1 && !(blk[0] > 0) {
			// A cluster with no engine above its price: raise its level to where its cheapest
			// engine starts to take traffic.
			i := int(mem[0])
			lo, best := math.Inf(1), -1
			for k := s.Start[i]; k < s.Start[i+1]; k++ {
				j := s.Eng[k]
				if pj := math.Max(n.p[j], n.m0[j]); pj+s.Dist[k] < lo {
					lo, best = pj+s.Dist[k], int(j)
				}
			}
			n.step[i] = 0
			if best >= 0 && !math.IsInf(lo, 0) {
				// Enter it by as much as its unmet demand needs at the current price.
				n.step[i] = lo - n.mu[i] + n.eps[best]*math.Max(n.r[i], 0) + 1e-9*(math.Abs(lo)+1)
			}
			if n.shed {
				// Stop in the middle of the regularised shed of the first class priced on
				// the way (up with unmet demand, down with surplus).
				for q, D := range s.Classes[i] {
					P := s.Opt.ShedPriceMs[q] + n.delta/2
					if D > 0 && (n.r[i] > 0 && P > n.mu[i] && (n.step[i] == 0 || P < n.mu[i]+n.step[i]) ||
						n.r[i] < 0 && P < n.mu[i] && P > n.mu[i]+n.step[i]) {
						n.step[i] = P - n.mu[i]
					}
				}
			}
			continue
		}
		rhs := n.rhs[:m]
		maxd := 0.0
		for l := 0; l < m; l++ {
			maxd = math.Max(maxd, blk[l*m+l])
		}
		if !(maxd > 0) {
			maxd = 1
		}
		for l, i := range mem {
			rhs[l] = n.r[i]
			// Damping: a tiny multiple of the largest diagonal keeps flat directions (a cluster
			// without an engine above its price) solvable; the step cap bounds them.
			blk[l*m+l] += 1e-12 * maxd
		}
		if !n.orderedSolve(blk, rhs, m) {
			return false
		}
		for l, i := range mem {
			n.step[i] = rhs[l]
		}
	}
	return true
}

// cholSolve solves A·x = b in place (b becomes x) for a symmetric positive definite m×m
// matrix A (row-major; overwritten by its Cholesky factor), using first (scratch of m ints)
// for the rows' envelopes: the factor has no entries left of a row's first non-zero, so a
// banded A (clusters of a component that share engines with their neighbours in index order)
// costs m·band² instead of m³. It reports false when A is not positive definite.
func cholSolve(A, b []float64, m int, first []int) bool {
	for i := 0; i < m; i++ {
		ri := A[i*m : i*m+m]
		f := 0
		for f < i && ri[f] == 0 {
			f++
		}
		first[i] = f
	}
	for k := 0; k < m; k++ {
		rk := A[k*m : k*m+m]
		v := rk[k] - dot(rk[first[k]:k], rk[first[k]:k])
		if !(v > 0) {
			return false
		}
		v = math.Sqrt(v)
		rk[k] = v
		for i := k + 1; i < m; i++ {
			if first[i] > k {
				continue
			}
			ri := A[i*m : i*m+m]
			lo := max(first[i], first[k])
			ri[k] = (ri[k] - dot(ri[lo:k], rk[lo:k])) / v
		}
	}
	for i := 0; i < m; i++ {
		ri := A[i*m : i*m+m]
		b[i] = (b[i] - dot(ri[first[i]:i], b[first[i]:i])) / ri[i]
	}
	for i := m - 1; i >= 0; i-- {
		v := b[i]
		for t := i + 1; t < m; t++ {
			if first[t] <= i {
				v -= A[t*m+i] * b[t]
			}
		}
		b[i] = v / A[i*m+i]
	}
	return true
}

// dot returns Σ a[t]·b[t] (len(b) ≥ len(a)), summed in four interleaved parts: one running
// sum would make every step wait for the previous addition.
func dot(a, b []float64) float64 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float64
	n := len(a) &^ 3
	for t := 0; t < n; t += 4 {
		s0 += a[t] * b[t]
		s1 += a[t+1] * b[t+1]
		s2 += a[t+2] * b[t+2]
		s3 += a[t+3] * b[t+3]
	}
	for t := n; t < len(a); t++ {
		s0 += a[t] * b[t]
	}
	return (s0 + s1) + (s2 + s3)
}

// newtonFlows writes the flows of the last evaluation into the solver's buffers, scaled so
// that every cluster serves its demand exactly. Only the links above their engine's price
// carry flow: the loads are summed over those, engine by engine.
func (s *Solver) newtonFlows() {
	n := &s.newt
	nc, ne := len(s.Demand), len(s.Load)
	for i := 0; i < nc; i++ {
		// n.served becomes the factor of cluster i's flows.
		switch f := 1.0; {
		case n.act[i]:
			sh := 0.0
			if n.shed {
				sh, _, _ = s.newtonShed(i, n.mu[i])
				sh = math.Min(sh, s.Demand[i])
			}
			if n.served[i] > 0 {
				f = (s.Demand[i] - sh) / n.served[i]
			} else if n.shed {
				sh = s.Demand[i]
			}
			n.served[i] = f
			s.Shed[i] = sh
			s.Mu[i] = n.mu[i]
		case s.Demand[i] > 0:
			n.served[i] = f
			s.Shed[i] = s.Demand[i]
			s.Mu[i] = math.Inf(1)
		default:
			n.served[i] = f
			s.Shed[i] = 0
			s.Mu[i] = math.NaN()
		}
	}
	clear(s.Flow)
	for j := 0; j < ne; j++ {
		X := 0.0
		for a := n.astart[j]; a < n.astart[j+1]; a++ {
			e := n.alink[a]
			v := n.ax[a] * n.served[s.ECl[e]]
			s.Flow[s.EIn[e]] = v
			X += v
		}
		s.Load[j] = math.Min(X, s.Cap[j])
		if n.shed && X > s.Cap[j] {
			// The scaling pushed an engine at its hard limit over it: scale its flows back
			// and shed what they lose.
			f := s.Cap[j] / X
			for a := n.astart[j]; a < n.astart[j+1]; a++ {
				k := s.EIn[n.alink[a]]
				s.Shed[s.ClOf[k]] += s.Flow[k] * (1 - f)
				s.Flow[k] *= f
			}
		}
	}
}

// orderedSolve solves the m×m block A·x = b (b becomes x) after reordering it by reverse
// Cuthill-McKee, which keeps the envelope of a block whose clusters share engines with a few
// neighbours narrow whatever the clusters' indices. It reports false when A is not positive
// definite.
func (n *newtonState) orderedSolve(A, b []float64, m int) bool {
	n.first = flow.GrowRaw(n.first, m)
	if m <= 2 {
		return cholSolve(A, b, m, n.first)
	}
	// Adjacency from the non-zeros.
	n.adjStart = flow.GrowRaw(n.adjStart, m+1)
	n.adj = n.adj[:0]
	n.deg = flow.GrowRaw(n.deg, m)
	for l := 0; l < m; l++ {
		n.adjStart[l] = len(n.adj)
		row := A[l*m : l*m+m]
		for c, v := range row {
			if v != 0 && c != l {
				n.adj = append(n.adj, int32(c))
			}
		}
		n.deg[l] = len(n.adj) - n.adjStart[l]
	}
	n.adjStart[m] = len(n.adj)
	// Cuthill-McKee: breadth-first from a node of least degree in each connected part,
	// neighbours by ascending degree (ties by index); then reversed.
	n.perm = n.perm[:0]
	n.rank = flow.GrowRaw(n.rank, m)
	for l := range n.rank {
		n.rank[l] = -1
	}
	for len(n.perm) < m {
		start := -1
		for l := 0; l < m; l++ {
			if n.rank[l] < 0 && (start < 0 || n.deg[l] < n.deg[start]) {
				start = l
			}
		}
		n.rank[start] = len(n.perm)
		n.perm = append(n.perm, start)
		for h := len(n.perm) - 1; h < len(n.perm); h++ {
			v := n.perm[h]
			from := len(n.perm)
			for _, c := range n.adj[n.adjStart[v]:n.adjStart[v+1]] {
				if n.rank[c] < 0 {
					n.rank[c] = len(n.perm)
					n.perm = append(n.perm, int(c))
				}
			}
			added := n.perm[from:]
			// Insertion sort by degree, then index: the lists are short.
			for a := 1; a < len(added); a++ {
				for q := a; q > 0 && (n.deg[added[q]] < n.deg[added[q-1]] || n.deg[added[q]] == n.deg[added[q-1]] && added[q] < added[q-1]); q-- {
					added[q], added[q-1] = added[q-1], added[q]
				}
			}
			for q, c := range added {
				n.rank[c] = from + q
			}
		}
	}
	slices.Reverse(n.perm)
	for pos, l := range n.perm {
		n.rank[l] = pos
	}
	n.pmat = flow.GrowRaw(n.pmat, m*m)
	n.prhs = flow.GrowRaw(n.prhs, m)
	for pa, la := range n.perm {
		src := A[la*m : la*m+m]
		dst := n.pmat[pa*m : pa*m+m]
		for lb, v := range src {
			dst[n.rank[lb]] = v
		}
		n.prhs[pa] = b[la]
	}
	if !cholSolve(n.pmat, n.prhs, m, n.first) {
		return false
	}
	for pa, la := range n.perm {
		b[la] = n.prhs[pa]
	}
	return true
}

// Partial reports whether the last Solve failed with the shed modelled settled but its
// certificate open: its point is in the state, for the sweeps to go on from.
func (s *Solver) Partial() bool { return s.newt.partial }

// Cert returns the certificate of the last Solve's point.
func (s *Solver) Cert() *flow.Measures { return &s.newt.m }

// Steps returns the Newton steps of the last Solve.
func (s *Solver) Steps() int { return s.newt.steps }
