package aggregator

import (
	"math"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/optimizer"
	"github.com/switchyard-dev/switchyard/plan"
)

// TestSignalRepeatKeepsLatency: an engine that completes nothing repeats
// its last interval's latency means (the agent and the engine simulator
// do). The repeat leaves the latency windows as they were while the load
// window goes on decaying, so the optimizer's fit, fed the aggregator's
// state, returns to the engine's idle latency instead of climbing to its
// last latency; a new latency is folded again.
func TestSignalRepeatKeepsLatency(t *testing.T) {
	const idle, capacity = 2500.0, 2.7
	for _, tc := range []struct {
		name   string
		repeat bool    // the idle engine repeats its last means, else reports fresh ones
		lo, hi float64 // the fitted base at the end
	}{
		{"repeated means: the fit returns to the idle latency", true, idle, 1.05 * idle},
		{"fresh means: fitted", false, 10000, 13000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &Aggregator{smooth: messages.DefaultSmoother(), engines: map[string]*engineEntry{}}
			start := time.Unix(1_800_000_000, 0)
			fit := optimizer.NewBaseFit(optimizer.FitOptions{})
			seq := uint64(0)
			step := func(i int, ttft, load float64) *messages.EngineState {
				seq++
				now := start.Add(time.Duration(i) * time.Second)
				a.foldSignal(&messages.EngineSignal{Model: "m", Engine: "e", Time: now.UnixMilli(), Seq: seq, TTFTMs: ttft, TBTMs: 20,
					OutputTokens: 100, LoadRPS: load, CapacityRPS: capacity, Health: 1, BaseLatencyMs: idle}, now)
				st := a.engines["m.e"].state
				st.Time = now.UnixMilli()
				fit.Add(plan.FitSample(&st), plan.FitPrior(&st, idle))
				return &st
			}
			// Loaded at 40%: latencies about 11 s, varying as measured ones do.
			ttftAt := func(i int) float64 { return 9000 + 1000*math.Sin(float64(i)) }
			for i := range 120 {
				step(i, ttftAt(i), 0.4*capacity)
			}
			last := ttftAt(120)
			before := step(120, last, 0.4*capacity).TTFTMs
			// Then the plan stops feeding it: no arrivals, no completions.
			var st *messages.EngineState
			for i := 121; i < 420; i++ {
				ttft := last
				if !tc.repeat {
					ttft += float64(i) * 1e-3
				}
				st = step(i, ttft, 0)
				if tc.repeat && st.TTFTMs != before {
					t.Fatalf("at %d s a repeated latency moved the TTFT window from %+v to %+v", i, before, st.TTFTMs)
				}
			}
			if st.LoadRPS.Slow > 0.01*capacity {
				t.Errorf("load window %+v did not decay", st.LoadRPS)
			}
			if b := fit.BaseMs(idle, idle); b < tc.lo || b > tc.hi {
				t.Errorf("fitted base %v ms, want in [%v, %v]", b, tc.lo, tc.hi)
			}
			if st = step(420, 3000, 0.1*capacity); st.TTFTMs.Fast >= before.Fast {
				t.Errorf("a new latency was not folded: TTFT window %+v", st.TTFTMs)
			}
		})
	}
}
