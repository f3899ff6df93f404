package messages

import (
	"math"
	"testing"
)

func TestSmootherUpdate(t *testing.T) {
	const eps = 1e-12
	for _, tc := range []struct {
		name string
		s    Smoother
		// start is the window before the sample (ignored when first).
		start     Window
		v, dt     float64
		first     bool
		want      Window
		tolerance float64
	}{
		{name: "first sample sets both", s: DefaultSmoother(), start: Window{Fast: 7, Slow: 9}, v: 3, dt: 0.25, first: true, want: Window{Fast: 3, Slow: 3}},
		{name: "one half-life moves half way", s: Smoother{Fast: 1, Slow: 30}, v: 100, dt: 1,
			want: Window{Fast: 50, Slow: 100 * (1 - math.Exp2(-1.0/30))}, tolerance: eps},
		{name: "slow half-life", s: Smoother{Fast: 1, Slow: 30}, start: Window{Fast: 10, Slow: 10}, v: 20, dt: 30,
			want: Window{Fast: 20 - 10*math.Exp2(-30), Slow: 15}, tolerance: eps},
		{name: "no half-life takes the sample", s: Smoother{}, start: Window{Fast: 1, Slow: 1}, v: 5, dt: 1, want: Window{Fast: 5, Slow: 5}},
		{name: "same timestamp counts a little", s: Smoother{Fast: 1, Slow: 1}, v: 1000, dt: 0,
			want: Window{Fast: 1000 * (1 - math.Exp2(-1e-3)), Slow: 1000 * (1 - math.Exp2(-1e-3))}, tolerance: 1e-9},
		{name: "long silence forgets", s: Smoother{Fast: 1, Slow: 30}, start: Window{Fast: 1, Slow: 1}, v: 2, dt: 3000,
			want: Window{Fast: 2, Slow: 2}, tolerance: eps},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := tc.start
			tc.s.Update(&w, tc.v, tc.dt, tc.first)
			if math.Abs(w.Fast-tc.want.Fast) > tc.tolerance || math.Abs(w.Slow-tc.want.Slow) > tc.tolerance {
				t.Errorf("Update(%+v, v=%g, dt=%g, first=%v) = %+v, want %+v", tc.start, tc.v, tc.dt, tc.first, w, tc.want)
			}
		})
	}
}

// The half-life is in wall time: a constant input folded in at irregular
// intervals ends where the same input folded at once over the whole span
// does, however the span is cut.
func TestSmootherIrregularIntervals(t *testing.T) {
	s := Smoother{Fast: 1, Slow: 30}
	for _, tc := range []struct {
		name string
		dts  []float64
	}{
		{"one step", []float64{2}},
		{"even", []float64{0.5, 0.5, 0.5, 0.5}},
		{"irregular", []float64{0.1, 1.2, 0.05, 0.65}},
		{"one long gap", []float64{0.01, 0.01, 1.98}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := Window{Fast: 10, Slow: 10}
			total := 0.0
			for _, dt := range tc.dts {
				s.Update(&w, 50, dt, false)
				total += dt
			}
			want := Window{Fast: 50 - 40*Retained(total, s.Fast), Slow: 50 - 40*Retained(total, s.Slow)}
			if math.Abs(w.Fast-want.Fast) > 1e-9 || math.Abs(w.Slow-want.Slow) > 1e-9 {
				t.Errorf("after %v: %+v, want %+v", tc.dts, w, want)
			}
		})
	}
}

func TestRetained(t *testing.T) {
	for _, tc := range []struct{ dt, h, want float64 }{
		{0, 1, 1}, {1, 1, 0.5}, {2, 1, 0.25}, {30, 30, 0.5}, {1, 0, 0}, {1, -1, 0},
	} {
		if got := Retained(tc.dt, tc.h); math.Abs(got-tc.want) > 1e-15 {
			t.Errorf("Retained(%g, %g) = %g, want %g", tc.dt, tc.h, got, tc.want)
		}
	}
}

// BenchmarkSmootherUpdate is the cost of folding one sample into a fast and a slow window.
func BenchmarkSmootherUpdate(b *testing.B) {
	s := DefaultSmoother()
	var w Window
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		s.Update(&w, float64(i%100), 0.2, false)
	}
	if !(w.Fast >= 0 && w.Fast < 100) {
		b.Fatalf("window %+v left the range of its samples", w)
	}
}
