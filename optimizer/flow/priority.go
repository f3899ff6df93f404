package flow

import "math"

// Shedding by priority across clusters. Within a cluster the shed always goes cheapest class
// first (level, ShedCost), but across clusters only the optimum guarantees it: a point stopped
// by the time budget may shed one cluster's critical traffic while an engine it could use
// serves another cluster's sheddable traffic. EnforcePriority turns any feasible point into
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

// prioState holds the buffers of EnforcePriority.
type prioState struct {
	capq  []float64 // per engine: the phase's capacity
	pred  []int32   // per node (clusters, then engines): the CSR edge it was reached by, -1 for a source, -2 unreached
	root  []int32   // per node: the source cluster of its path
	queue []int32
	sinks []int32
}

// EnforcePriority makes the served traffic per priority class lexicographically maximal (see
// above) and returns the traffic moved onto the augmenting paths in req/s (0 when the point
// already had the property). It keeps the flows, loads and shed consistent; the levels are left
// as they were.
func (s *State) EnforcePriority() float64 {
	nc, ne := len(s.Demand), len(s.Load)
	shedding := false
	for i := 0; i < nc; i++ {
		if s.Shed[i] > 1e-9*s.Demand[i] && s.Start[i+1] > s.Start[i] {
			shedding = true
			break
		}
	}
	if !shedding {
		return 0
	}
	s.EngineView()
	ps := &s.prio
	ps.capq = GrowRaw(ps.capq, ne)
	ps.pred = GrowRaw(ps.pred, nc+ne)
	ps.root = GrowRaw(ps.root, nc+ne)
	maxDist := 0.0 // the largest network latency, for the phases' capacities
	for _, v := range s.Dist {
		maxDist = math.Max(maxDist, v)
	}
	moved := 0.0
	// Phases from the dearest class to the cheapest (s.Order is by ascending price).
	for n := NumClasses - 1; n >= 0; n-- {
		q := s.Order[n]
		P := s.Opt.ShedPriceMs[q]
		for j := 0; j < ne; j++ {
			ps.capq[j] = 0
			if s.Cap[j] > 0 {
				x, _ := s.Curves[j].InverseMarginal(P - maxDist)
				ps.capq[j] = math.Min(math.Max(x, 0), s.Cap[j])
			}
		}
		// Every round saturates a source, a sink or a link; the bound is a safeguard
		// against rounds that move only rounding residues.
		for round := 0; round < 4*(nc+ne); round++ {
			a := s.augmentPhase(n)
			moved += a
			if a == 0 {
				break
			}
		}
	}
	return moved
}

// cum returns cluster i's demand of the classes at positions n and above of s.Order (the
// phase's class and the dearer ones).
func (s *State) cum(i, n int) float64 {
	dem := &s.Classes[i]
	c := 0.0
	for _, q := range s.Order[n:] {
		c += dem[q]
	}
	return c
}

// augmentPhase runs one breadth-first search from every source of phase n at once and pushes
// traffic along the path to every sink it reached, as far as the residual capacities (updated
// by the earlier paths) allow. It returns the traffic moved.
func (s *State) augmentPhase(n int) float64 {
	nc := len(s.Demand)
	ps := &s.prio
	pred, root := ps.pred, ps.root
	queue := ps.queue[:0]
	for v := range pred {
		pred[v] = -2
	}
	for i := 0; i < nc; i++ {
		if s.Start[i+1] > s.Start[i] && s.deficit(i, n) > 0 {
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
			for k := s.Start[v]; k < s.Start[v+1]; k++ {
				j := int(s.Eng[k])
				if w := nc + j; pred[w] == -2 && s.Cap[j] > 0 {
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
		for e := s.EStart[j]; e < s.EStart[j+1]; e++ {
			k := int(s.EIn[e])
			if i := int(s.ClOf[k]); pred[i] == -2 && s.Flow[k] > 1e-12*s.Demand[i] {
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
				a = math.Min(a, s.Flow[k])
				u = nc + int(s.Eng[k])
			} else {
				u = int(s.ClOf[k])
			}
		}
		if !(a > 0) {
			continue
		}
		for u := v; u != src; {
			k := int(pred[u])
			j := int(s.Eng[k])
			if u < nc {
				s.Flow[k] = math.Max(0, s.Flow[k]-a)
				s.Load[j] -= a
				u = nc + j
			} else {
				s.Flow[k] += a
				s.Load[j] += a
				u = int(s.ClOf[k])
			}
		}
		s.Shed[src] = math.Max(0, s.Shed[src]-a)
		if v < nc {
			s.Shed[v] = math.Min(s.Demand[v], s.Shed[v]+a)
		}
		moved += a
	}
	ps.sinks = sinks
	return moved
}

// deficit returns how much of cluster i's demand of the classes of phase n and dearer is shed,
// 0 below a relative 1e-9 of its demand.
func (s *State) deficit(i, n int) float64 {
	v := s.cum(i, n) - (s.Demand[i] - s.Shed[i])
	if v <= 1e-9*s.Demand[i] {
		return 0
	}
	return v
}

// surplus returns how much of cluster i's served traffic is of classes cheaper than phase n's,
// 0 below a relative 1e-9 of its demand.
func (s *State) surplus(i, n int) float64 {
	v := (s.Demand[i] - s.Shed[i]) - s.cum(i, n)
	if v <= 1e-9*s.Demand[i] {
		return 0
	}
	return v
}

// phaseRoom returns how much engine j can take below the phase's capacity, 0 below a relative 1e-9
// of its hard limit.
func (s *State) phaseRoom(j int) float64 {
	v := s.prio.capq[j] - s.Load[j]
	if v <= 1e-9*s.Cap[j] {
		return 0
	}
	return v
}
