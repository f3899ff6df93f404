package flow

import (
	"math"
	"time"
)

// The per-cluster equilibration: one cluster's flows and shed, exactly optimal with the other
// clusters' loads fixed (one Gauss-Seidel step).

// Expired reports whether the deadline end (zero: none) has passed, and records it in
// OutOfTime.
func (s *State) Expired(end time.Time) bool {
	if end.IsZero() || time.Now().Before(end) {
		return false
	}
	s.OutOfTime = true
	return true
}

// Kappa returns cluster i's proximal price: Opt.ProximalMs when it has a previous solution to
// stay close to (Anchor), else 0.
func (s *State) Kappa(i int) float64 {
	if s.Anchor[i] {
		return s.Opt.ProximalMs
	}
	return 0
}

// FlowAt returns cluster-edge k's flow at level mu and its derivative.
func (s *State) FlowAt(k int, mu, kappa float64) (float64, float64) {
	j := int(s.Eng[k])
	base := s.Dist[k]
	xo, room := s.Xo[k], s.Room[k]
	if kappa == 0 {
		if mu <= s.Thr[k] {
			return 0, 0
		}
		l, d := s.Inv(j, mu-base)
		v := l - xo
		if v <= 0 {
			return 0, 0
		}
		if v >= room {
			return room, 0
		}
		return v, d
	}
	x0 := s.Flow0[k]
	var v, d float64
	if mu-kappa > s.Thr[k] {
		l, dd := s.Inv(j, mu-base-kappa)
		if l-xo > x0 {
			v, d = l-xo, dd
			goto clip
		}
	}
	if mu+kappa > s.Thr[k] {
		l, dd := s.Inv(j, mu-base+kappa)
		if l-xo < x0 {
			v, d = l-xo, dd
		} else {
			v, d = x0, 0
		}
	} else {
		v, d = 0, 0
	}
clip:
	if v <= 0 {
		return 0, 0
	}
	if v >= room {
		return room, 0
	}
	return v, d
}

// FlowSum returns the flow over links e0..e1 at level mu, and its derivative in mu.
func (s *State) FlowSum(e0, e1 int, mu, kappa float64) (float64, float64) {
	sum, ds := 0.0, 0.0
	for k := e0; k < e1; k++ {
		v, d := s.FlowAt(k, mu, kappa)
		sum += v
		ds += d
	}
	return sum, ds
}

// root finds a level mu in [a, b] with flowSum(mu) = T, given flowSum(a) ≤ T ≤ flowSum(b),
// by Newton's method safeguarded with bisection.
func (s *State) root(e0, e1 int, T, a, b, guess, kappa float64) (float64, float64) {
	tol := 1e-13 * T
	mu := guess
	if !(mu > a && mu < b) {
		mu = a + math.Min(0.5*(b-a), 0.25*(math.Abs(a)+1))
	}
	for it := 0; it < 300; it++ {
		A, dA := s.FlowSum(e0, e1, mu, kappa)
		diff := A - T
		if math.Abs(diff) <= tol {
			return mu, mu
		}
		if diff < 0 {
			a = mu
		} else {
			b = mu
		}
		if b-a <= 1e-15*math.Max(math.Abs(a), math.Abs(b)) {
			return b, a
		}
		next := math.NaN()
		if dA > 0 {
			next = mu - diff/dA
		}
		if !(next > a && next < b) {
			if b-a > 4*(math.Abs(a)+1) {
				next = a + 2*(math.Abs(a)+1)
			} else {
				next = 0.5 * (a + b)
			}
		}
		mu = next
	}
	return b, a
}

// UpdateCluster re-optimises cluster i's flows and shed given all other clusters' flows.
func (s *State) UpdateCluster(i int) {
	e0, e1 := s.Start[i], s.Start[i+1]
	kappa := s.Kappa(i)
	lo := math.Inf(1)
	for k := e0; k < e1; k++ {
		j := s.Eng[k]
		s.Load[j] -= s.Flow[k]
		xo := math.Max(s.Load[j], 0)
		s.Xo[k] = xo
		s.Room[k] = math.Max(s.Cap[j]-xo, 0)
		s.Thr[k] = s.Dist[k] + s.Cost(int(j), xo)
		if t := s.Thr[k] - kappa; t < lo {
			lo = t
		}
	}
	D := s.Demand[i]
	var mu, shed float64
	switch {
	case D <= 0:
		mu, shed = math.NaN(), 0
		for k := e0; k < e1; k++ {
			s.Flow[k] = 0
		}
	case e0 == e1:
		mu, shed = math.Inf(1), D
	default:
		var below float64
		mu, below, shed = s.level(i, e0, e1, D, lo, kappa)
		sum := 0.0
		for k := e0; k < e1; k++ {
			s.Flow[k], s.DFlow[k] = s.FlowAt(k, mu, kappa)
			sum += s.Flow[k]
		}
		if below < mu && sum > D-shed {
			// The flows jump between below and mu (flat marginal costs): interpolate.
			sumBelow := 0.0
			for k := e0; k < e1; k++ {
				s.Xo[k], _ = s.FlowAt(k, below, kappa) // xo is free again: reuse as scratch
				sumBelow += s.Xo[k]
			}
			if f := (D - shed - sumBelow) / (sum - sumBelow); f >= 0 && f <= 1 {
				sum = 0
				for k := e0; k < e1; k++ {
					s.Flow[k] = s.Xo[k] + f*(s.Flow[k]-s.Xo[k])
					sum += s.Flow[k]
				}
			}
		}
		s.fixResidual(e0, e1, D-shed-sum)
		sum = 0
		for k := e0; k < e1; k++ {
			sum += s.Flow[k]
		}
		shed = math.Max(0, D-sum)
	}
	for k := e0; k < e1; k++ {
		s.Load[s.Eng[k]] += s.Flow[k]
	}
	s.Mu[i], s.Shed[i] = mu, shed
}

// level finds cluster i's marginal-cost level and its shed: the classes whose shed price is
// below the level are shed entirely, one whose price equals it partly, and the engines take the
// rest. lo is a level at which no engine takes any flow.
func (s *State) level(i, e0, e1 int, D, lo, kappa float64) (mu, below, shed float64) {
	dem := &s.Classes[i]
	cum := 0.0
	a := lo
	for _, q := range s.Order {
		P := s.Opt.ShedPriceMs[q]
		AP := 0.0
		if P > lo {
			AP, _ = s.FlowSum(e0, e1, P, kappa)
		}
		if AP+cum >= D {
			T := D - cum
			if T <= 0 {
				return a, a, cum
			}
			mu, below := s.root(e0, e1, T, math.Max(a, lo), P, s.Mu[i], kappa)
			return mu, below, cum
		}
		if AP+cum+dem[q] >= D {
			return P, P, D - AP
		}
		cum += dem[q]
		a = math.Max(a, P)
	}
	// Unreachable in exact arithmetic (all classes shed covers D); shed everything.
	P := s.Opt.ShedPriceMs[s.Order[NumClasses-1]]
	return P, P, D
}

// fixResidual adds r (a rounding residual, positive or negative) to the cluster's flows,
// preferring edges whose flow is still moving with the level.
func (s *State) fixResidual(e0, e1 int, r float64) {
	if r == 0 {
		return
	}
	best := -1
	for k := e0; k < e1; k++ {
		if s.DFlow[k] > 0 && (best < 0 || s.DFlow[k] > s.DFlow[best]) {
			best = k
		}
	}
	if best >= 0 {
		v := math.Min(math.Max(s.Flow[best]+r, 0), s.Room[best])
		r -= v - s.Flow[best]
		s.Flow[best] = v
	}
	for k := e0; k < e1 && r != 0; k++ {
		if r < 0 && s.Flow[k] > 0 || r > 0 && s.Flow[k] < s.Room[k] && s.Flow[k] > 0 {
			v := math.Min(math.Max(s.Flow[k]+r, 0), s.Room[k])
			r -= v - s.Flow[k]
			s.Flow[k] = v
		}
	}
}
