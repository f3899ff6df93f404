// Package levels holds the level solver: a dual ascent on the clusters' marginal-cost levels
// in which clusters whose bids tie on an engine move together, each round solving one
// one-dimensional equation per component (docs/optimizer.md). It settles small problems in a
// few rounds with exact ties.
package levels

import (
	"math"

	"github.com/switchyard-dev/switchyard/optimizer/flow"
)

// Solver runs the level solver on a flow.State; it keeps its buffers between solves.
type Solver struct {
	*flow.State
	dual dualState
}

// The dual solver works on the clusters' marginal-cost levels μ_i. Given the levels, cluster i
// bids μ_i − d_ij for engine j; every engine goes to its highest bidder at the price of that
// bid and supplies X_j(price) = F_j'^{-1}(price) (capped at its hard limit). Clusters whose bids
// tie on an engine that supplies traffic share it; they form a component that moves its levels
// together (all by the same shift, keeping the ties). Each round solves, for every component
// with unmet demand (rounds alternate with those with surplus), the one-dimensional equation
// "demand = supply of the engines it wins" for the shift, stopping at the first shift where it
// would tie with another component on an engine (the two then merge). After balancing, the
// flows over the shared engines follow from the spanning forest of the ties; a part of a
// component that would need a negative flow is split off. This is a dual ascent with
// set-valued coordinates (as in Bertsekas' relaxation method) on a problem whose dual has only
// as many variables as clusters; every round costs O(links).

// dualState holds the buffers of the level solver; the engine-major view of the links is the
// state's (flow.State.EngineView).
type dualState struct {
	lv           []float64 // level of each active cluster, -Inf for the others (dualBids)
	m0           []float64 // marginal cost at zero load per engine
	b1           []float64 // top bid per engine
	w1           []int32   // top bidder (-1: none)
	tied         []bool    // engine shared by several clusters of its winner's component
	tree         []bool    // CSR edge is in the spanning forest of ties
	uf           []int32   // union-find parents over clusters
	root         []int32   // every cluster's component root, during dualComponents
	wroot        []int32   // component root of each engine's winner (-1: none), in dualLimits
	wtop         []float64 // bid that ties with each engine's winner (+Inf: none), in dualLimits
	active       []bool    // cluster takes part (positive demand and links)
	dem, need    []float64 // served demand at the current level; demand left after exclusive engines
	f, up, down  []float64 // per component root: imbalance and admissible shifts
	mstart       []int     // members of component roots, by counting sort
	mem          []int32
	jstart       []int // engines won by component roots
	jmem         []int32
	sup          []float64 // engine load
	order        []int32   // forest BFS order of nodes (clusters ≥ 0, engines as -1-j)
	par          []int32   // parent edge of each node (CSR edge, -1 for roots), clusters then engines
	req, shift   []float64 // per node
	nodeIsActive []bool
}

func (d *dualState) find(i int32) int32 {
	for d.uf[i] != i {
		d.uf[i] = d.uf[d.uf[i]]
		i = d.uf[i]
	}
	return i
}

// union joins the sets of a and b, keeping the smaller root (determinism), and reports whether
// they were apart.
func (d *dualState) union(a, b int32) bool {
	ra, rb := d.find(a), d.find(b)
	if ra == rb {
		return false
	}
	if rb < ra {
		ra, rb = rb, ra
	}
	d.uf[rb] = ra
	return true
}

func tieTol(b float64) float64 { return 1e-11 * (math.Abs(b) + 1) }

// servedDemand returns the demand cluster i serves at level mu: classes whose shed price is
// below the level are shed.
func (s *Solver) servedDemand(i int, mu float64) float64 {
	dem := &s.Classes[i]
	v := 0.0
	for q := range dem {
		if !(s.Opt.ShedPriceMs[q] < mu) {
			v += dem[q]
		}
	}
	return v
}

// Solve runs the dual solver from the levels in s.Mu (NaN: cold) and leaves flows, loads,
// shed and levels in the solver's buffers. It reports whether it balanced every component.
func (s *Solver) Solve(maxRounds int) (rounds int, ok bool) {
	nc, ne := len(s.Demand), len(s.Load)
	d := &s.dual
	s.EngineView()
	d.m0 = flow.Grow(d.m0, ne)
	for j := 0; j < ne; j++ {
		if s.Cap[j] > 0 {
			d.m0[j] = s.Curves[j].Marginal(0)
		} else {
			d.m0[j] = math.Inf(1)
		}
	}
	d.active = flow.Grow(d.active, nc)
	d.dem = flow.Grow(d.dem, nc)
	d.need = flow.Grow(d.need, nc)
	common := math.NaN()
	for i := 0; i < nc; i++ {
		if s.Demand[i] > 0 && s.Start[i+1] > s.Start[i] {
			d.active[i] = true
			if math.IsNaN(s.Mu[i]) || math.IsInf(s.Mu[i], 0) {
				if math.IsNaN(common) {
					common = s.CommonLevel()
				}
				lo := math.Inf(1)
				for k := s.Start[i]; k < s.Start[i+1]; k++ {
					lo = math.Min(lo, s.Dist[k])
				}
				s.Mu[i] = common + lo
			}
		}
	}
	d.b1 = flow.Grow(d.b1, ne)
	d.w1 = flow.Grow(d.w1, ne)
	d.tied = flow.Grow(d.tied, ne)
	d.tree = flow.GrowRaw(d.tree, len(s.Eng)) // cleared by dualBids
	d.uf = flow.Grow(d.uf, nc)
	d.f = flow.Grow(d.f, nc)
	d.up = flow.Grow(d.up, nc)
	d.down = flow.Grow(d.down, nc)
	d.sup = flow.Grow(d.sup, ne)
	d.req = flow.Grow(d.req, nc+ne)
	d.shift = flow.Grow(d.shift, nc+ne)
	d.par = flow.Grow(d.par, nc+ne)
	d.nodeIsActive = flow.Grow(d.nodeIsActive, nc)

	phaseUp := true
	for rounds = 0; rounds < maxRounds && !s.Expired(s.FastEnd); rounds++ {
		s.dualBids()
		if s.dualComponents() {
			if !s.dualForest() {
				return rounds + 1, true
			}
			phaseUp = !phaseUp
			continue
		}
		// Phases alternate; a phase in which no component would move is skipped rather than
		// spending a round on it.
		if !s.dualAnyMoves(phaseUp) {
			phaseUp = !phaseUp
		}
		s.dualLimits(phaseUp)
		s.dualMove(phaseUp)
		phaseUp = !phaseUp
	}
	s.dualBids()
	s.dualComponents()
	s.dualForest()
	return rounds, false
}

// dualBids computes every engine's top bid and bidder, the ties and the components.
func (s *Solver) dualBids() {
	d := &s.dual
	for i := range d.uf {
		d.uf[i] = int32(i)
	}
	clear(d.tree)
	d.lv = flow.Grow(d.lv, len(s.Mu))
	for i, a := range d.active {
		d.lv[i] = math.Inf(-1)
		if a {
			d.lv[i] = s.Mu[i]
		}
	}
	lv := d.lv
	for j := range d.b1 {
		e0, e1 := s.EStart[j], s.EStart[j+1]
		ecl, edist := s.ECl[e0:e1], s.EDist[e0:e1]
		// The top bid and the second one: when the second is below the tie threshold, the
		// engine has no ties and the second pass is skipped.
		b1, b2, w := math.Inf(-1), math.Inf(-1), int32(-1)
		for e, i := range ecl {
			b := lv[i] - edist[e]
			if b > b1 {
				b1, b2, w = b, b1, i
			} else if b > b2 {
				b2 = b
			}
		}
		if math.IsInf(b1, -1) {
			w = -1
		}
		d.b1[j], d.w1[j], d.tied[j] = b1, w, false
		if w < 0 || !(b1 > d.m0[j]) {
			continue
		}
		thr := b1 - tieTol(b1)
		if b2 < thr {
			continue
		}
		for e, i := range ecl {
			if i == w || !d.active[i] || s.Mu[i]-edist[e] < thr {
				continue
			}
			d.tied[j] = true
			if d.union(w, i) {
				d.tree[s.EIn[e0+e]] = true
			}
		}
	}
}

// dualComponents groups clusters and won engines by component, computes every component's
// imbalance (demand minus supply) and reports whether every component is balanced.
func (s *Solver) dualComponents() bool {
	d := &s.dual
	nc := len(s.Demand)
	// The components are fixed here (dualBids made the unions): look the roots up once.
	d.root = flow.Grow(d.root, nc)
	for i := 0; i < nc; i++ {
		d.root[i] = d.find(int32(i))
	}
	for i := 0; i < nc; i++ {
		d.f[i], d.up[i], d.down[i] = 0, math.Inf(1), math.Inf(-1)
	}
	for i := 0; i < nc; i++ {
		if d.active[i] {
			d.dem[i] = s.servedDemand(i, s.Mu[i])
			d.f[d.root[i]] += d.dem[i]
		}
	}
	for j := range d.b1 {
		w := d.w1[j]
		d.sup[j] = 0
		if w < 0 || !(d.b1[j] > d.m0[j]) {
			continue
		}
		d.sup[j], _ = s.Curves[j].InverseMarginal(d.b1[j])
		d.f[d.root[w]] -= d.sup[j]
	}
	balanced := true
	for i := 0; i < nc; i++ {
		if d.active[i] && d.root[i] == int32(i) && math.Abs(d.f[i]) > s.balTol(i) {
			balanced = false
		}
	}
	return balanced
}

// dualAnyMoves reports whether dualMove would shift any component in the phase.
func (s *Solver) dualAnyMoves(up bool) bool {
	d := &s.dual
	for i := range s.Demand {
		if d.active[i] && d.root[i] == int32(i) && s.dualMoves(i, up) {
			return true
		}
	}
	return false
}

// dualLimits computes the admissible shifts of the components that dualMove shifts in the
// phase (up or down): how far each may move before it ties with another component.
func (s *Solver) dualLimits(up bool) {
	d := &s.dual
	nc := len(s.Demand)
	if up {
		// A rising component ties with the winner of an engine it does not win. Per engine:
		// the winner's component and the bid that ties with it (+Inf: none); then scan the
		// rows of the rising components' members (contiguous in the CSR arrays).
		d.wroot = flow.Grow(d.wroot, len(d.b1))
		d.wtop = flow.Grow(d.wtop, len(d.b1))
		for j := range d.b1 {
			d.wroot[j], d.wtop[j] = -1, math.Inf(1)
			w := d.w1[j]
			if w < 0 {
				continue
			}
			rw := d.root[w]
			d.wroot[j] = rw
			top := d.b1[j]
			if top < d.m0[j] {
				// No supply at the top bid: only a rising winner can conflict, at m0.
				if !(d.f[rw] > 0) {
					continue
				}
				top = d.m0[j]
			}
			d.wtop[j] = top
		}
		for i := 0; i < nc; i++ {
			ri := d.root[i]
			if !d.active[i] || !s.dualMoves(int(ri), true) {
				continue
			}
			mu, lim := s.Mu[i], d.up[ri]
			e0, e1 := s.Start[i], s.Start[i+1]
			dist := s.Dist[e0:e1]
			for e, j := range s.Eng[e0:e1] {
				if d.wroot[j] == ri {
					continue
				}
				if g := d.wtop[j] - (mu - dist[e]); g < lim {
					lim = g
				}
			}
			d.up[ri] = math.Max(lim, 0)
		}
		return
	}
	// A falling component loses an engine it wins to the best bid from outside it.
	for j := range d.b1 {
		w := d.w1[j]
		if w < 0 {
			continue
		}
		rw := d.root[w]
		if !s.dualMoves(int(rw), false) {
			continue
		}
		out := math.Inf(-1)
		e0, e1 := s.EStart[j], s.EStart[j+1]
		edist := s.EDist[e0:e1]
		for e, i := range s.ECl[e0:e1] {
			if !d.active[i] || d.root[i] == rw {
				continue
			}
			if b := s.Mu[i] - edist[e]; b > out {
				out = b
			}
		}
		if out >= d.m0[j] {
			if g := out - d.b1[j]; g > d.down[rw] {
				d.down[rw] = math.Min(g, 0)
			}
		}
	}
}

// dualMoves reports whether dualMove shifts the component rooted at r in the given phase: up
// when it has unmet demand, down when it has surplus.
func (s *Solver) dualMoves(r int, up bool) bool {
	tol := s.balTol(r)
	if up {
		return s.dual.f[r] > tol
	}
	return s.dual.f[r] < -tol
}

func (s *Solver) balTol(root int) float64 {
	return 1e-10 * (s.Demand[root] + 1)
}

// dualMove shifts the levels of every unbalanced component (with unmet demand when up, with
// surplus otherwise) to balance, or to the first shift at which it ties with another
// component.
func (s *Solver) dualMove(up bool) {
	d := &s.dual
	nc := len(s.Demand)
	// Members and won engines per root (counting sort).
	d.mstart = flow.GrowRaw(d.mstart, nc+1)
	clear(d.mstart)
	for i := 0; i < nc; i++ {
		if d.active[i] {
			d.mstart[d.find(int32(i))+1]++
		}
	}
	for i := 0; i < nc; i++ {
		d.mstart[i+1] += d.mstart[i]
	}
	d.mem = flow.Grow(d.mem, d.mstart[nc])
	pos := flow.Grow(d.order, nc)
	for i := 0; i < nc; i++ {
		pos[i] = int32(d.mstart[i])
	}
	for i := 0; i < nc; i++ {
		if d.active[i] {
			r := d.find(int32(i))
			d.mem[pos[r]] = int32(i)
			pos[r]++
		}
	}
	d.jstart = flow.GrowRaw(d.jstart, nc+1)
	clear(d.jstart)
	for j := range d.w1 {
		if d.w1[j] >= 0 {
			d.jstart[d.find(d.w1[j])+1]++
		}
	}
	for i := 0; i < nc; i++ {
		d.jstart[i+1] += d.jstart[i]
	}
	d.jmem = flow.Grow(d.jmem, d.jstart[nc])
	for i := 0; i < nc; i++ {
		pos[i] = int32(d.jstart[i])
	}
	for j := range d.w1 {
		if d.w1[j] >= 0 {
			r := d.find(d.w1[j])
			d.jmem[pos[r]] = int32(j)
			pos[r]++
		}
	}
	d.order = pos
	for r := 0; r < nc; r++ {
		if !d.active[r] || d.find(int32(r)) != int32(r) {
			continue
		}
		if !s.dualMoves(r, up) {
			continue
		}
		mem := d.mem[d.mstart[r]:d.mstart[r+1]]
		js := d.jmem[d.jstart[r]:d.jstart[r+1]]
		t := s.solveShift(mem, js, up, d.up[r], d.down[r])
		for _, i := range mem {
			s.Mu[i] += t
		}
	}
}

// imbalance returns demand minus supply of a component shifted by t, and its derivative.
func (s *Solver) imbalance(mem, js []int32, t float64) (float64, float64) {
	d := &s.dual
	v, dv := 0.0, 0.0
	for _, i := range mem {
		v += s.servedDemand(int(i), s.Mu[i]+t)
	}
	for _, j := range js {
		p := d.b1[j] + t
		if !(p > d.m0[j]) {
			continue
		}
		x, sl := s.Curves[j].InverseMarginal(p)
		v -= x
		dv -= sl
	}
	return v, dv
}

// solveShift finds the shift of a component's levels that balances it, within [lo, 0] or
// [0, hi].
func (s *Solver) solveShift(mem, js []int32, up bool, hi, lo float64) float64 {
	var a, b float64 // f(a) > 0 ≥ f(b) sought, a < b
	if up {
		a = 0
		if !math.IsInf(hi, 1) {
			if fv, _ := s.imbalance(mem, js, hi); fv > 0 {
				return hi
			}
			b = hi
		} else {
			step := 1.0
			for {
				fv, _ := s.imbalance(mem, js, step)
				if fv <= 0 {
					b = step
					break
				}
				a = step
				step *= 4
				if step > 1e15 {
					return a
				}
			}
		}
	} else {
		b = 0
		if !math.IsInf(lo, -1) {
			if fv, _ := s.imbalance(mem, js, lo); fv < 0 {
				return lo
			}
			a = lo
		} else {
			step := -1.0
			for {
				fv, _ := s.imbalance(mem, js, step)
				if fv > 0 {
					a = step
					break
				}
				b = step
				step *= 4
				if step < -1e15 {
					return b
				}
			}
		}
	}
	tol := 0.0
	for _, i := range mem {
		tol += s.Demand[i]
	}
	tol *= 1e-13
	t := 0.5 * (a + b)
	for it := 0; it < 200; it++ {
		fv, dv := s.imbalance(mem, js, t)
		if math.Abs(fv) <= tol {
			return t
		}
		if fv > 0 {
			a = t
		} else {
			b = t
		}
		if b-a <= 1e-15*(math.Abs(a)+math.Abs(b)+1) {
			break
		}
		next := math.NaN()
		if dv < 0 {
			next = t - fv/dv
		}
		if !(next > a && next < b) {
			next = 0.5 * (a + b)
		}
		t = next
	}
	// A jump (a shed step or a flat marginal cost) lies between a and b: stop at its lower end
	// when rising, so that the component keeps its engines and the residual is shed.
	if up {
		return a
	}
	return b
}

// dualForest computes the flows from the current levels: engines not shared go to their
// winner; shared engines are split along the spanning forest of ties. It shifts the parts of
// components that would need a negative flow (splitting them) and reports whether it did.
func (s *Solver) dualForest() (split bool) {
	d := &s.dual
	nc, ne := len(s.Demand), len(s.Load)
	clear(s.Flow)
	for i := 0; i < nc; i++ {
		d.need[i] = 0
		if d.active[i] {
			d.need[i] = d.dem[i]
		}
	}
	// Engines not shared: all to the winner. Tree edges from the winner to shared engines.
	for j := 0; j < ne; j++ {
		w := d.w1[j]
		if w < 0 || d.sup[j] <= 0 {
			continue
		}
		if !d.tied[j] {
			k := s.edgeOf(int(w), j)
			s.Flow[k] = d.sup[j]
			d.need[w] -= d.sup[j]
			continue
		}
		d.tree[s.edgeOf(int(w), j)] = true
	}
	// BFS over the forest from each component's root cluster. Nodes: cluster i as i, engine j
	// as nc+j. par holds the CSR edge to the parent.
	order := d.order[:0]
	for v := range d.par {
		d.par[v] = -2
	}
	for r := 0; r < nc; r++ {
		if !d.active[r] || d.find(int32(r)) != int32(r) {
			continue
		}
		d.par[r] = -1
		order = append(order, int32(r))
		for h := len(order) - 1; h < len(order); h++ {
			v := int(order[h])
			if v < nc {
				for k := s.Start[v]; k < s.Start[v+1]; k++ {
					if j := nc + int(s.Eng[k]); d.tree[k] && d.par[j] == -2 {
						d.par[j] = int32(k)
						order = append(order, int32(j))
					}
				}
			} else {
				j := v - nc
				for _, k := range s.EIn[s.EStart[j]:s.EStart[j+1]] {
					if i := int(s.ClOf[k]); d.tree[k] && d.par[i] == -2 {
						d.par[i] = k
						order = append(order, int32(i))
					}
				}
			}
		}
	}
	d.order = order
	// Leaf elimination, children before parents.
	for v := range d.req {
		d.req[v] = 0
	}
	for h := len(order) - 1; h >= 0; h-- {
		v := int(order[h])
		if v < nc {
			d.req[v] += d.need[v] // minus what child engines gave (accumulated below)
			if k := d.par[v]; k >= 0 {
				d.req[nc+int(s.Eng[k])] += d.req[v] // the parent engine must give req[v]
				s.Flow[k] = d.req[v]
			}
		} else {
			j := v - nc
			avail := d.sup[j] - d.req[v]
			d.req[v] = -avail // reuse: stored as what the parent must supply (negative avail)
			if k := d.par[v]; k >= 0 {
				s.Flow[k] = avail
				d.req[s.ClOf[k]] -= avail
			}
		}
	}
	// Splits: shift the subtree below a negative flow out of its tie.
	split = false
	for v := range d.shift {
		d.shift[v] = 0
	}
	for _, v32 := range order {
		v := int(v32)
		k := d.par[v]
		if k < 0 {
			continue
		}
		parent := int(s.ClOf[k])
		if v < nc {
			parent = nc + int(s.Eng[k])
		}
		d.shift[v] = d.shift[parent]
		if s.Flow[k] < -1e-9*(d.sup[s.Eng[k]]+1) {
			split = true
			b := d.b1[s.Eng[k]]
			delta := 100 * tieTol(b)
			if v < nc {
				d.shift[v] -= delta // the cluster's subtree has surplus: lower it
			} else {
				d.shift[v] += delta // the engine's subtree lacks supply: raise it
			}
		}
	}
	if split {
		for i := 0; i < nc; i++ {
			s.Mu[i] += d.shift[i]
		}
		return true
	}
	// Final flows: clip rounding, loads, shed.
	clear(s.Load)
	for i := 0; i < nc; i++ {
		served := 0.0
		for k := s.Start[i]; k < s.Start[i+1]; k++ {
			if s.Flow[k] < 0 {
				s.Flow[k] = 0
			}
			served += s.Flow[k]
		}
		if served > s.Demand[i] {
			f := s.Demand[i] / served
			for k := s.Start[i]; k < s.Start[i+1]; k++ {
				s.Flow[k] *= f
			}
			served = s.Demand[i]
		}
		for k := s.Start[i]; k < s.Start[i+1]; k++ {
			s.Load[s.Eng[k]] += s.Flow[k]
		}
		s.Shed[i] = math.Max(0, s.Demand[i]-served)
		if !d.active[i] {
			if s.Demand[i] > 0 {
				s.Mu[i] = math.Inf(1)
			} else {
				s.Mu[i] = math.NaN()
			}
		}
	}
	for j := range s.Load {
		s.Load[j] = math.Min(s.Load[j], s.Cap[j])
	}
	return false
}

// edgeOf returns the CSR edge from cluster i to engine j (which must exist).
func (s *Solver) edgeOf(i, j int) int {
	lo, hi := s.Start[i], s.Start[i+1]
	for lo < hi {
		m := (lo + hi) / 2
		if int(s.Eng[m]) < j {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// Rounds bounds the rounds of the dual solver; past the bound Solve tries the auction's
// levels or falls back to sweeps, so the bound caps the time lost on problems where the rounds
// do not settle. A first try from a common level gets fewer rounds than one from good levels.
func (s *Solver) Rounds(good bool) int {
	if !good {
		return min(10*len(s.Demand)+100, 200)
	}
	return min(40*len(s.Demand)+200, 1000)
}
