// Package sweep holds the solver's last stage, which always runs: Gauss-Seidel sweeps over
// the clusters (each an exact per-cluster equilibration), negative-cycle cancelling and
// exchanges at binding hard limits, repeated until the certificate is within tolerance or the
// time budget has run out, then the repair that sheds by priority across clusters
// (docs/optimizer.md).
package sweep

import (
	"math"
	"slices"

	"github.com/switchyard-dev/switchyard/optimizer/flow"
)

// Solver runs the sweeps on a flow.State; it keeps the cycle search's buffers between solves.
type Solver struct {
	*flow.State

	bfDist         []float64
	bfPred, bfMark []int
	cycle          []int
	saved          []float64
	users          []int
}

// cancelCycles improves the split of the current engine loads among the clusters: with every
// engine's load and every cluster's shed held fixed, re-assigning traffic is a transportation
// problem, which is optimal when the residual graph has no negative cycle. It finds negative
// cycles with Bellman-Ford (checking the predecessor graph for cycles after every round) and
// cancels them. Gauss-Seidel sweeps alone make such exchanges only slowly when the latency
// curves are steep. It returns the number of cycles cancelled.
func (s *Solver) cancelCycles(maxRounds int) int {
	nc := len(s.Demand)
	ne := len(s.Load)
	// When some cluster sheds, a sink node (index nc+ne) stands for the shed: edges cluster →
	// sink shed more of that cluster (at the price of its cheapest class still served) and
	// sink → cluster shed less (at minus the price of its dearest class shed), so that a
	// cycle can move capacity from a cluster serving a cheap class to one shedding a dear one.
	shedding := false
	for i := 0; i < nc; i++ {
		shedding = shedding || s.Shed[i] > 0
	}
	nv := nc + ne + 1
	sink := nc + ne
	s.bfDist = flow.Grow(s.bfDist, nv)
	s.bfPred = flow.GrowRaw(s.bfPred, nv)
	s.bfMark = flow.GrowRaw(s.bfMark, nv)
	dist, pred := s.bfDist, s.bfPred
	for v := range pred {
		pred[v] = -1
	}
	base := 2 * len(s.Flow) // predecessor entries of the shed edges start here
	cancelled := 0
	for round := 0; round < maxRounds; round++ {
		changed := false
		for i := 0; i < nc; i++ {
			kappa := s.Kappa(i)
			for k := s.Start[i]; k < s.Start[i+1]; k++ {
				j := nc + int(s.Eng[k])
				c := s.Dist[k] + s.edgeProx(k, kappa, true)
				if dist[i]+c < dist[j]-1e-9 {
					dist[j] = dist[i] + c
					pred[j] = 2 * k
					changed = true
				}
				if s.Flow[k] > 0 {
					c := -s.Dist[k] + s.edgeProx(k, kappa, false)
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
	if !(s.Demand[i] > 0) || s.Start[i+1] == s.Start[i] {
		return up, 0, down, 0
	}
	dem := &s.Classes[i]
	left := s.Shed[i]
	for _, q := range s.Order {
		if !(dem[q] > 0) {
			continue
		}
		t := math.Min(left, dem[q])
		left -= t
		if t > 0 {
			down, downRoom = s.Opt.ShedPriceMs[q], t
		}
		if dem[q]-t > 1e-12*dem[q] && math.IsInf(up, 1) {
			up, upRoom = s.Opt.ShedPriceMs[q], dem[q]-t
		}
	}
	return up, upRoom, down, downRoom
}

// edgeCost returns the cost of pushing flow along predecessor entry e.
func (s *Solver) edgeCost(e int) float64 {
	k := e / 2
	if k >= len(s.Flow) {
		up, _, down, _ := s.shedMargins(k - len(s.Flow))
		if e%2 == 0 {
			return up
		}
		return -down
	}
	kappa := s.Kappa(s.clusterOf(k))
	if e%2 == 0 {
		return s.Dist[k] + s.edgeProx(k, kappa, true)
	}
	if s.Flow[k] <= 0 {
		return math.Inf(1)
	}
	return -s.Dist[k] + s.edgeProx(k, kappa, false)
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
	if up == (s.Flow[k] < s.Flow0[k]) {
		return -kappa
	}
	return kappa
}

// edgeOf returns the cluster and engine node of predecessor entry e.
func (s *Solver) edgeEnds(e, nc int) (from, to int) {
	k := e / 2
	if k >= len(s.Flow) {
		i, sink := k-len(s.Flow), nc+len(s.Load)
		if e%2 == 0 {
			return i, sink
		}
		return sink, i
	}
	i := s.clusterOf(k)
	j := nc + int(s.Eng[k])
	if e%2 == 0 {
		return i, j
	}
	return j, i
}

func (s *Solver) clusterOf(k int) int {
	lo, hi := 0, len(s.Demand)
	for lo+1 < hi {
		m := (lo + hi) / 2
		if s.Start[m] <= k {
			lo = m
		} else {
			hi = m
		}
	}
	for lo+1 < len(s.Start) && s.Start[lo+1] <= k {
		lo++
	}
	return lo
}

// cancel pushes the largest possible amount around s.cycle and reports whether it moved any.
func (s *Solver) cancel() bool {
	amount := math.Inf(1)
	for _, e := range s.cycle {
		k := e / 2
		if k >= len(s.Flow) {
			_, upRoom, _, downRoom := s.shedMargins(k - len(s.Flow))
			if e%2 == 0 {
				amount = math.Min(amount, upRoom)
			} else {
				amount = math.Min(amount, downRoom)
			}
			continue
		}
		kappa := s.Kappa(s.clusterOf(k))
		if e%2 == 1 {
			amount = math.Min(amount, s.Flow[k])
			if kappa > 0 && s.Flow[k] > s.Flow0[k] {
				amount = math.Min(amount, s.Flow[k]-s.Flow0[k])
			}
		} else if kappa > 0 && s.Flow[k] < s.Flow0[k] {
			amount = math.Min(amount, s.Flow0[k]-s.Flow[k])
		}
	}
	if !(amount > 0) || math.IsInf(amount, 1) {
		return false
	}
	for _, e := range s.cycle {
		k := e / 2
		switch {
		case k >= len(s.Flow) && e%2 == 0:
			i := k - len(s.Flow)
			s.Shed[i] = math.Min(s.Demand[i], s.Shed[i]+amount)
		case k >= len(s.Flow):
			i := k - len(s.Flow)
			s.Shed[i] = math.Max(0, s.Shed[i]-amount)
		case e%2 == 0:
			s.Flow[k] += amount
		default:
			s.Flow[k] = math.Max(0, s.Flow[k]-amount)
		}
	}
	return true
}

// exchange moves capacity of engines at their hard limit from the cluster that values it least
// to the one that values it most. Gauss-Seidel sweeps cannot make this move: each cluster sees
// the full engine as unavailable. A cluster values engine j at mu_i - d_ij (its marginal-cost
// level minus the network latency). The move is kept only if it lowers the objective.
func (s *Solver) exchange() {
	nc := len(s.Demand)
	for j := range s.Load {
		if !(s.Cap[j] > 0) || s.Load[j] < s.Cap[j]*(1-1e-9) {
			continue
		}
		highK, high := -1, math.Inf(-1)
		s.users = s.users[:0]
		for i := 0; i < nc; i++ {
			if !(s.Demand[i] > 0) || math.IsNaN(s.Mu[i]) {
				continue
			}
			for k := s.Start[i]; k < s.Start[i+1]; k++ {
				if int(s.Eng[k]) != j {
					continue
				}
				v := s.Mu[i] - s.Dist[k]
				if s.Flow[k] > 0 {
					s.users = append(s.users, k)
				}
				if s.Flow[k] < s.Demand[i] && v > high {
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
			va, vb := s.Mu[s.clusterOf(a)]-s.Dist[a], s.Mu[s.clusterOf(b)]-s.Dist[b]
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
			if n >= 4 || s.Mu[lo]-s.Dist[lowK] >= high-1e-9*(math.Abs(high)+1) {
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
	for d, try := s.Flow[lowK], 0; try < 30; d, try = d/2, try+1 {
		s.Flow[lowK] -= d
		s.Load[j] -= d
		s.Shed[lo] += d
		s.UpdateCluster(hi)
		s.UpdateCluster(lo)
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
	for j := range s.Load {
		c += s.Load[j] * s.Curves[j].Latency(s.Load[j])
	}
	for i := range s.Demand {
		for k := s.Start[i]; k < s.Start[i+1]; k++ {
			c += s.Flow[k] * s.Dist[k]
			if kappa := s.Kappa(i); kappa > 0 {
				c += kappa * math.Abs(s.Flow[k]-s.Flow0[k])
			}
		}
		c += s.ShedCost(i, s.Shed[i])
	}
	return c
}

func (s *Solver) saveClusters(a, b int) {
	s.saved = s.saved[:0]
	for _, i := range [2]int{a, b} {
		s.saved = append(s.saved, s.Shed[i], s.Mu[i])
		s.saved = append(s.saved, s.Flow[s.Start[i]:s.Start[i+1]]...)
	}
}

func (s *Solver) restoreClusters(a, b int) {
	r := s.saved
	for _, i := range [2]int{a, b} {
		for k := s.Start[i]; k < s.Start[i+1]; k++ {
			s.Load[s.Eng[k]] -= s.Flow[k]
		}
		s.Shed[i], s.Mu[i] = r[0], r[1]
		r = r[2:]
		n := copy(s.Flow[s.Start[i]:s.Start[i+1]], r)
		r = r[n:]
		for k := s.Start[i]; k < s.Start[i+1]; k++ {
			s.Load[s.Eng[k]] += s.Flow[k]
		}
	}
}

// Run runs Gauss-Seidel sweeps over the clusters until the gap is within tolerance. first
// is the certificate of the current point when the caller has computed it (nil: compute it).
func (s *Solver) Run(first *flow.Measures) (int, flow.Measures) {
	nc := len(s.Demand)
	var m flow.Measures
	if first != nil {
		m = *first
	} else {
		m = s.Measure(true)
	}
	sweeps := 0
	for sweeps < s.Opt.MaxSweeps && m.RelGap > s.Opt.Tolerance && (sweeps == 0 || !s.Expired(s.End)) {
		if sweeps%2 == 0 {
			for i := 0; i < nc; i++ {
				s.UpdateCluster(i)
			}
		} else {
			for i := nc - 1; i >= 0; i-- {
				s.UpdateCluster(i)
			}
		}
		sweeps++
		s.exchange()
		s.cancelCycles(100)
		m = s.Measure(true)
	}
	// Whatever stopped the sweeps, the point returned sheds by priority across clusters
	// (flow.State.EnforcePriority); at an optimum there is nothing to move.
	if !s.Equilibrium && s.EnforcePriority() > 0 {
		m = s.Measure(true)
	}
	return sweeps, m
}
