package optimizer

import (
	"math"
	"testing"
)

func TestPointsProfileRepair(t *testing.T) {
	tests := []struct {
		name    string
		in      [][2]float64
		want    [][2]float64
		changed bool
	}{
		{"already convex", [][2]float64{{0, 400}, {50, 450}, {90, 900}}, [][2]float64{{0, 400}, {50, 450}, {90, 900}}, false},
		{"unsorted", [][2]float64{{90, 900}, {0, 400}, {50, 450}}, [][2]float64{{0, 400}, {50, 450}, {90, 900}}, true},
		{"decreasing", [][2]float64{{0, 500}, {50, 400}, {90, 900}}, [][2]float64{{0, 500}, {50, 500}, {90, 900}}, true},
		{"concave", [][2]float64{{0, 400}, {50, 800}, {100, 900}}, [][2]float64{{0, 400}, {100, 900}}, true},
		{"starts late", [][2]float64{{10, 400}, {20, 500}}, [][2]float64{{0, 400}, {10, 400}, {20, 500}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPointsProfile(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Points) != len(tc.want) {
				t.Fatalf("points %v, want %v", p.Points, tc.want)
			}
			for k := range p.Points {
				if p.Points[k] != tc.want[k] {
					t.Errorf("points %v, want %v", p.Points, tc.want)
				}
			}
			if (len(p.Notes) > 0) != tc.changed {
				t.Errorf("notes %q, changed %v", p.Notes, tc.changed)
			}
			if err := p.Validate(); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestCurvesInverse(t *testing.T) {
	pp, _ := NewPointsProfile([][2]float64{{0, 400}, {50, 450}, {90, 900}})
	for _, c := range []Curve{QueueProfile{BaseMs: 400}.Curve(100, 0.8), pp.Curve(100, 0.5)} {
		for _, x := range []float64{0.5, 10, 30, 44, 70} {
			if x >= c.Capacity() {
				continue
			}
			if got, _ := c.InverseMarginal(c.Marginal(x)); math.Abs(got-x) > 1e-6*math.Max(1, x) && c.Marginal(got) != c.Marginal(x) {
				t.Errorf("%T: InverseMarginal(Marginal(%g)) = %g", c, x, got)
			}
			if got, _ := c.InverseLatency(c.Latency(x)); math.Abs(got-x) > 1e-6*math.Max(1, x) && c.Latency(got) != c.Latency(x) {
				t.Errorf("%T: InverseLatency(Latency(%g)) = %g", c, x, got)
			}
		}
		if x, _ := c.InverseMarginal(1e300); x != c.Capacity() {
			t.Errorf("%T: InverseMarginal(huge) = %g, want capacity %g", c, x, c.Capacity())
		}
	}
	q := QueueProfile{BaseMs: 400}.Curve(100, 1)
	if q.Capacity() >= 100 || !math.IsInf(q.Latency(100), 1) {
		t.Errorf("queue capacity %g, latency at capacity %g", q.Capacity(), q.Latency(100))
	}
}
