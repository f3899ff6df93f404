package optimizer

import (
	"math"
	"testing"
)

// sample is a fit sample of latency ttft + otok×tbt at load of capacity.
func sample(ttft, tbt, otok, load, capacity float64, at int64) Sample {
	return Sample{TimeMs: at, TTFTMs: ttft, TBTMs: tbt, OutputTokens: otok, LoadRPS: load, CapacityRPS: capacity}
}

func TestBaseFit(t *testing.T) {
	var f BaseFit
	if got := f.BaseMs(500, 0); got != 500 {
		t.Errorf("no samples: %v, want the prior 500", got)
	}
	// 800 ms at half load: base 400.
	for i := range 100 {
		f.Add(sample(300, 5, 100, 50, 100, int64(1000+i)), 500)
	}
	if got := f.BaseMs(500, 0); math.Abs(got-(2*500+32*400)/34.0) > 1 {
		t.Errorf("after 100 samples of base 400: %v", got)
	}
	if f.Samples() != DefaultFitWindow {
		t.Errorf("window holds %d samples, want %d", f.Samples(), DefaultFitWindow)
	}
	before := f.BaseMs(500, 0)
	// One outlier barely moves the fit (median), a repeated time is ignored.
	if !f.Add(sample(30000, 5, 100, 50, 100, 2000), 500) || f.Add(sample(30000, 5, 100, 50, 100, 2000), 500) {
		t.Errorf("the first outlier must be taken, its repeat ignored")
	}
	if got := f.BaseMs(500, 0); math.Abs(got-before) > 1 {
		t.Errorf("one outlier moved the fit from %v to %v", before, got)
	}
	// Samples near saturation, without latency or capacity, or not finite, are skipped.
	for i, s := range []Sample{
		sample(300, 5, 100, 99, 100, 3000),
		sample(0, 0, 0, 10, 100, 3001),
		sample(300, 5, 100, 10, 0, 3002),
		sample(math.Inf(1), 5, 100, 10, 100, 3003),
		sample(math.NaN(), 5, 100, 10, 100, 3004),
		sample(300, 5, 100, math.NaN(), 100, 3005),
	} {
		if f.Add(s, 500) {
			t.Errorf("unusable sample %d (%+v) was taken", i, s)
		}
	}
	// Unordered samples (time 0) are all taken; the fit is deterministic.
	var a, b BaseFit
	for i := range 50 {
		l := 300 + 50*math.Sin(float64(i))
		a.Add(sample(l, 5, 100, 20, 100, 0), 400)
		b.Add(sample(l, 5, 100, 20, 100, 0), 400)
	}
	if a.Samples() != DefaultFitWindow || a.BaseMs(0, 0) != b.BaseMs(0, 0) {
		t.Errorf("unordered samples: %d taken, fits %v vs %v", a.Samples(), a.BaseMs(0, 0), b.BaseMs(0, 0))
	}
	// TTFT profile: the smoothed TTFT share of the base, rising with utilisation.
	f = BaseFit{}
	for i := range 100 {
		f.Add(sample(300, 5, 100, 50, 100, int64(1000+i)), 500)
	}
	if got, want := f.TTFTMs(0), f.BaseMs(0, 0)*300/800; math.Abs(got-want)/want > 1e-9 {
		t.Errorf("TTFT at idle %v, want about %v", got, want)
	}
	if f.TTFTMs(0.5) <= f.TTFTMs(0) || f.TTFTMs(5) != f.TTFTMs(0.9) {
		t.Errorf("TTFT profile not rising or not capped: %v %v %v", f.TTFTMs(0), f.TTFTMs(0.5), f.TTFTMs(5))
	}
	var none *BaseFit
	if none.TTFTMs(0.5) != 0 || none.BaseMs(7, 0) != 7 || none.Samples() != 0 {
		t.Errorf("a nil fit must read as no samples")
	}
}

// TestBaseFitOptions: the options set the window, the prior's weight, the
// step and the utilisation limit.
func TestBaseFitOptions(t *testing.T) {
	f := NewBaseFit(FitOptions{Window: 4, PriorSamples: 4, Alpha: 1, MaxUtilisation: 0.9})
	for i := range 10 {
		f.Add(sample(400, 0, 0, 80, 100, int64(i+1)), 1000) // base 80 at 80% load, taken below 0.9
	}
	if f.Samples() != 4 {
		t.Errorf("window %d, want 4", f.Samples())
	}
	// Alpha 1: the fit is its target, (4×1000 + 4×80)/8.
	if got := f.BaseMs(0, 0); math.Abs(got-540) > 1e-9 {
		t.Errorf("fit %v, want 540", got)
	}
}

// TestBaseFitFloor: the fit never plans an engine below its own idle-latency
// estimate, however low the samples read, and still raises it above.
func TestBaseFitFloor(t *testing.T) {
	var f BaseFit
	if got := f.BaseMs(500, 600); got != 600 {
		t.Errorf("no samples, prior 500, floor 600: %v, want 600", got)
	}
	// 400 ms at 20% load: base 320, below the engine's idle latency 500.
	for i := range 100 {
		f.Add(sample(300, 1, 100, 20, 100, int64(1000+i)), 500)
	}
	if f.base >= 500 {
		t.Fatalf("fitted base %v, want it below 500 for this test", f.base)
	}
	if got := f.BaseMs(500, 500); got != 500 {
		t.Errorf("fitted %v, floor 500: %v, want 500", f.base, got)
	}
	if got := f.BaseMs(500, 0); got != f.base {
		t.Errorf("no floor: %v, want the fit %v", got, f.base)
	}
	// 1500 ms at 20% load: base 1200, above the floor, is kept.
	for i := range 200 {
		f.Add(sample(300, 12, 100, 20, 100, int64(2000+i)), 500)
	}
	if got := f.BaseMs(500, 500); got < 1000 {
		t.Errorf("a slow engine's fit %v is not raised above the floor: %v", f.base, got)
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}} {
		in := append([]float64(nil), c.in...)
		if got := Median(in); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
		for i := range in {
			if in[i] != c.in[i] {
				t.Errorf("Median modified its input")
			}
		}
	}
}

// TestBaseFitStaleLatency: an engine the plan stopped feeding completes
// nothing, so its latency windows keep their last value while its load
// window decays. Those samples are no measurement: its fit returns to the
// prior instead of climbing to the last latency (which would keep it out of
// the plan), but only after a whole window of them; fresh latencies at the
// same loads are fitted as before.
func TestBaseFitStaleLatency(t *testing.T) {
	const prior, capacity, last = 2500.0, 2.7, 13000.0
	steady := (2*prior + 32*0.6*last) / 34 // the fit of 13 s latencies at 40% load
	for _, tc := range []struct {
		name   string
		idle   int     // samples of the decay
		jitter float64 // added to the latency per sample: 0 repeats it
		lo, hi float64 // the fitted base after the decay
	}{
		{"frozen latency, decaying load: back to the prior", 300, 0, prior, 1.05 * prior},
		{"fresh latency, decaying load: fitted", 300, 1e-3, 0.9 * last, last},
		{"frozen for less than a window: the fit is kept", DefaultFitWindow, 0, steady - 1, steady + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f BaseFit
			// Measured at 40% load: base 7800.
			for i := range 64 {
				f.Add(sample(last, 0, 0, 0.4*capacity, capacity, int64(1000+i)), prior)
			}
			if b := f.BaseMs(prior, prior); math.Abs(b-steady) > 1 {
				t.Fatalf("steady samples at 40%% load: base %v, want them fitted", b)
			}
			load := 0.4 * capacity
			for i := range tc.idle {
				load *= math.Pow(0.5, 1.0/30) // the slow window's 30 s half-life
				f.Add(sample(last+tc.jitter*float64(i+1), 0, 0, load, capacity, int64(2000+i)), prior)
			}
			if b := f.BaseMs(prior, prior); b < tc.lo || b > tc.hi {
				t.Errorf("base %v after the load decayed, want in [%v, %v]", b, tc.lo, tc.hi)
			}
		})
	}
}
