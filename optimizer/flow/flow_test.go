package flow

import (
	"math"
	"testing"
)

// linear is the curve L(x) = a + b·x up to cap: F'(x) = a + 2b·x.
type linear struct{ a, b, cap float64 }

func (c linear) Capacity() float64          { return c.cap }
func (c linear) Latency(x float64) float64  { return c.a + c.b*x }
func (c linear) Marginal(x float64) float64 { return c.a + 2*c.b*x }
func (c linear) InverseMarginal(m float64) (float64, float64) {
	return c.clamp((m-c.a)/(2*c.b), 1/(2*c.b))
}
func (c linear) InverseLatency(l float64) (float64, float64) { return c.clamp((l-c.a)/c.b, 1/c.b) }
func (c linear) clamp(x, slope float64) (float64, float64) {
	switch {
	case x <= 0:
		return 0, 0
	case x >= c.cap:
		return c.cap, 0
	}
	return x, slope
}

// oneCluster returns the state of one cluster of the given standard demand linked to the
// engines at zero network latency, nothing routed yet.
func oneCluster(demand float64, curves ...linear) *State {
	s := &State{Order: [NumClasses]int{2, 1, 0}}
	s.Opt.Tolerance = 1e-9
	s.Opt.ShedPriceMs = [NumClasses]float64{1e9, 1e8, 1e7}
	n := len(curves)
	s.Start = []int{0, n}
	s.Demand, s.Classes = []float64{demand}, [][NumClasses]float64{{1: demand}}
	s.Mu, s.Shed, s.Anchor = []float64{math.NaN()}, []float64{demand}, []bool{false}
	for j, c := range curves {
		s.Eng = append(s.Eng, int32(j))
		s.Curves = append(s.Curves, c)
		s.Cap = append(s.Cap, c.cap)
		s.CapMarg = append(s.CapMarg, c.Marginal(c.cap))
	}
	s.Dist, s.Flow, s.Flow0 = make([]float64, n), make([]float64, n), make([]float64, n)
	s.Xo, s.Room, s.Thr, s.DFlow = make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	s.Load, s.Lam, s.FP = make([]float64, n), make([]float64, n), make([]float64, n)
	s.Lat, s.Bidv = make([]float64, n), make([]float64, n)
	return s
}

// TestUpdateClusterCertified checks that one cluster's equilibration is its optimum, that
// the certificate says so, and that what does not fit is shed.
func TestUpdateClusterCertified(t *testing.T) {
	for _, c := range []struct {
		name   string
		demand float64
		curves []linear
		flows  []float64
		shed   float64
	}{
		// Equal marginal costs: 10 + 2·x1 = 20 + 2·x2 with x1 + x2 = 30.
		{"interior", 30, []linear{{10, 1, 100}, {20, 1, 100}}, []float64{17.5, 12.5}, 0},
		{"one engine idle", 4, []linear{{10, 1, 100}, {20, 1, 100}}, []float64{4, 0}, 0},
		{"limit binds", 30, []linear{{10, 1, 10}, {20, 1, 100}}, []float64{10, 20}, 0},
		{"shed", 150, []linear{{10, 1, 50}, {20, 1, 60}}, []float64{50, 60}, 40},
	} {
		s := oneCluster(c.demand, c.curves...)
		s.UpdateCluster(0)
		for k, want := range c.flows {
			if math.Abs(s.Flow[k]-want) > 1e-9*c.demand {
				t.Errorf("%s: flow %d = %.12g, want %.12g", c.name, k, s.Flow[k], want)
			}
			if s.Load[k] != s.Flow[k] {
				t.Errorf("%s: load %d = %g, flow %g", c.name, k, s.Load[k], s.Flow[k])
			}
		}
		if math.Abs(s.Shed[0]-c.shed) > 1e-9*c.demand {
			t.Errorf("%s: shed %.12g, want %.12g", c.name, s.Shed[0], c.shed)
		}
		if m := s.Measure(true); !(m.RelGap <= 1e-9) {
			t.Errorf("%s: relative gap %g at the optimum", c.name, m.RelGap)
		}
	}
}
