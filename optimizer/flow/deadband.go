package flow

import "math"

// DeadBand, after a warm-started solve (warm), restores the previous weights of clusters
// whose new weights moved less than the dead band, as long as no engine is pushed over its hard limit. It returns how many it kept.
// It reads each cluster's distance from its previous flows (dev, anc) from the last
// certificate, which was computed at the current flows (the sweeps end with one).
func (s *State) DeadBand(warm bool) int {
	if !warm || s.Opt.DeadBand <= 0 {
		return 0
	}
	kept := 0
	s.keep = Grow(s.keep, len(s.Demand))
	keep := s.keep
	// Each engine's limit for the kept weights: its hard limit, and, when some traffic is
	// shed, no load beyond both the solve's and the one at which its marginal cost reaches
	// the cheapest shed price (there a stale 1% can multiply an engine's latency).
	s.dbLim = GrowRaw(s.dbLim, len(s.Load))
	copy(s.dbLim, s.Cap)
	if P := s.ShedPriceFloor(); !math.IsInf(P, 1) {
		for j := range s.dbLim {
			if s.Cap[j] > 0 {
				x, _ := s.Curves[j].InverseMarginal(P)
				s.dbLim[j] = math.Min(s.Cap[j], math.Max(s.Load[j], x))
			}
		}
	}
	for i := range s.Demand {
		D := s.Demand[i]
		if !s.Anchor[i] || D <= 0 {
			continue
		}
		prevShed := math.Max(0, D-s.anc[i])
		tv := (s.dev[i] + math.Abs(s.Shed[i]-prevShed)) / (2 * D)
		if tv >= s.Opt.DeadBand || tv == 0 {
			continue
		}
		for k := s.Start[i]; k < s.Start[i+1]; k++ {
			s.Load[s.Eng[k]] += s.Flow0[k] - s.Flow[k]
		}
		keep[i] = true
		kept++
	}
	// Revert kept clusters on engines pushed over their limit.
	over := false
	for j := range s.Load {
		if s.Load[j] > s.dbLim[j] {
			over = true
			break
		}
	}
	for i := range s.Demand {
		if !over || !keep[i] {
			continue
		}
		e0, e1 := s.Start[i], s.Start[i+1]
		over := false
		for k := e0; k < e1; k++ {
			if j := s.Eng[k]; s.Load[j] > s.dbLim[j] {
				over = true
				break
			}
		}
		if over {
			for k := e0; k < e1; k++ {
				s.Load[s.Eng[k]] -= s.Flow0[k] - s.Flow[k]
			}
			keep[i] = false
			kept--
		}
	}
	for i := range s.Demand {
		if !keep[i] {
			continue
		}
		e0, e1 := s.Start[i], s.Start[i+1]
		copy(s.Flow[e0:e1], s.Flow0[e0:e1])
		s.Shed[i] = math.Max(0, s.Demand[i]-s.anc[i]) // anc: the sum of x0 over the row
	}
	for j := range s.Load {
		s.Load[j] = math.Max(0, s.Load[j])
	}
	return kept
}
