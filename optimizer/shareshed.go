package optimizer

import "math"

// ShareShed re-splits the capacity sol serves among the clusters of p so
// that, when capacity is short, the clusters that can use the same engines
// shed the same fraction of their demand of the class being shed, instead
// of whichever is farthest from the capacity (the objective alone sheds
// the cluster whose traffic costs the most network latency to serve, so
// one region loses most of its traffic while its neighbours lose none).
// Priority comes first: capacity moves between two clusters only for the
// same class, the giving cluster's cheapest class served and the taking
// cluster's dearest class shed. Each move takes traffic of one engine from
// one cluster and gives it to another that may use the engine, so every
// engine's load, and with it every capacity limit and engine-side latency,
// stays as the solver left it; only network latency changes, and the
// objective and the gap are updated by it. Clusters, engines and classes
// are visited by index: the result is deterministic.
func ShareShed(p *Problem, sol *Solution) {
	if sol == nil || !(sol.ShedRPS > 0) || len(sol.Clusters) != len(p.Clusters) {
		return
	}
	nc := len(p.Clusters)
	// pos[i][j] is the index of engine j in cluster i's row, -1 when it
	// may not serve the cluster.
	pos := make([][]int, nc)
	for i := range pos {
		pos[i] = make([]int, len(p.Engines))
		for j := range pos[i] {
			pos[i][j] = -1
		}
		for k, j := range sol.Clusters[i].Engines {
			pos[i][j] = k
		}
	}
	shed := func(i, q int) float64 { return sol.Clusters[i].ShedByPriority[q] }
	dem := func(i, q int) float64 { return p.Clusters[i].Demand[q] }
	const eps = 1e-9
	delta := 0.0 // the change of the objective, ms·req/s
	moved := false
	for q := range NumPriorities {
		// Water-filling: a cluster that sheds more than the share of the
		// others and can take nothing more from them (it may not use
		// their engines) keeps its shed and leaves the pool; the share is
		// then that of the rest.
		stuck := make([]bool, nc)
		for range nc {
			var totShed, totDem float64
			for i := range nc {
				if !stuck[i] {
					totShed += shed(i, q)
					totDem += dem(i, q)
				}
			}
			if !(totShed > eps) || !(totDem > totShed+eps) {
				break // nothing shed of this class, or all of it
			}
			f := totShed / totDem
			more := false
			for i := range nc { // takers: shed more than their share
				if stuck[i] || !(shed(i, q) > f*dem(i, q)+eps) || dearerShed(sol, i, q) {
					continue
				}
				for k := range nc { // givers: shed less than their share
					if k == i || stuck[k] || !(shed(k, q) < f*dem(k, q)-eps) || cheaperServed(sol, p, k, q) {
						continue
					}
					ck := &sol.Clusters[k]
					for kk, j := range ck.Engines {
						ki := pos[i][j]
						if ki < 0 || !(ck.FlowsRPS[kk] > eps) {
							continue
						}
						d := math.Min(ck.FlowsRPS[kk], math.Min(shed(i, q)-f*dem(i, q), f*dem(k, q)-shed(k, q)))
						if !(d > eps) {
							break
						}
						ci := &sol.Clusters[i]
						ck.FlowsRPS[kk] -= d
						ci.FlowsRPS[ki] += d
						ck.ShedByPriority[q] += d
						ci.ShedByPriority[q] -= d
						delta += d * (p.Network[i][ki].Ms - p.Network[k][kk].Ms)
						moved = true
					}
				}
				if shed(i, q) > f*dem(i, q)+1e-6 {
					stuck[i], more = true, true
				}
			}
			if !more {
				break
			}
		}
	}
	if !moved {
		return
	}
	summarise(p, sol)
	d := &sol.Diagnostics
	updateGap(d, delta)
	d.Notes = append(d.Notes, "shed shared in proportion to demand within each class (ShareShed)")
}

// dearerShed reports whether cluster i sheds some of a class dearer than q.
func dearerShed(sol *Solution, i, q int) bool {
	for r := range q {
		if sol.Clusters[i].ShedByPriority[r] > 1e-9 {
			return true
		}
	}
	return false
}

// cheaperServed reports whether cluster k serves some of a class cheaper
// than q.
func cheaperServed(sol *Solution, p *Problem, k, q int) bool {
	for r := q + 1; r < NumPriorities; r++ {
		if p.Clusters[k].Demand[r]-sol.Clusters[k].ShedByPriority[r] > 1e-9 {
			return true
		}
	}
	return false
}
