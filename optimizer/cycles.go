package optimizer

import (
	"math"
	"slices"
)

// cancelCycles improves the split of the current engine loads among the clusters: with every
// engine's load and every cluster's shed held fixed, re-assigning traffic is a transportation
// problem, which is optimal when the residual graph has no negative cycle. It finds negative
// cycles with Bellman-Ford (checking the predecessor graph for cycles after every round) and
// cancels them. Gauss-Seidel sweeps alone make such exchanges only slowly when the latency
// curves are steep. It returns the number of cycles cancelled.
func (s *Solver) cancelCycles(maxRounds int) int {
	nc := len(s.demand)
	ne := len(s.X)
	// When some cluster sheds, a sink node (index nc+ne) stands for the shed: edges cluster →
	// sink shed more of that cluster (at the price of its cheapest class still served) and
	// sink → cluster shed less (at minus the price of its dearest class shed), so that a
	// cycle can move capacity from a cluster serving a cheap class to one shedding a dear one.
	shedding := false
	for i := 0; i < nc; i++ {
		shedding = shedding || s.shed[i] > 0
	}
	nv := nc + ne + 1
	sink := nc + ne
	s.bfDist = grow(s.bfDist, nv)
	s.bfPred = growRaw(s.bfPred, nv)
	s.bfMark = growRaw(s.bfMark, nv)
	dist, pred := s.bfDist, s.bfPred
	for v := range pred {
		pred[v] = -1
	}
	base := 2 * len(s.x) // predecessor entries of the shed edges start here
	cancelled := 0
	for round := 0; round < maxRounds; round++ {
		changed := false
		for i := 0; i < nc; i++ {
			kappa := s.kappa(i)
			for k := s.start[i]; k < s.start[i+1]; k++ {
				j := nc + int(s.eng[k])
				c := s.dist[k] + s.edgeProx(k, kappa, true)
				if dist[i]+c < dist[j]-1e-9 {
					dist[j] = dist[i] + c
					pred[j] = 2 * k
					changed = true
				}
				if s.x[k] > 0 {
					c := -s.dist[k] + s.edgeProx(k, kappa, false)
					if dist[j]+c < dist[i]-1e-9 {
						dist[i] = dist[j] + c
						pred[i] = 2*k + 1
						changed = true
					}
				}
			}
			if !shedding {
				continue
			}
			// The shed edges' costs are shed prices (1e7 and more): compare with a
			// tolerance relative to them, or rounding would relax edges for ever.
			up, _, down, _ := s.shedMargins(i)
			if !math.IsInf(up, 1) && dist[i]+up < dist[sink]-1e-12*up {
				dist[sink] = dist[i] + up
				pred[sink] = base + 2*i
				changed = true
			}
			if !math.IsInf(down, 1) && dist[sink]-down < dist[i]-1e-12*down {
				dist[i] = dist[sink] - down
				pred[i] = base + 2*i + 1
				changed = true
			}
		}
		if !changed {
			// dist is a feasible potential: no negative cycle is left.
			return cancelled
		}
		cancelled += s.cancelPredCycles(nc)
	}
	return cancelled
}

// shedMargins returns, for cluster i, the price of shedding more (that of its cheapest class
// still served, +Inf when all is shed) and how much more can be shed at that price, and the
// price saved by shedding less (that of its dearest class shed, +Inf when nothing is shed)
// and how much less can be shed at that price.
func (s *Solver) shedMargins(i int) (up, upRoom, down, downRoom float64) {
	up, down = math.Inf(1), math.Inf(1)
	if !(s.demand[i] > 0) || s.start[i+1] == s.start[i] {
		return up, 0, down, 0
	}
	dem := &s.p.Clusters[i].Demand
	left := s.shed[i]
	for _, q := range s.order {
		if !(dem[q] > 0) {
			continue
		}
		t := math.Min(left, dem[q])
		left -= t
		if t > 0 {
			down, downRoom = s.opt.ShedPriceMs[q], t
		}
		if dem[q]-t > 1e-12*dem[q] && math.IsInf(up, 1) {
			up, upRoom = s.opt.ShedPriceMs[q], dem[q]-t
		}
	}
	return up, upRoom, down, downRoom
}

// edgeCost returns the cost of pushing flow along predecessor entry e.
func (s *Solver) edgeCost(e int) float64 {
	k := e / 2
	if k >= len(s.x) {
		up, _, down, _ := s.shedMargins(k - len(s.x))
		if e%2 == 0 {
			return up
		}
		return -down
	}
	kappa := s.kappa(s.clusterOf(k))
	if e%2 == 0 {
		return s.dist[k] + s.edgeProx(k, kappa, true)
	}
	if s.x[k] <= 0 {
		return math.Inf(1)
	}
	return -s.dist[k] + s.edgeProx(k, kappa, false)
}

// cancelPredCycles cancels every negative cycle of the predecessor graph and returns how many.
func (s *Solver) cancelPredCycles(nc int) int {
	mark := s.bfMark
	for v := range mark {
		mark[v] = -1
	}
	n := 0
	for v0 := range mark {
		if mark[v0] >= 0 {
			continue
		}
		v := v0
		for v >= 0 && mark[v] < 0 {
			mark[v] = v0
			e := s.bfPred[v]
			if e < 0 {
				v = -1
				break
			}
			v, _ = s.edgeEnds(e, nc)
		}
		if v < 0 || mark[v] != v0 {
			continue
		}
		// v is on a cycle.
		s.cycle = s.cycle[:0]
		cost := 0.0
		for u := v; ; {
			e := s.bfPred[u]
			s.cycle = append(s.cycle, e)
			cost += s.edgeCost(e)
			u, _ = s.edgeEnds(e, nc)
			if u == v {
				break
			}
		}
		if cost < -1e-9 && s.cancel() {
			n++
		}
		for _, e := range s.cycle {
			_, to := s.edgeEnds(e, nc)
			s.bfPred[to] = -1
		}
	}
	return n
}

// edgeProx returns the proximal part of the cost of moving flow on edge k up (or down).
func (s *Solver) edgeProx(k int, kappa float64, up bool) float64 {
	if kappa == 0 {
		return 0
	}
	if up == (s.x[k] < s.x0[k]) {
		return -kappa
	}
	return kappa
}

// edgeOf returns the cluster and engine node of predecessor entry e.
func (s *Solver) edgeEnds(e, nc int) (from, to int) {
	k := e / 2
	if k >= len(s.x) {
		i, sink := k-len(s.x), nc+len(s.X)
		if e%2 == 0 {
			return i, sink
		}
		return sink, i
	}
	i := s.clusterOf(k)
	j := nc + int(s.eng[k])
	if e%2 == 0 {
		return i, j
	}
	return j, i
}

func (s *Solver) clusterOf(k int) int {
	lo, hi := 0, len(s.demand)
	for lo+1 < hi {
		m := (lo + hi) / 2
		if s.start[m] <= k {
			lo = m
		} else {
			hi = m
		}
	}
	for lo+1 < len(s.start) && s.start[lo+1] <= k {
		lo++
	}
	return lo
}

// cancel pushes the largest possible amount around s.cycle and reports whether it moved any.
func (s *Solver) cancel() bool {
	amount := math.Inf(1)
	for _, e := range s.cycle {
		k := e / 2
		if k >= len(s.x) {
			_, upRoom, _, downRoom := s.shedMargins(k - len(s.x))
			if e%2 == 0 {
				amount = math.Min(amount, upRoom)
			} else {
				amount = math.Min(amount, downRoom)
			}
			continue
		}
		kappa := s.kappa(s.clusterOf(k))
		if e%2 == 1 {
			amount = math.Min(amount, s.x[k])
			if kappa > 0 && s.x[k] > s.x0[k] {
				amount = math.Min(amount, s.x[k]-s.x0[k])
			}
		} else if kappa > 0 && s.x[k] < s.x0[k] {
			amount = math.Min(amount, s.x0[k]-s.x[k])
		}
	}
	if !(amount > 0) || math.IsInf(amount, 1) {
		return false
	}
	for _, e := range s.cycle {
		k := e / 2
		switch {
		case k >= len(s.x) && e%2 == 0:
			i := k - len(s.x)
			s.shed[i] = math.Min(s.demand[i], s.shed[i]+amount)
		case k >= len(s.x):
			i := k - len(s.x)
			s.shed[i] = math.Max(0, s.shed[i]-amount)
		case e%2 == 0:
			s.x[k] += amount
		default:
			s.x[k] = math.Max(0, s.x[k]-amount)
		}
	}
	return true
}

// exchange moves capacity of engines at their hard limit from the cluster that values it least
// to the one that values it most. Gauss-Seidel sweeps cannot make this move: each cluster sees
// the full engine as unavailable. A cluster values engine j at mu_i - d_ij (its marginal-cost
// level minus the network latency). The move is kept only if it lowers the objective.
func (s *Solver) exchange() {
	nc := len(s.demand)
	for j := range s.X {
		if !(s.capv[j] > 0) || s.X[j] < s.capv[j]*(1-1e-9) {
			continue
		}
		highK, high := -1, math.Inf(-1)
		s.users = s.users[:0]
		for i := 0; i < nc; i++ {
			if !(s.demand[i] > 0) || math.IsNaN(s.mu[i]) {
				continue
			}
			for k := s.start[i]; k < s.start[i+1]; k++ {
				if int(s.eng[k]) != j {
					continue
				}
				v := s.mu[i] - s.dist[k]
				if s.x[k] > 0 {
					s.users = append(s.users, k)
				}
				if s.x[k] < s.demand[i] && v > high {
					high, highK = v, k
				}
			}
		}
		if highK < 0 {
			continue
		}
		hi := s.clusterOf(highK)
		// Try the users from the lowest valuation up; a user's level understates what it
		// loses when its other engines are full too, so several may have to be tried.
		slices.SortStableFunc(s.users, func(a, b int) int {
			va, vb := s.mu[s.clusterOf(a)]-s.dist[a], s.mu[s.clusterOf(b)]-s.dist[b]
			switch {
			case va < vb:
				return -1
			case va > vb:
				return 1
			}
			return 0
		})
		for n, lowK := range s.users {
			lo := s.clusterOf(lowK)
			if n >= 4 || s.mu[lo]-s.dist[lowK] >= high-1e-9*(math.Abs(high)+1) {
				break
			}
			if lo == hi {
				continue
			}
			if s.tryExchange(j, lowK, lo, hi) {
				break
			}
		}
	}
}

// tryExchange frees part of edge lowK's flow (cluster lo, engine j), lets cluster hi take what
// it wants of it and cluster lo re-place its traffic, halving the part until the objective
// falls. It reports whether a move was kept.
func (s *Solver) tryExchange(j, lowK, lo, hi int) bool {
	before := s.objective()
	s.saveClusters(lo, hi)
	for d, try := s.x[lowK], 0; try < 30; d, try = d/2, try+1 {
		s.x[lowK] -= d
		s.X[j] -= d
		s.shed[lo] += d
		s.updateCluster(hi)
		s.updateCluster(lo)
		if s.objective() < before*(1-1e-15) {
			return true
		}
		s.restoreClusters(lo, hi)
	}
	return false
}

// objective evaluates the objective of the current flows.
func (s *Solver) objective() float64 {
	c := 0.0
	for j := range s.X {
		c += s.X[j] * s.curves[j].Latency(s.X[j])
	}
	for i := range s.demand {
		for k := s.start[i]; k < s.start[i+1]; k++ {
			c += s.x[k] * s.dist[k]
			if kappa := s.kappa(i); kappa > 0 {
				c += kappa * math.Abs(s.x[k]-s.x0[k])
			}
		}
		c += s.shedCost(i, s.shed[i])
	}
	return c
}

func (s *Solver) saveClusters(a, b int) {
	s.saved = s.saved[:0]
	for _, i := range [2]int{a, b} {
		s.saved = append(s.saved, s.shed[i], s.mu[i])
		s.saved = append(s.saved, s.x[s.start[i]:s.start[i+1]]...)
	}
}

func (s *Solver) restoreClusters(a, b int) {
	r := s.saved
	for _, i := range [2]int{a, b} {
		for k := s.start[i]; k < s.start[i+1]; k++ {
			s.X[s.eng[k]] -= s.x[k]
		}
		s.shed[i], s.mu[i] = r[0], r[1]
		r = r[2:]
		n := copy(s.x[s.start[i]:s.start[i+1]], r)
		r = r[n:]
		for k := s.start[i]; k < s.start[i+1]; k++ {
			s.X[s.eng[k]] += s.x[k]
		}
	}
}
