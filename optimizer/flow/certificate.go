package flow

import (
	"math"
	"slices"
)

// ShedCost returns the cost of shedding amount s of cluster i, cheapest classes first.
func (s *State) ShedCost(i int, amount float64) float64 {
	dem := &s.Classes[i]
	c := 0.0
	for _, q := range s.Order {
		if amount <= 0 {
			break
		}
		t := math.Min(amount, dem[q])
		c += t * s.Opt.ShedPriceMs[q]
		amount -= t
	}
	return c
}

// Measure computes the objective and the duality gap certificate of the current flows; with
// updatePrices it first updates the capacity prices of engines at their hard limit.
func (s *State) Measure(updatePrices bool) Measures {
	// fp is a subgradient of each engine's cost at its load. At a kink of the profile any
	// value between the left and right derivative is valid; the one nearest the valuation
	// (level minus network latency) of the engine's users makes the certificate tight.
	// The users' pass is needed only when some engine sits at a kink (left and right
	// derivatives apart by more than rounding), as at the corners of points profiles.
	kinks, full := false, false
	for j := range s.Load {
		s.Lat[j] = s.Curves[j].Latency(s.Load[j])
		right := s.Cost(j, s.Load[j])
		left := right
		if s.Load[j] > 0 {
			left = s.Cost(j, s.Load[j]*(1-1e-12))
		}
		s.FP[j], s.Bidv[j] = right, left // bidv: scratch for the left derivative
		if left < right*(1-1e-9) {
			kinks = true
		}
		if s.Cap[j] > 0 && s.Load[j] >= s.Cap[j]*(1-1e-9) {
			full = true
		}
	}
	if kinks {
		for j := range s.Load {
			s.FP[j] = math.Inf(1)
		}
		for i := range s.Demand {
			if math.IsNaN(s.Mu[i]) || math.IsInf(s.Mu[i], 0) {
				continue
			}
			for k := s.Start[i]; k < s.Start[i+1]; k++ {
				if j := s.Eng[k]; s.Flow[k] > 0 && s.Mu[i]-s.Dist[k] < s.FP[j] {
					s.FP[j] = s.Mu[i] - s.Dist[k]
				}
			}
		}
		for j := range s.Load {
			right := s.Cost(j, s.Load[j])
			s.FP[j] = math.Min(math.Max(s.FP[j], s.Bidv[j]), right)
		}
	}
	if updatePrices && !full {
		// No engine at its hard limit: no capacity prices.
		clear(s.Lam)
		return s.gapWith(s.Lam)
	}
	if updatePrices {
		// The capacity price of an engine at its limit is what its users value it at beyond
		// its marginal cost fp (level minus network latency minus fp). Away from the optimum
		// users disagree; both the least and the greatest valuation give valid certificates,
		// and the smaller gap is kept.
		s.bidHi = GrowRaw(s.bidHi, len(s.Load))
		s.lamHi = GrowRaw(s.lamHi, len(s.Load))
		for j := range s.Bidv {
			s.Bidv[j], s.bidHi[j] = math.Inf(1), 0
		}
		for i := range s.Start[:len(s.Start)-1] {
			if !(s.Demand[i] > 0) || math.IsNaN(s.Mu[i]) || math.IsInf(s.Mu[i], 0) {
				continue
			}
			for k := s.Start[i]; k < s.Start[i+1]; k++ {
				j := s.Eng[k]
				b := s.Mu[i] - s.Dist[k] - s.FP[j]
				if s.Flow[k] > 0 && b < s.Bidv[j] {
					s.Bidv[j] = b
				}
				if b > s.bidHi[j] {
					s.bidHi[j] = b
				}
			}
		}
		for j := range s.Lam {
			s.Lam[j], s.lamHi[j] = 0, 0
			if s.Cap[j] > 0 && s.Load[j] >= s.Cap[j]*(1-1e-9) {
				if !math.IsInf(s.Bidv[j], 1) && s.Bidv[j] > 0 {
					s.Lam[j] = s.Bidv[j]
				}
				s.lamHi[j] = s.bidHi[j]
			}
		}
		mLo := s.gapWith(s.Lam)
		if slices.Equal(s.Lam, s.lamHi) {
			return mLo // no engine at its limit, or users that agree: one certificate
		}
		mHi := s.gapWith(s.lamHi)
		if mHi.Gap < mLo.Gap {
			copy(s.Lam, s.lamHi)
			return mHi
		}
		return mLo
	}
	return s.gapWith(s.Lam)
}

// gapWith computes the objective and the duality gap with capacity prices lam. It also leaves
// in dev and anc, per anchored cluster, Σ|x − x0| and Σ x0 over its links (DeadBand reads them).
func (s *State) gapWith(lam []float64) Measures {
	var m Measures
	gap := 0.0
	// Per engine: the linearised cost fp + λ of a unit of flow (g), and the same for the lower
	// bound's cheapest option, +Inf for an engine of zero capacity: it can never take traffic
	// (its capacity price may be taken as infinite), so it does not lower the bound.
	s.gj = GrowRaw(s.gj, len(lam))
	s.gmin = GrowRaw(s.gmin, len(lam))
	for j := range lam {
		gap += lam[j] * (s.Cap[j] - s.Load[j])
		s.gj[j] = s.FP[j] + lam[j]
		s.gmin[j] = math.Inf(1)
		if s.Cap[j] > 0 {
			s.gmin[j] = s.gj[j]
		}
	}
	s.dev = GrowRaw(s.dev, len(s.Demand))
	s.anc = GrowRaw(s.anc, len(s.Demand))
	gj, gmin, lat := s.gj, s.gmin, s.Lat
	var latCost, proxCost, shedCost float64
	for i := range s.Demand {
		e0, e1 := s.Start[i], s.Start[i+1]
		D := s.Demand[i]
		s.dev[i], s.anc[i] = 0, 0
		if s.RowOut != nil {
			s.RowOut(i) // while the cluster's links are in cache
		}
		if D <= 0 {
			continue
		}
		kappa := s.Kappa(i)
		eng, dist, x, x0 := s.Eng[e0:e1], s.Dist[e0:e1], s.Flow[e0:e1], s.Flow0[e0:e1]
		// One pass over the links: the cost at the linearised prices, the latency, the
		// distance from the anchor and the cheapest option; the offers of the anchor's flows
		// are collected against the running cheapest option (a superset of those below the
		// final one, filtered below).
		served, cost, minG := 0.0, 0.0, math.Inf(1)
		offers := s.offers[:0]
		if s.Anchor[i] {
			dev, anc := 0.0, 0.0
			for r, j := range eng {
				xr, x0r, dr := x[r], x0[r], dist[r]
				g := dr + gj[j]
				served += g * xr
				cost += xr * (dr + lat[j])
				dev += math.Abs(xr - x0r)
				anc += x0r
				if gm := dr + gmin[j]; gm < minG {
					minG = gm
				}
				if kappa > 0 && x0r > 0 && g-2*kappa < minG {
					offers = append(offers, offer{g - kappa, x0r})
				}
			}
			s.dev[i], s.anc[i] = dev, anc
		} else {
			for r, j := range eng {
				xr, dr := x[r], dist[r]
				served += (dr + gj[j]) * xr
				cost += xr * (dr + lat[j])
				if g := dr + gmin[j]; g < minG {
					minG = g
				}
			}
		}
		latCost += cost
		anchorSum := 0.0
		if kappa > 0 {
			anchorSum = s.anc[i]
			prox := kappa * s.dev[i]
			proxCost += prox
			served += prox
			minG += kappa
		}
		sc := s.ShedCost(i, s.Shed[i])
		shedCost += sc
		// Lower bound: cheapest way to carry D at the linearised costs.
		w := 0
		if anchorSum > 0 {
			for _, o := range offers {
				if o.price < minG {
					offers[w] = o
					w++
				}
			}
		}
		offers = offers[:w]
		dem := &s.Classes[i]
		for q := range dem {
			if dem[q] > 0 && s.Opt.ShedPriceMs[q] < minG {
				offers = append(offers, offer{s.Opt.ShedPriceMs[q], dem[q]})
			}
		}
		slices.SortFunc(offers, func(a, b offer) int {
			switch {
			case a.price < b.price:
				return -1
			case a.price > b.price:
				return 1
			}
			return 0
		})
		lb, left := kappa*anchorSum, D
		if !(kappa > 0) {
			lb = 0
		}
		for _, o := range offers {
			t := math.Min(left, o.amount)
			lb += t * o.price
			left -= t
			if left <= 0 {
				break
			}
		}
		if left > 1e-12*D && !math.IsInf(minG, 1) {
			lb += left * minG
		}
		s.offers = offers
		gap += served + sc - lb
	}
	m.LatCost, m.ProxCost, m.ShedCost = latCost, proxCost, shedCost
	switch {
	case math.IsNaN(gap):
		gap = math.Inf(1)
	case gap < 0:
		gap = 0
	}
	m.Gap = gap
	m.Objective = m.LatCost + m.ProxCost + m.ShedCost
	switch den := m.LatCost + m.ProxCost; {
	case den > 0:
		m.RelGap = gap / den
	case m.Objective > 0:
		m.RelGap = gap / m.Objective
	case gap > 0:
		m.RelGap = math.Inf(1)
	}
	return m
}

// ShedPriceFloor returns the lowest shed price of a class that some cluster sheds (+Inf when
// nothing is shed).
func (s *State) ShedPriceFloor() float64 {
	P := math.Inf(1)
	for i := range s.Demand {
		if !(s.Shed[i] > 1e-9*s.Demand[i]) {
			continue
		}
		for q, D := range s.Classes[i] {
			if D > 0 {
				P = math.Min(P, s.Opt.ShedPriceMs[q])
			}
		}
	}
	return P
}
