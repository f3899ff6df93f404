// Package auction holds the auction: clusters bid for engines' capacity with ε-scaling and
// outbid the users of full engines, which gives the level solver better starting levels on
// problems where it does not settle (docs/optimizer.md).
package auction

import (
	"math"

	"github.com/switchyard-dev/switchyard/optimizer/flow"
)

// Solver runs the auction on a flow.State; it keeps its buffers between solves.
type Solver struct {
	*flow.State
	auc auctionState
}

// The auction solver is the fast path of Solve: an ε-relaxation (auction) method for the
// convex-cost transportation problem, with ε-scaling (Bertsekas and Castañon's auction for
// transportation problems, with divisible objects whose supply follows a convex cost).
//
// Every engine j has a price p_j, equal to its marginal cost F_j'(X_j) at its load (beyond it
// only at its hard limit, where the excess is the capacity price). A unit of cluster i's traffic
// on engine j costs d_ij + p_j, and d_ij − κ + p_j for the part up to the previous flow x⁰_ij
// when the cluster is anchored by a previous solution (the proximal term as a link cost that
// rises by 2κ at x⁰); shedding a unit of class q costs its shed price. The invariant is
// ε-complementary slackness: every unit of a cluster's traffic costs at most ε more than the
// cluster's cheapest unused option. A cluster with unplaced demand (surplus) bids: it raises its
// level μ until the supply it can take at that level — each engine's supply at price μ − d_ij
// minus what the engine's other users keep — covers the surplus; a user keeps its units on an
// engine as long as they cost at most ε more than its best other option, and is evicted (its
// units become its surplus) beyond. Within a phase prices only rise, so a bid disturbs no
// cluster but the evicted ones. Between phases ε shrinks (÷4) and units that cost more than the
// new ε above their cluster's cheapest option are evicted. At the end every unit costs at most
// ε above its cluster's level, which bounds the duality gap by about ε × served traffic; the
// gap is then certified by the same computation as for the sweeps (Measure), and Solve falls
// back to the sweeps if the certificate does not close.

// auctionState holds the buffers of the auction solver.
type auctionState struct {
	price   []float64 // per engine
	surplus []float64 // per cluster: demand neither placed nor shed
	best1   []float64 // per cluster: its cheapest option when it last bid or was restored
	best2   []float64 // and its cheapest on another engine
	bestJ   []int32   // the engine of best1 (-1: shed)
	shedQ   []float64 // per cluster and priority class: demand shed
	queue   []int32   // clusters with surplus, FIFO
	inQ     []bool
	cand    []auctionCand
	chunks  []auctionChunk
	bids    int
	saved   []float64 // Save: flows, then shed and levels per cluster
}

// auctionCand is an engine that a bidding cluster may take traffic from.
type auctionCand struct {
	k, j     int     // bidder's CSR edge and the engine
	c0, c1   int     // range of the engine's other users' chunks in auctionState.chunks
	keepRoom float64 // bidder's units left at the anchored (cheaper) cost
	ta, pa   float64 // take and engine price at the lower end of the level bracket
	tb, pb   float64 // and at the upper end
}

// auctionChunk is a part of another user's flow on a candidate engine, evicted when the
// engine's price exceeds theta.
type auctionChunk struct {
	theta, amt float64
	k          int // the user's CSR edge
}

// auctionSetup builds the engine-side index and the initial prices, shed split and surplus
// from the warm-started flows.
func (s *Solver) auctionSetup() {
	nc, ne := len(s.Demand), len(s.Load)
	// The engine-major view of the links is the state's, built once per network shape and
	// shared.
	s.EngineView()
	a := &s.auc
	a.price = flow.Grow(a.price, ne)
	a.surplus = flow.Grow(a.surplus, nc)
	a.best1 = flow.Grow(a.best1, nc)
	a.best2 = flow.Grow(a.best2, nc)
	a.bestJ = flow.Grow(a.bestJ, nc)
	a.shedQ = flow.Grow(a.shedQ, nc*flow.NumClasses)
	a.inQ = flow.Grow(a.inQ, nc)
	a.queue = a.queue[:0]
	a.bids = 0
	for i := 0; i < nc; i++ {
		left := s.Shed[i]
		dem := &s.Classes[i]
		for _, q := range s.Order {
			t := math.Min(left, dem[q])
			a.shedQ[i*flow.NumClasses+q] = t
			left -= t
		}
		a.surplus[i] = math.Max(0, left)
	}
	for j := 0; j < ne; j++ {
		a.price[j] = math.Inf(1)
		if s.Cap[j] > 0 {
			a.price[j] = s.leftMarginal(j, s.Load[j])
		}
	}
}

// leftMarginal returns the left derivative of engine j's cost at load x (the lowest price at
// which the engine supplies x).
func (s *Solver) leftMarginal(j int, x float64) float64 {
	if x <= 0 {
		return s.Curves[j].Marginal(0)
	}
	return math.Min(s.Curves[j].Marginal(x), s.Curves[j].Marginal(x*(1-1e-12)))
}

// unitCost returns the cost of cluster i's next unit on edge k (κ is the cluster's proximal
// price, 0 when it is not anchored).
func (s *Solver) unitCost(k int, kappa float64) float64 {
	c := s.Dist[k] + s.auc.price[s.Eng[k]]
	if kappa > 0 && s.Flow[k] < s.Flow0[k] {
		return c - kappa
	}
	return c + kappa
}

// nextShed returns the shed price of cluster i's cheapest class with unshed demand, +Inf if
// there is none.
func (s *Solver) nextShed(i int) float64 {
	dem := &s.Classes[i]
	for _, q := range s.Order {
		if s.auc.shedQ[i*flow.NumClasses+q] < dem[q] {
			return s.Opt.ShedPriceMs[q]
		}
	}
	return math.Inf(1)
}

// cacheBest records cluster i's cheapest option and its cheapest on another engine, counting
// an engine below its hard limit at the cost of a unit it can supply without evicting anyone:
// its right marginal cost (a points profile's loads sit at kinks, where the price paid is the
// left one; counting them at it would make restore evict units that no bid can place more
// cheaply, for ever). An engine at its limit counts at its price.
func (s *Solver) cacheBest(i int) {
	a := &s.auc
	kappa := s.Kappa(i)
	b1, b2, bj := s.nextShed(i), math.Inf(1), int32(-1)
	for k := s.Start[i]; k < s.Start[i+1]; k++ {
		j := int(s.Eng[k])
		if s.Cap[j] <= 0 {
			continue
		}
		c := s.unitCost(k, kappa)
		if s.Load[j] < s.Cap[j]*(1-1e-12) {
			if m := s.Curves[j].Marginal(s.Load[j]); m > a.price[j] {
				c += m - a.price[j]
			}
		}
		if c < b1 {
			b1, b2, bj = c, b1, int32(j)
		} else if c < b2 {
			b2 = c
		}
	}
	if bj < 0 {
		b2 = b1
	}
	a.best1[i], a.best2[i], a.bestJ[i] = b1, b2, bj
}

// otherOption returns cluster u's cached cheapest option other than engine j.
func (s *Solver) otherOption(u, j int) float64 {
	a := &s.auc
	if a.bestJ[u] == int32(j) {
		return a.best2[u]
	}
	return a.best1[u]
}

// enqueue queues cluster i for a bid if it has surplus and is not queued yet.
func (s *Solver) enqueue(i int) {
	a := &s.auc
	if !a.inQ[i] && a.surplus[i] > 1e-13*s.Demand[i] {
		a.inQ[i] = true
		a.queue = append(a.queue, int32(i))
	}
}

// avail returns the supply that candidate c's engine offers the bidder at price p: its supply
// at p minus what the others keep at p (chunks with theta < p are evicted), and its derivative.
func (s *Solver) avail(c *auctionCand, p float64) (float64, float64) {
	a := &s.auc
	if p < a.price[c.j] {
		return 0, 0 // prices do not fall within a phase
	}
	sup, sl := s.Curves[c.j].InverseMarginal(p)
	kept := s.Load[c.j]
	for _, ch := range a.chunks[c.c0:c.c1] {
		if ch.theta < p {
			kept -= ch.amt
		}
	}
	return sup - kept, sl
}

// take returns what the bidder takes from candidate c at level mu, the engine's price then and
// the derivative of the take.
func (s *Solver) take(c *auctionCand, mu, kappa float64) (t, price, slope float64) {
	d := s.Dist[c.k]
	pm := mu - d - kappa
	am, sm := s.avail(c, pm)
	if c.keepRoom <= 0 || am >= c.keepRoom {
		if am <= 0 {
			return 0, pm, 0
		}
		return am, pm, sm
	}
	pp := mu - d + kappa
	ap, sp := s.avail(c, pp)
	if ap <= c.keepRoom {
		if ap <= 0 {
			return 0, pp, 0
		}
		return ap, pp, sp
	}
	// The take stays at keepRoom while the price crosses from pm to pp; find where.
	lo, hi := pm, pp
	for it := 0; it < 200 && hi-lo > 1e-14*(math.Abs(hi)+1); it++ {
		mid := 0.5 * (lo + hi)
		if v, _ := s.avail(c, mid); v >= c.keepRoom {
			hi = mid
		} else {
			lo = mid
		}
	}
	return c.keepRoom, hi, 0
}

// shedAt returns the demand cluster i would shed beyond what it sheds now at level mu.
func (s *Solver) shedAt(i int, mu float64) float64 {
	dem := &s.Classes[i]
	v := 0.0
	for _, q := range s.Order {
		if s.Opt.ShedPriceMs[q] < mu {
			v += dem[q] - s.auc.shedQ[i*flow.NumClasses+q]
		}
	}
	return v
}

// total returns what cluster i takes at level mu over cands (and sheds), and its derivative.
func (s *Solver) total(i int, cands []auctionCand, mu, kappa float64) (float64, float64) {
	v, dv := s.shedAt(i, mu), 0.0
	for c := range cands {
		t, _, sl := s.take(&cands[c], mu, kappa)
		v += t
		dv += sl
	}
	return v, dv
}

// bracketRoot narrows [a, b] (total(a) < r ≤ total(b)) around the level where cluster i's
// total reaches r, by Newton's method safeguarded with bisection.
func (s *Solver) bracketRoot(i int, cands []auctionCand, r, a, b, kappa float64) (float64, float64) {
	tol := 1e-13 * s.Demand[i]
	mu := 0.5 * (a + b)
	for it := 0; it < 200; it++ {
		v, dv := s.total(i, cands, mu, kappa)
		if math.Abs(v-r) <= tol {
			return mu, mu
		}
		if v < r {
			a = mu
		} else {
			b = mu
		}
		if b-a <= 1e-15*(math.Abs(a)+math.Abs(b)) {
			break
		}
		next := math.NaN()
		if dv > 0 {
			next = mu - (v-r)/dv
		}
		if !(next > a && next < b) {
			next = 0.5 * (a + b)
		}
		mu = next
	}
	return a, b
}

// bid places cluster i's surplus at ε-complementary slackness, evicting other users whose
// units then cost more than ε above their best other option.
func (s *Solver) bid(i int, eps float64) {
	a := &s.auc
	a.bids++
	r := a.surplus[i]
	kappa := s.Kappa(i)
	e0, e1 := s.Start[i], s.Start[i+1]
	cands := a.cand[:0]
	lo := s.nextShed(i)
	for k := e0; k < e1; k++ {
		j := int(s.Eng[k])
		if s.Cap[j] <= 0 {
			continue
		}
		c := auctionCand{k: k, j: j}
		if kappa > 0 {
			c.keepRoom = math.Max(0, s.Flow0[k]-s.Flow[k])
		}
		cands = append(cands, c)
		lo = math.Min(lo, s.unitCost(k, kappa))
	}
	a.chunks = a.chunks[:0]
	// Upper bracket: the level without evictions (others keep everything) covers r.
	var hi float64
	if v, _ := s.total(i, cands, lo, kappa); v >= r {
		hi = lo
	} else {
		step := math.Max(1e-3, 1e-3*math.Abs(lo))
		hi = lo + step
		for it := 0; it < 200; it++ {
			if v, _ := s.total(i, cands, hi, kappa); v >= r {
				break
			}
			lo = hi
			step *= 4
			hi = lo + step
		}
		// Engines whose next unit costs hi or more take nothing at levels up to hi.
		n := 0
		for c := range cands {
			if s.unitCost(cands[c].k, kappa) < hi {
				cands[n] = cands[c]
				n++
			}
		}
		cands = cands[:n]
		_, hi = s.bracketRoot(i, cands, r, lo, hi, kappa)
	}
	// Keep the engines the bidder takes from at hi, and those whose price would rise by hi
	// (an engine at its limit or at a kink supplies only by evicting), with the other users'
	// chunks.
	n := 0
	for c := range cands {
		t, p, _ := s.take(&cands[c], hi, kappa)
		if t <= 0 && !(p > a.price[cands[c].j]) {
			continue
		}
		cd := cands[c]
		j := cd.j
		cd.c0 = len(a.chunks)
		for _, k := range s.EIn[s.EStart[j]:s.EStart[j+1]] {
			u := int(s.ClOf[k])
			if u == i || s.Flow[k] <= 0 {
				continue
			}
			ku := s.Kappa(u)
			// u's best option other than j, from its cache: a lower bound, as prices only
			// rise within a phase (less 2κ: an eviction can reopen u's cheaper anchored
			// units). Where the bound allows an eviction at p, it is refreshed: evicting on a
			// stale bound would let two clusters take the same units from each other without
			// a price rise, forever.
			other := s.otherOption(u, j) - 2*ku
			if other+eps-s.Dist[k]-ku < p {
				s.cacheBest(u)
				other = s.otherOption(u, j)
			}
			other += eps
			keep := 0.0
			if ku > 0 {
				keep = math.Min(s.Flow[k], s.Flow0[k])
			}
			if nw := s.Flow[k] - keep; nw > 0 {
				if th := other - s.Dist[k] - ku; th < p {
					a.chunks = append(a.chunks, auctionChunk{theta: th, amt: nw, k: int(k)})
				}
			}
			if keep > 0 {
				if th := other - s.Dist[k] + ku; th < p {
					a.chunks = append(a.chunks, auctionChunk{theta: th, amt: keep, k: int(k)})
				}
			}
		}
		cd.c1 = len(a.chunks)
		cands[n] = cd
		n++
	}
	cands = cands[:n]
	a.cand = cands
	// With evictions the bidder gets at least as much at each level: the root is at most hi.
	lo2 := lo
	for c := range cands {
		lo2 = math.Min(lo2, s.unitCost(cands[c].k, kappa))
	}
	var la, lb float64
	if v, _ := s.total(i, cands, lo2, kappa); v >= r {
		la, lb = lo2, lo2
	} else {
		la, lb = s.bracketRoot(i, cands, r, lo2, hi, kappa)
	}
	// States at both ends; interpolate so that exactly r is placed (a jump between la and lb is
	// an eviction or a shed class taken in part). With la == lb the lower state is empty.
	ta, tb := 0.0, 0.0
	for c := range cands {
		cd := &cands[c]
		cd.tb, cd.pb, _ = s.take(cd, lb, kappa)
		cd.ta, cd.pa = 0, math.Inf(-1)
		if la < lb {
			cd.ta, cd.pa, _ = s.take(cd, la, kappa)
		}
		ta += cd.ta
		tb += cd.tb
	}
	shA, shB := 0.0, s.shedAt(i, lb)
	if la < lb {
		shA = s.shedAt(i, la)
	}
	ta += shA
	tb += shB
	f := 1.0
	if tb > ta {
		f = math.Min(1, math.Max(0, (r-ta)/(tb-ta)))
	}
	placed := 0.0
	best, bestT := -1, 0.0
	for c := range cands {
		cd := &cands[c]
		j := cd.j
		t := cd.ta + f*(cd.tb-cd.ta)
		ev := 0.0
		for _, ch := range a.chunks[cd.c0:cd.c1] {
			var e float64
			if ch.theta < cd.pa {
				e = ch.amt
			} else if ch.theta < cd.pb {
				e = f * ch.amt
			}
			if e > 0 {
				e = math.Min(e, s.Flow[ch.k])
				s.Flow[ch.k] -= e
				u := int(s.ClOf[ch.k])
				a.surplus[u] += e
				s.enqueue(u)
				ev += e
			}
		}
		if t > 0 || ev > 0 {
			s.Flow[cd.k] += t
			s.Load[j] += t - ev
			placed += t
			if cd.pb > a.price[j] {
				a.price[j] = cd.pb
			}
			if t > bestT {
				best, bestT = c, t
			}
		}
	}
	sh := shA + f*(shB-shA)
	dem := &s.Classes[i]
	for _, q := range s.Order {
		if sh <= 0 {
			break
		}
		room := dem[q] - a.shedQ[i*flow.NumClasses+q]
		t := math.Min(sh, room)
		if t > 0 {
			a.shedQ[i*flow.NumClasses+q] += t
			sh -= t
			placed += t
		}
	}
	// Rounding residual: onto the largest take.
	if res := r - placed; res != 0 && best >= 0 {
		cd := &cands[best]
		v := math.Max(-s.Flow[cd.k], res)
		s.Flow[cd.k] += v
		s.Load[cd.j] += v
		placed += v
	}
	a.surplus[i] = math.Max(0, r-placed)
	s.cacheBest(i)
	s.enqueue(i)
}

// restore re-establishes ε-complementary slackness at the current prices (raised to the marginal
// cost of the loads where below it; never lowered within a phase): units that cost more than ε
// above their cluster's cheapest option are evicted, and clusters with surplus are queued. It
// reports whether it evicted anything.
func (s *Solver) restore(eps float64) bool {
	a := &s.auc
	nc := len(s.Demand)
	for j := range s.Load {
		if s.Cap[j] <= 0 {
			continue
		}
		a.price[j] = math.Max(a.price[j], s.leftMarginal(j, s.Load[j]))
	}
	changed := false
	for i := 0; i < nc; i++ {
		if !(s.Demand[i] > 0) {
			continue
		}
		kappa := s.Kappa(i)
		s.cacheBest(i)
		thr := a.best1[i] + eps
		for k := s.Start[i]; k < s.Start[i+1]; k++ {
			if s.Flow[k] <= 0 {
				continue
			}
			j := s.Eng[k]
			c := s.Dist[k] + a.price[j]
			keep := 0.0
			if kappa > 0 {
				keep = math.Min(s.Flow[k], s.Flow0[k])
			}
			ev := 0.0
			if c+kappa > thr {
				ev = s.Flow[k] - keep
			}
			if c-kappa > thr {
				ev = s.Flow[k]
			}
			if ev > 0 {
				s.Flow[k] -= ev
				s.Load[j] -= ev
				a.surplus[i] += ev
				changed = true
			}
		}
		for q := flow.NumClasses - 1; q >= 0; q-- {
			cls := s.Order[q]
			if v := a.shedQ[i*flow.NumClasses+cls]; v > 0 && s.Opt.ShedPriceMs[cls] > thr {
				a.shedQ[i*flow.NumClasses+cls] = 0
				a.surplus[i] += v
				changed = true
			}
		}
		s.enqueue(i)
	}
	return changed
}

// Solve runs the auction from the warm-started flows and leaves flows, loads, shed and
// levels in the solver's buffers. It reports whether the duality gap certificate closed, with
// the number of bids made.
func (s *Solver) Solve() (bids int, ok bool) {
	s.auctionSetup()
	a := &s.auc
	nc := len(s.Demand)
	level := s.CommonLevel()
	epsFinal := s.Opt.Tolerance * level
	eps := 0.05 * level
	maxBids := 400*nc + 20000
	for {
		// Phase start: prices back to the marginal cost of the loads (evictions of the last
		// phase can leave engines with unsold supply at their price).
		for j := range s.Load {
			if s.Cap[j] > 0 && s.Load[j] < s.Cap[j]*(1-1e-12) {
				a.price[j] = s.leftMarginal(j, s.Load[j])
			}
		}
		for s.restore(eps) || len(a.queue) > 0 {
			for h := 0; h < len(a.queue); h++ {
				i := int(a.queue[h])
				a.inQ[i] = false
				if a.surplus[i] > 1e-13*s.Demand[i] {
					s.bid(i, eps)
				}
				if a.bids > maxBids || (a.bids%64 == 0 && s.Expired(s.FastEnd)) {
					s.auctionFinish()
					return a.bids, false
				}
			}
			a.queue = a.queue[:0]
		}
		if eps <= 4*epsFinal {
			s.auctionFinish()
			m := s.Measure(true)
			if m.RelGap <= s.Opt.Tolerance {
				return a.bids, true
			}
			return a.bids, false
		}
		eps /= 4
	}
}

// auctionFinish writes the shed, the levels and the loads for Measure and the solution.
func (s *Solver) auctionFinish() {
	a := &s.auc
	clear(s.Load)
	for i := range s.Demand {
		served := 0.0
		for k := s.Start[i]; k < s.Start[i+1]; k++ {
			s.Flow[k] = math.Max(0, s.Flow[k])
			served += s.Flow[k]
			s.Load[s.Eng[k]] += s.Flow[k]
		}
		s.Shed[i] = math.Max(0, s.Demand[i]-served)
		s.Mu[i] = math.NaN()
	}
	for j := range s.Load {
		s.Load[j] = math.Min(s.Load[j], s.Cap[j])
	}
	// A cluster's level is the cost of its next unit (Measure reads the engines' subgradients
	// at kinks and the capacity prices off the levels).
	for i := range s.Demand {
		if s.Demand[i] > 0 {
			s.cacheBest(i)
			s.Mu[i] = a.best1[i]
		}
	}
}

// Save keeps the auction's routing (flows, shed, levels) for Restore.
func (s *Solver) Save() {
	a := &s.auc
	a.saved = append(append(append(a.saved[:0], s.Flow...), s.Shed...), s.Mu...)
}

// Restore brings back the routing kept by Save and rebuilds the loads.
func (s *Solver) Restore() {
	a := &s.auc
	edges, nc := len(s.Flow), len(s.Shed)
	copy(s.Flow, a.saved[:edges])
	copy(s.Shed, a.saved[edges:edges+nc])
	copy(s.Mu, a.saved[edges+nc:])
	clear(s.Load)
	for k, j := range s.Eng {
		s.Load[j] += s.Flow[k]
	}
	for j := range s.Load {
		s.Load[j] = math.Min(s.Load[j], s.Cap[j])
	}
}
