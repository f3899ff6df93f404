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

func TestFitter(t *testing.T) {
	const capacity = 100
	truth := QueueProfile{BaseMs: 300}.Curve(capacity, 1)
	var samples []Sample
	for k := 0; k < 200; k++ {
		x := float64(k % 90)
		l := truth.Latency(x) * (1 + 0.05*math.Sin(float64(k)))
		if k%17 == 0 {
			l *= 10 // outlier
		}
		samples = append(samples, Sample{LoadRPS: x, TTFTMs: l / 2, TBTMs: l / 2 / 100, OutputTokens: 100})
	}
	var f Fitter
	got, n := f.Fit(capacity, samples, nil)
	if n == 0 || math.Abs(got.BaseMs-300)/300 > 0.05 {
		t.Errorf("fit %g from %d samples, want about 300", got.BaseMs, n)
	}
	again, _ := f.Fit(capacity, samples, nil)
	if again != got {
		t.Errorf("fit not deterministic: %v vs %v", again, got)
	}
	// Few samples: close to the prior.
	few, _ := f.Fit(capacity, samples[1:2], nil)
	if math.Abs(few.BaseMs-400) > 15 {
		t.Errorf("fit from one sample %g, want near the prior 400", few.BaseMs)
	}
	// Slow refit: a sudden change moves the profile only part of the way.
	prev := QueueProfile{BaseMs: 300}
	var spike []Sample
	for k := 0; k < 100; k++ {
		spike = append(spike, Sample{LoadRPS: 10, TTFTMs: 3000})
	}
	next, _ := f.Fit(capacity, spike, &prev)
	if next.BaseMs <= 300 || next.BaseMs > 300+0.25*(2700-300) {
		t.Errorf("refit after spike %g, want a small step up from 300", next.BaseMs)
	}
	// Invalid samples are ignored.
	if _, n := f.Fit(capacity, []Sample{{LoadRPS: math.NaN(), TTFTMs: 1}, {LoadRPS: -1, TTFTMs: 1}, {LoadRPS: 99, TTFTMs: 1}}, nil); n != 0 {
		t.Errorf("used %d invalid samples", n)
	}
}
