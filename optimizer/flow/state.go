// Package flow holds a routing problem in the index form the solver's algorithms share: the
// clusters' rows of links (CSR), the engines' curves and capacities, and the point being
// solved — flows per link, loads per engine, shed and level per cluster. On it live the rules
// every algorithm uses: the per-cluster equilibration (one Gauss-Seidel step), the duality-gap
// certificate, the dead band and the repair that sheds by priority across clusters.
//
// The package is the optimizer's internals: optimizer builds a State from a Problem, runs the
// algorithms of its sub-packages on it and reads the Solution off it (docs/optimizer.md).
package flow

import (
	"time"
)

// NumClasses is the number of priority classes (optimizer.NumPriorities).
const NumClasses = 3

// Options are the solver options the algorithms read; optimizer.Options sets them.
type Options struct {
	// Tolerance is the target relative gap.
	Tolerance float64
	// MaxSweeps bounds the Gauss-Seidel sweeps.
	MaxSweeps int
	// ShedPriceMs is the price of shedding one req/s of each class, indexed by priority.
	ShedPriceMs [NumClasses]float64
	// ProximalMs is the anti-churn price per req/s moved (0: none).
	ProximalMs float64
	// DeadBand is the total-variation distance below which a cluster keeps its previous
	// weights (0: none).
	DeadBand float64
}

// Curve is a latency profile bound to an engine: engine-side latency L(x) in ms at load x req/s,
// increasing and convex, with a hard load limit. The solver uses the marginal cost
// F'(x) = d/dx (x·L(x)) and its inverse.
type Curve interface {
	// Capacity returns the hard limit on the load, in req/s.
	Capacity() float64
	// Latency returns L(x) in ms; it may be +Inf at or beyond capacity.
	Latency(x float64) float64
	// Marginal returns F'(x) = L(x) + x·L'(x), the marginal cost of one more req/s.
	Marginal(x float64) float64
	// InverseMarginal returns the largest load x in [0, Capacity()] with Marginal(x) ≤ m, and
	// dx/dm there (0 when clamped).
	InverseMarginal(m float64) (x, slope float64)
	// InverseLatency returns the largest load x in [0, Capacity()] with Latency(x) ≤ l, and
	// dx/dl there (0 when clamped).
	InverseLatency(l float64) (x, slope float64)
}

// State is a problem in index form and the point the algorithms move. Per cluster i the links
// are Start[i]..Start[i+1] of the per-link slices; engines are indexed as in the problem. The
// algorithms keep the point consistent: Load[j] is the sum of Flow over engine j's links and
// Shed[i] the cluster's demand not sent over its links.
type State struct {
	// Opt holds the options, defaults applied.
	Opt Options
	// Equilibrium makes the costs average rather than marginal latencies (least-latency).
	Equilibrium bool
	// Order lists the priority classes by ascending shed price.
	Order [NumClasses]int

	// Per cluster: the first link, total demand, demand by class, level (NaN: none), shed,
	// and whether the cluster has a previous solution to stay close to.
	Start   []int
	Demand  []float64
	Classes [][NumClasses]float64
	Mu      []float64
	Shed    []float64
	Anchor  []bool
	// Per link: engine, network latency, flow, the previous solution's flow, and the
	// equilibration's scratch (the other clusters' load, the room left, the threshold level
	// and the flow's slope).
	Eng                  []int32
	Dist, Flow, Flow0    []float64
	Xo, Room, Thr, DFlow []float64
	// Per engine: curve, hard limit, load, capacity price, subgradient of the cost, latency,
	// marginal cost at the hard limit, and scratch for the certificate.
	Curves             []Curve
	Cap, Load, Lam, FP []float64
	Lat, CapMarg, Bidv []float64

	// Links counts the changes of the network rows' engines and Dists those of the rows'
	// engines or latencies; views built from the rows record the counts they were built at.
	Links, Dists uint64

	// The engine-major view of the links (EngineView): engine j's incoming links are
	// EIn[EStart[j]:EStart[j+1]] (CSR link indices), with their clusters ECl and latencies
	// EDist in that order; ClOf is the cluster of each CSR link.
	EStart               []int
	EIn, ClOf, ECl       []int32
	EDist                []float64
	fill                 []int
	viewLinks, viewDists uint64

	// FastEnd and End are the deadlines of the fast paths and of the whole solve (zero:
	// none); OutOfTime records that one of them was reached (Expired).
	FastEnd, End time.Time
	OutOfTime    bool

	// RowOut, when set, is called by Measure for each cluster as the certificate passes over
	// its links (the caller writes the cluster's routing while they are in cache).
	RowOut func(i int)

	offers       []offer
	bidHi, lamHi []float64
	gj, gmin     []float64 // per engine, in gapWith
	dev, anc     []float64 // per cluster, from gapWith
	keep         []bool    // per cluster, in DeadBand
	dbLim        []float64 // per engine, in DeadBand
	prio         prioState
}

type offer struct{ price, amount float64 }

// Measures is the certificate of a point: the duality gap, the relative gap and the
// objective split into latency, proximal and shed cost.
type Measures struct {
	Gap, RelGap, Objective, LatCost, ProxCost, ShedCost float64
}

// GrowRaw returns b resized to n elements without clearing them, reallocating when its
// capacity is short; for buffers that the caller overwrites entirely.
func GrowRaw[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

// Grow returns b resized to n zeroed elements, reallocating when its capacity is short.
func Grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	b = b[:n]
	clear(b)
	return b
}

// Cost returns engine j's cost of one more req/s at load x: its marginal cost, or its
// latency under Equilibrium.
func (s *State) Cost(j int, x float64) float64 {
	if s.Equilibrium {
		return s.Curves[j].Latency(x)
	}
	return s.Curves[j].Marginal(x)
}

// Inv inverts Cost: the largest load of engine j at cost m, and its slope.
func (s *State) Inv(j int, m float64) (float64, float64) {
	if s.Equilibrium {
		return s.Curves[j].InverseLatency(m)
	}
	return s.Curves[j].InverseMarginal(m)
}

// EngineView builds the engine-major view of the links (EStart, EIn, ClOf, ECl, EDist). It is
// kept between solves while the network rows (cluster starts and engines) are the same, as on
// warm re-solves of one deployment and on the second run of a cold solve; only the latencies
// are copied again when they changed.
func (s *State) EngineView() {
	nc, ne := len(s.Demand), len(s.Load)
	if s.viewLinks == s.Links && len(s.EStart) == ne+1 && len(s.EIn) == len(s.Eng) {
		if s.viewDists != s.Dists {
			// The same links at other latencies.
			for e, k := range s.EIn {
				s.EDist[e] = s.Dist[k]
			}
			s.viewDists = s.Dists
		}
		return
	}
	edges := len(s.Eng)
	s.EStart = GrowRaw(s.EStart, ne+1)
	clear(s.EStart)
	for _, j := range s.Eng {
		s.EStart[j+1]++
	}
	for j := 0; j < ne; j++ {
		s.EStart[j+1] += s.EStart[j]
	}
	s.EIn = GrowRaw(s.EIn, edges)
	s.ClOf = GrowRaw(s.ClOf, edges)
	fill := append(s.fill[:0], s.EStart...)
	for i := 0; i < nc; i++ {
		for k := s.Start[i]; k < s.Start[i+1]; k++ {
			j := s.Eng[k]
			s.EIn[fill[j]] = int32(k)
			fill[j]++
			s.ClOf[k] = int32(i)
		}
	}
	s.fill = fill[:0]
	// Engine-major copies of the links' clusters and latencies: the per-engine scans of every
	// round then read memory in order instead of striding over the cluster-major CSR arrays.
	s.ECl = GrowRaw(s.ECl, edges)
	s.EDist = GrowRaw(s.EDist, edges)
	for e, k := range s.EIn {
		s.ECl[e] = s.ClOf[k]
		s.EDist[e] = s.Dist[k]
	}
	s.viewLinks, s.viewDists = s.Links, s.Dists
}

// CommonLevel returns the price at which all engines together supply the total demand (the
// scale of the clusters' levels, from which ε is chosen).
func (s *State) CommonLevel() float64 {
	total := 0.0
	for i := range s.Demand {
		total += s.Demand[i]
	}
	supply := func(m float64) float64 {
		v := 0.0
		for j := range s.Curves {
			if s.Cap[j] > 0 {
				x, _ := s.Curves[j].InverseMarginal(m)
				v += x
			}
		}
		return v
	}
	lo, hi := 0.0, 1.0
	for supply(hi) < total && hi < 1e12 {
		lo, hi = hi, hi*4
	}
	for it := 0; it < 60 && hi-lo > 1e-9*hi; it++ {
		if m := 0.5 * (lo + hi); supply(m) < total {
			lo = m
		} else {
			hi = m
		}
	}
	return hi
}
