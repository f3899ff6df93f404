// Package flowtest builds small flow.States for the tests of the solver's algorithm packages,
// which cannot import optimizer (it imports them) to set one up from a Problem.
package flowtest

import (
	"math"
	"testing"

	"github.com/switchyard-dev/switchyard/optimizer/flow"
)

// Linear is the curve L(x) = A + B·x up to Cap, so F'(x) = A + 2B·x.
type Linear struct{ A, B, Cap float64 }

// Capacity returns Cap.
func (c Linear) Capacity() float64 { return c.Cap }

// Latency returns A + B·x.
func (c Linear) Latency(x float64) float64 { return c.A + c.B*x }

// Marginal returns A + 2B·x.
func (c Linear) Marginal(x float64) float64 { return c.A + 2*c.B*x }

// InverseMarginal returns the load at marginal cost m, clamped to [0, Cap].
func (c Linear) InverseMarginal(m float64) (float64, float64) {
	return c.clamp((m-c.A)/(2*c.B), 1/(2*c.B))
}

// InverseLatency returns the load at latency l, clamped to [0, Cap].
func (c Linear) InverseLatency(l float64) (float64, float64) {
	return c.clamp((l-c.A)/c.B, 1/c.B)
}

func (c Linear) clamp(x, slope float64) (float64, float64) {
	switch {
	case x <= 0:
		return 0, 0
	case x >= c.Cap:
		return c.Cap, 0
	}
	return x, slope
}

// NewState returns the state of clusters of the given standard demand over the engines'
// curves, cluster i linked to engine j at dist[i][j] ms (NaN: no link), nothing routed yet,
// the shed prices of optimizer.DefaultOptions and the given tolerance.
func NewState(tol float64, demand []float64, dist [][]float64, curves []Linear) *flow.State {
	s := &flow.State{Order: [flow.NumClasses]int{2, 1, 0}, Links: 1, Dists: 1}
	s.Opt = flow.Options{Tolerance: tol, MaxSweeps: 5000, ShedPriceMs: [flow.NumClasses]float64{1e9, 1e8, 1e7}}
	for i, d := range demand {
		s.Start = append(s.Start, len(s.Eng))
		s.Demand = append(s.Demand, d)
		s.Classes = append(s.Classes, [flow.NumClasses]float64{1: d})
		s.Mu, s.Shed, s.Anchor = append(s.Mu, math.NaN()), append(s.Shed, d), append(s.Anchor, false)
		for j, ms := range dist[i] {
			if !math.IsNaN(ms) {
				s.Eng, s.Dist = append(s.Eng, int32(j)), append(s.Dist, ms)
			}
		}
	}
	s.Start = append(s.Start, len(s.Eng))
	for _, c := range curves {
		s.Curves = append(s.Curves, c)
		s.Cap = append(s.Cap, c.Cap)
		s.CapMarg = append(s.CapMarg, c.Marginal(c.Cap))
	}
	edges, ne := len(s.Eng), len(curves)
	for _, b := range []*[]float64{&s.Flow, &s.Flow0, &s.Xo, &s.Room, &s.Thr, &s.DFlow} {
		*b = make([]float64, edges)
	}
	for _, b := range []*[]float64{&s.Load, &s.Lam, &s.FP, &s.Lat, &s.Bidv} {
		*b = make([]float64, ne)
	}
	return s
}

// Conserved returns the largest violation, in req/s, of the state's bookkeeping: each
// cluster's flows plus shed against its demand, each engine's load against its links' flows,
// and negative flows.
func Conserved(s *flow.State) float64 {
	worst := 0.0
	load := make([]float64, len(s.Load))
	for i := range s.Demand {
		sum := s.Shed[i]
		for k := s.Start[i]; k < s.Start[i+1]; k++ {
			sum += s.Flow[k]
			load[s.Eng[k]] += s.Flow[k]
			worst = math.Max(worst, -s.Flow[k])
		}
		worst = math.Max(worst, math.Abs(sum-s.Demand[i]))
	}
	for j := range load {
		worst = math.Max(worst, math.Abs(load[j]-s.Load[j]))
	}
	return worst
}

// Case is a small problem for the algorithms' tests.
type Case struct {
	Name   string
	Demand []float64
	Dist   [][]float64
	Curves []Linear
}

// New returns the case's state, nothing routed, at tolerance tol.
func (c Case) New(tol float64) *flow.State { return NewState(tol, c.Demand, c.Dist, c.Curves) }

// Cases returns small problems with an interior optimum, a binding hard limit, a cluster
// without a link to every engine, and demand above capacity (shed).
func Cases() []Case {
	nan := math.NaN()
	return []Case{
		{"interior", []float64{40, 50}, [][]float64{{1, 5, 9}, {9, 5, 1}},
			[]Linear{{10, 1, 100}, {12, 0.5, 100}, {10, 1, 100}}},
		{"limit binds", []float64{60, 20}, [][]float64{{1, 5, 9}, {9, 5, 1}},
			[]Linear{{10, 0.1, 20}, {12, 0.5, 100}, {10, 1, 100}}},
		{"partial network", []float64{30, 30, 30}, [][]float64{{1, nan, 9}, {nan, 1, 5}, {4, 4, nan}},
			[]Linear{{10, 1, 100}, {12, 0.5, 100}, {10, 1, 100}}},
		{"shed", []float64{150, 150}, [][]float64{{1, 5, 9}, {9, 5, 1}},
			[]Linear{{10, 1, 50}, {12, 0.5, 50}, {10, 1, 50}}},
	}
}

// Check fails tb when the state's bookkeeping is off by more than 1e-9 of the demand or, with
// certified set, when the certificate of its point is above the state's tolerance.
func Check(tb testing.TB, name string, s *flow.State, certified bool) {
	tb.Helper()
	total := 0.0
	for _, d := range s.Demand {
		total += d
	}
	if v := Conserved(s); v > 1e-9*total {
		tb.Errorf("%s: bookkeeping off by %g req/s", name, v)
	}
	if m := s.Measure(true); certified && !(m.RelGap <= s.Opt.Tolerance) {
		tb.Errorf("%s: relative gap %g above the tolerance %g", name, m.RelGap, s.Opt.Tolerance)
	}
}
