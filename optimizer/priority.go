package optimizer

import "math"

// Shedding by priority across clusters. Within a cluster the shed always goes cheapest class
// first (level, shedCost), but across clusters only the optimum guarantees it: a point stopped
// by the time budget may shed one cluster's critical traffic while an engine it could use
// serves another cluster's sheddable traffic. enforcePriority turns any feasible point into
// one whose served traffic per class is lexicographically maximal (critical first), by
// augmenting paths in the bipartite residual graph, one phase per class from the dearest:
//
//   - a source is a cluster that sheds some of the phase's class or a dearer one (its served
//     traffic is below its demand of those classes, cum_i);
//   - a sink is an engine with room below the phase's capacity (the load at which its marginal
//     cost plus the largest network latency reaches the class's shed price: serving beyond it
//     costs more than the shed), or a cluster that serves a cheaper class (served above cum_i),
//     whose cheaper traffic the path sheds;
//   - a path goes from a cluster to any eligible engine, and from an engine back to a cluster
//     that sends it traffic (which re-places that traffic on the path's next engine).
//
// When no path is left, the clusters the sources reach serve no cheaper class, their engines
// are at the phase's capacity and serve only them, and so no routing serves more of the
// phase's class and the dearer ones (the max-flow/min-cut argument); later phases only shed
// cheaper classes. The paths move traffic without regard to latency: the sweeps that follow,
// if the time budget allows, re-split it.

// prioState holds the buffers of enforcePriority.
type prioState struct {
	capq  []float64 // per engine: the phase's capacity
	pred  []int32   // per node (clusters, then engines): the CSR edge it was reached by, -1 for a source, -2 unreached
	root  []int32   // per node: the source cluster of its path
	queue []int32
	sinks []int32
}

// enforcePriority makes the served traffic per priority class lexicographically maximal (see
// above) and returns the traffic moved onto the augmenting paths in req/s (0 when the point
// already had the property). It keeps the flows, loads and shed consistent; the levels are left
// as they were.
func (s *Solver) enforcePriority() float64 {
	nc, ne := len(s.demand), len(s.X)
	shedding := false
	for i := 0; i < nc; i++ {
		if s.shed[i] > 1e-9*s.demand[i] && s.start[i+1] > s.start[i] {
			shedding = true
			break
		}
	}
	if !shedding {
		return 0
	}
	s.dualLinks()
	d := &s.dual
	ps := &s.prio
	ps.capq = growRaw(ps.capq, ne)
	ps.pred = growRaw(ps.pred, nc+ne)
	ps.root = growRaw(ps.root, nc+ne)
	maxDist := 0.0 // the largest network latency, for the phases' capacities
	for _, v := range s.dist {
		maxDist = math.Max(maxDist, v)
	}
	moved := 0.0
	// Phases from the dearest class to the cheapest (s.order is by ascending price).
	for n := NumPriorities - 1; n >= 0; n-- {
		q := s.order[n]
		P := s.opt.ShedPriceMs[q]
		for j := 0; j < ne; j++ {
			ps.capq[j] = 0
			if s.capv[j] > 0 {
				x, _ := s.curves[j].InverseMarginal(P - maxDist)
				ps.capq[j] = math.Min(math.Max(x, 0), s.capv[j])
			}
		}
		// Every round saturates a source, a sink or a link; the bound is a safeguard
		// against rounds that move only rounding residues.
		for round := 0; round < 4*(nc+ne); round++ {
			a := s.augmentPhase(n, d)
			moved += a
			if a == 0 {
				break
			}
		}
	}
	return moved
}

// cum returns cluster i's demand of the classes at positions n and above of s.order (the
// phase's class and the dearer ones).
func (s *Solver) cum(i, n int) float64 {
	dem := &s.p.Clusters[i].Demand
	c := 0.0
	for _, q := range s.order[n:] {
		c += dem[q]
	}
	return c
}

// augmentPhase runs one breadth-first search from every source of phase n at once and pushes
// traffic along the path to every sink it reached, as far as the residual capacities (updated
// by the earlier paths) allow. It returns the traffic moved.
func (s *Solver) augmentPhase(n int, d *dualState) float64 {
	nc := len(s.demand)
	ps := &s.prio
	pred, root := ps.pred, ps.root
	queue := ps.queue[:0]
	for v := range pred {
		pred[v] = -2
	}
	for i := 0; i < nc; i++ {
		if s.start[i+1] > s.start[i] && s.deficit(i, n) > 0 {
			pred[i], root[i] = -1, int32(i)
			queue = append(queue, int32(i))
		}
	}
	if len(queue) == 0 {
		ps.queue = queue
		return 0
	}
	sinks := ps.sinks[:0]
	for h := 0; h < len(queue); h++ {
		v := int(queue[h])
		if v < nc {
			if v != int(root[v]) && s.surplus(v, n) > 0 {
				sinks = append(sinks, int32(v))
			}
			for k := s.start[v]; k < s.start[v+1]; k++ {
				j := int(s.eng[k])
				if w := nc + j; pred[w] == -2 && s.capv[j] > 0 {
					pred[w], root[w] = int32(k), root[v]
					queue = append(queue, int32(w))
				}
			}
			continue
		}
		j := v - nc
		if s.phaseRoom(j) > 0 {
			sinks = append(sinks, int32(v))
		}
		for e := d.estart[j]; e < d.estart[j+1]; e++ {
			k := int(d.ein[e])
			if i := int(d.clOf[k]); pred[i] == -2 && s.x[k] > 1e-12*s.demand[i] {
				pred[i], root[i] = int32(k), root[v]
				queue = append(queue, int32(i))
			}
		}
	}
	ps.queue = queue
	moved := 0.0
	for _, t := range sinks {
		v := int(t)
		src := int(root[v])
		a := s.deficit(src, n)
		if v < nc {
			a = math.Min(a, s.surplus(v, n))
		} else {
			a = math.Min(a, s.phaseRoom(v-nc))
		}
		// The bottleneck of the backward links (an engine back to the cluster that uses it).
		for u := v; u != src; {
			k := int(pred[u])
			if u < nc {
				a = math.Min(a, s.x[k])
				u = nc + int(s.eng[k])
			} else {
				u = int(d.clOf[k])
			}
		}
		if !(a > 0) {
			continue
		}
		for u := v; u != src; {
			k := int(pred[u])
			j := int(s.eng[k])
			if u < nc {
				s.x[k] = math.Max(0, s.x[k]-a)
				s.X[j] -= a
				u = nc + j
			} else {
				s.x[k] += a
				s.X[j] += a
				u = int(d.clOf[k])
			}
		}
		s.shed[src] = math.Max(0, s.shed[src]-a)
		if v < nc {
			s.shed[v] = math.Min(s.demand[v], s.shed[v]+a)
		}
		moved += a
	}
	ps.sinks = sinks
	return moved
}

// deficit returns how much of cluster i's demand of the classes of phase n and dearer is shed,
// 0 below a relative 1e-9 of its demand.
func (s *Solver) deficit(i, n int) float64 {
	v := s.cum(i, n) - (s.demand[i] - s.shed[i])
	if v <= 1e-9*s.demand[i] {
		return 0
	}
	return v
}

// surplus returns how much of cluster i's served traffic is of classes cheaper than phase n's,
// 0 below a relative 1e-9 of its demand.
func (s *Solver) surplus(i, n int) float64 {
	v := (s.demand[i] - s.shed[i]) - s.cum(i, n)
	if v <= 1e-9*s.demand[i] {
		return 0
	}
	return v
}

// phaseRoom returns how much engine j can take below the phase's capacity, 0 below a relative 1e-9
// of its hard limit.
func (s *Solver) phaseRoom(j int) float64 {
	v := s.prio.capq[j] - s.X[j]
	if v <= 1e-9*s.capv[j] {
		return 0
	}
	return v
}
