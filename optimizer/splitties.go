package optimizer

import (
	"hash/maphash"
	"math"
)

// SplitTies splits the flows of sol that the objective of p leaves open in
// one way fixed by the loads alone. Clusters whose network rows agree (the
// same engines, the latencies equal up to a constant, to within tol times
// the solution's mean latency) pay the same for any split among them of
// the traffic they send together, and so do engines whose network columns
// agree for any split among them of the traffic they take: along a cycle
// that trades traffic between two such clusters and two such engines the
// cost does not change. The solver returns one of those equally good
// splits, depending on its path and warm start, so that equal clusters of
// one region trade their shares of equal engines from one solve to the
// next while no load moves: keys move for nothing. SplitTies gives each
// cluster of such a group the group's traffic to each class of equal
// engines in proportion to what the cluster serves, and each engine of the
// class its share in proportion to its load:
//
//	x_ij = F_GE · (S_i / S_G) · (X_j / X_E)
//
// F_GE being what the clusters of group G send to the engines of class E,
// S_i what cluster i serves (S_G the group's) and X_j engine j's load
// (X_E the class's). Every engine's load and every cluster's served and
// shed traffic stay as they were, and so does the objective where the
// lines agree exactly; within the tolerance it moves by a few times tol of
// the mean latency per request moved, and the objective and gap are
// updated by it (with tol the solver's own relative tolerance, that is
// within what the solve was certified to). The result depends only on the
// loads, the served traffic and the block totals F_GE, and moves
// continuously with them. Clusters and engines are visited by index: it is
// deterministic.
func SplitTies(p *Problem, sol *Solution, tol float64) {
	if sol == nil || len(sol.Clusters) != len(p.Clusters) || len(sol.Engines) != len(p.Engines) || !(tol >= 0) {
		return
	}
	tolMs := 0.0
	if m := sol.MeanLatencyMs; m > 0 && !math.IsInf(m, 0) {
		tolMs = tol * m
	}
	nc, ne := len(p.Clusters), len(p.Engines)
	for i := range nc {
		if len(sol.Clusters[i].Engines) != len(p.Network[i]) || len(sol.Clusters[i].FlowsRPS) != len(p.Network[i]) {
			return
		}
	}
	// Columns: the clusters each engine may serve, with their latency.
	cols := make([][]Link, ne)
	for i := range nc {
		for _, l := range p.Network[i] {
			cols[l.Engine] = append(cols[l.Engine], Link{Engine: i, Ms: l.Ms})
		}
	}
	cg, ng := groupAlike(p.Network, tolMs)
	ec, nec := groupAlike(cols, tolMs)

	served := make([]float64, nc)
	sG := make([]float64, ng)
	load := make([]float64, ne)
	xE := make([]float64, nec)
	for i := range nc {
		for k, j := range sol.Clusters[i].Engines {
			x := math.Max(0, sol.Clusters[i].FlowsRPS[k])
			served[i] += x
			load[j] += x
		}
		sG[cg[i]] += served[i]
	}
	for j := range ne {
		xE[ec[j]] += load[j]
	}
	// F[g][class]: what group g sends to each class of engines.
	f := make([]map[int]float64, ng)
	for i := range nc {
		g := cg[i]
		if f[g] == nil {
			f[g] = map[int]float64{}
		}
		for k, j := range sol.Clusters[i].Engines {
			f[g][ec[j]] += math.Max(0, sol.Clusters[i].FlowsRPS[k])
		}
	}
	delta := 0.0 // the change of the objective, ms·req/s
	changed := false
	for i := range nc {
		cr := &sol.Clusters[i]
		g := cg[i]
		if !(sG[g] > 0) {
			continue
		}
		share := served[i] / sG[g]
		for k, j := range cr.Engines {
			e := ec[j]
			x := 0.0
			if xE[e] > 0 {
				x = f[g][e] * share * load[j] / xE[e]
			}
			if x != cr.FlowsRPS[k] {
				delta += (x - cr.FlowsRPS[k]) * p.Network[i][k].Ms
				cr.FlowsRPS[k] = x
				changed = true
			}
		}
	}
	if !changed {
		return
	}
	summarise(p, sol)
	updateGap(&sol.Diagnostics, delta)
}

// groupAlike numbers the lines (rows or columns of the network table, each
// sorted by index) so that lines alike (see alike) with a group's first
// line share its number: each line joins the first group, in order of
// their first lines, it fits. It returns the numbers and how many there
// are.
func groupAlike(lines [][]Link, tolMs float64) ([]int, int) {
	seed := maphash.MakeSeed()
	type group struct{ first, id int }
	buckets := map[uint64][]group{}
	out := make([]int, len(lines))
	n := 0
	for a, line := range lines {
		var h maphash.Hash
		h.SetSeed(seed)
		for _, l := range line {
			maphash.WriteComparable(&h, l.Engine)
		}
		key := h.Sum64()
		found := -1
		for _, g := range buckets[key] {
			if alike(lines[g.first], line, tolMs) {
				found = g.id
				break
			}
		}
		if found < 0 {
			found = n
			n++
			buckets[key] = append(buckets[key], group{first: a, id: found})
		}
		out[a] = found
	}
	return out, n
}

// alike reports whether two lines list the same indices with latencies
// that differ by the same amount everywhere, to within tolMs: a line
// farther by a constant (a cluster farther from every engine, an engine
// farther from every cluster) changes the cost of every split alike.
func alike(a, b []Link, tolMs float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if a[k].Engine != b[k].Engine || math.Abs((a[k].Ms-a[0].Ms)-(b[k].Ms-b[0].Ms)) > tolMs {
			return false
		}
	}
	return true
}

// summarise recomputes what sol says of its clusters from their flows:
// weights, shed, mean latencies, and the solution's mean latency.
func summarise(p *Problem, sol *Solution) {
	var latSum, served float64
	for i := range sol.Clusters {
		cr := &sol.Clusters[i]
		cr.ShedRPS = 0
		for q := range NumPriorities {
			cr.ShedByPriority[q] = math.Max(0, cr.ShedByPriority[q])
			cr.ShedRPS += cr.ShedByPriority[q]
		}
		var l, x float64
		for k, j := range cr.Engines {
			cr.FlowsRPS[k] = math.Max(0, cr.FlowsRPS[k])
			if cr.DemandRPS > 0 {
				cr.Weights[k] = cr.FlowsRPS[k] / cr.DemandRPS
			}
			l += cr.FlowsRPS[k] * (p.Network[i][k].Ms + sol.Engines[j].LatencyMs)
			x += cr.FlowsRPS[k]
		}
		if cr.DemandRPS > 0 {
			cr.ShedFraction = cr.ShedRPS / cr.DemandRPS
		}
		cr.MeanLatencyMs = 0
		if x > 0 {
			cr.MeanLatencyMs = l / x
		}
		latSum += l
		served += x
	}
	if served > 0 && !math.IsInf(sol.MeanLatencyMs, 0) {
		sol.MeanLatencyMs = latSum / served
	}
}

// updateGap adds delta, a change of the latency part of the objective, to
// the objective and to the gap of d.
func updateGap(d *Diagnostics, delta float64) {
	d.Objective += delta
	if d.Gap >= 0 && !math.IsInf(d.Gap, 0) && d.RelGap > 0 {
		// RelGap = Gap / latency part: the latency part grows by delta too.
		lat := d.Gap / d.RelGap
		d.Gap += delta
		if lat+delta > 0 {
			d.RelGap = d.Gap / (lat + delta)
		}
	} else if d.Gap >= 0 {
		d.Gap += delta
	}
}
