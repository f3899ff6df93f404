package optimizersvc

import (
	"math"
	"slices"

	"github.com/switchyard-dev/switchyard/messages"
)

// maxUtilSample is the highest utilisation at which a state update still
// yields a sample. Below half load the queue model's (1 − load/C) correction
// is small and robust. Nearer capacity a continuous-batching engine's latency
// stays nearly flat until its batch fills, so dividing by (1 − load/C) would
// make a loaded engine look cheap, draw more traffic to it, and let the fit
// chase the load it causes; such states are left out.
const maxUtilSample = 0.5

// fit is the queue-profile fit of one engine (see the package comment).
type fit struct {
	samples  []float64 // ring of the last FitWindow base-latency samples, ms
	next     int
	lastTime int64   // Time of the newest state folded in, Unix ms
	base     float64 // fitted base_ms; 0 until the first sample
	// ttftShare is the smoothed share of TTFT in the sampled latency, so
	// that base × ttftShare is the fitted TTFT profile's base.
	ttftShare float64
}

// sample returns the base latency implied by one engine state's slow windows,
// and whether the state yields one.
func sample(st *messages.EngineState) (float64, bool) {
	lat := st.TTFTMs.Slow + st.OutputTokens.Slow*st.TBTMs.Slow
	capacity := st.CapacityRPS * st.Health
	if !(lat > 0) || !(capacity > 0) || math.IsInf(lat, 0) {
		return 0, false
	}
	u := st.LoadRPS.Slow / capacity
	if u > maxUtilSample {
		return 0, false
	}
	return lat * (1 - u), true
}

// add folds one engine state into the fit; prior is the prior base latency,
// replaced by the engine's own idle-latency estimate when it reports one.
func (f *fit) add(st *messages.EngineState, prior float64) {
	if st.BaseLatencyMs > 0 {
		prior = st.BaseLatencyMs
	}
	if st.Time <= f.lastTime {
		return // seen already (a restarted watcher delivers current values again)
	}
	f.lastTime = st.Time
	b, ok := sample(st)
	if !ok {
		return
	}
	if len(f.samples) < FitWindow {
		f.samples = append(f.samples, b)
	} else {
		f.samples[f.next] = b
		f.next = (f.next + 1) % FitWindow
	}
	if lat := st.TTFTMs.Slow + st.OutputTokens.Slow*st.TBTMs.Slow; lat > 0 {
		share := st.TTFTMs.Slow / lat
		if f.ttftShare == 0 {
			f.ttftShare = share
		} else {
			f.ttftShare += FitAlpha * (share - f.ttftShare)
		}
	}
	n := float64(len(f.samples))
	target := (PriorSamples*prior + n*median(f.samples)) / (PriorSamples + n)
	if f.base == 0 {
		f.base = target
	} else {
		f.base += FitAlpha * (target - f.base)
	}
}

// baseMs returns the fitted base latency, or prior when there is no sample
// yet, and never less than floor, the engine's own estimate of its idle
// latency (0 when it reports none).
//
// An engine does not serve requests faster than it serves one alone, so a fit
// below its own idle latency is the fit's error, not news: the queue model's
// (1 − load/C) correction overshoots for a continuous-batching engine, whose
// latency grows far more slowly with load (at 40% load about 1.2× its idle
// latency where the queue model expects 1.67×, so the sample reads 0.73× the
// idle latency), and how far it overshoots depends on the loads at which an
// engine happened to be sampled. Engines sampled at higher loads looked
// cheaper and were planned fuller: on the simulator's Azure trace at 85%
// load the A100s, fitted at 0.25–0.7× their idle latency while the H100s
// kept theirs, were planned to 0.86–0.89 of capacity against the H100s'
// 0.84, and their slower tokens lengthened the end-to-end p99.
// The fit still raises the base above the floor for an engine slower than
// it reports.
func (f *fit) baseMs(prior, floor float64) float64 {
	b := prior
	if f != nil && f.base > 0 {
		b = f.base
	}
	return math.Max(b, floor)
}

// ttftMs returns the fitted TTFT at utilisation u (capped at 0.9), or 0
// when there is no fit yet.
func (f *fit) ttftMs(u float64) float64 {
	if f == nil || !(f.base > 0) || !(f.ttftShare > 0) {
		return 0
	}
	u = math.Min(math.Max(u, 0), 0.9)
	return f.base * f.ttftShare / (1 - u)
}

// median returns the median of xs (which it does not modify).
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
