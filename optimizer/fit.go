package optimizer

import (
	"math"
	"sort"
)

// Sample is one observation of an engine: its load and the latencies seen at that load.
type Sample struct {
	// LoadRPS is the engine's load when the sample was taken.
	LoadRPS float64
	// TTFTMs is the time to first token and TBTMs the time between tokens, in ms.
	TTFTMs, TBTMs float64
	// OutputTokens is the (mean) number of output tokens of the requests.
	OutputTokens float64
}

// LatencyMs returns the sample's end-to-end engine latency: TTFT + output tokens × TBT.
func (s Sample) LatencyMs() float64 { return s.TTFTMs + s.OutputTokens*s.TBTMs }

// Fitter fits a queue profile per engine from samples. Each sample at load x on an engine of
// capacity C implies a base latency latency·(1 - x/C); the fit is the median of these (robust to
// outliers), shrunk towards a prior when there are few samples, and blended slowly with the
// previous fit so that the profile does not chase momentary latency. Fitting is deterministic.
type Fitter struct {
	// PriorBaseMs is the base latency assumed for an engine without samples; 0 means 400.
	PriorBaseMs float64
	// PriorWeight is how many samples the prior is worth; 0 means 8.
	PriorWeight float64
	// Smoothing is the weight of a new fit against the previous one (0..1]; 0 means 0.2.
	Smoothing float64
	// MaxUtilisation ignores samples taken above this utilisation, where x/C is too close to 1
	// for the implied base to be reliable; 0 means 0.95.
	MaxUtilisation float64
}

func (f Fitter) withDefaults() Fitter {
	if !(f.PriorBaseMs > 0) || math.IsInf(f.PriorBaseMs, 0) {
		f.PriorBaseMs = 400
	}
	if !(f.PriorWeight > 0) || math.IsInf(f.PriorWeight, 0) {
		f.PriorWeight = 8
	}
	if !(f.Smoothing > 0) || f.Smoothing > 1 {
		f.Smoothing = 0.2
	}
	if !(f.MaxUtilisation > 0) || f.MaxUtilisation >= 1 {
		f.MaxUtilisation = 0.95
	}
	return f
}

// Fit returns the queue profile of an engine of effective capacity capacityRPS given its
// samples and its previous profile (nil for the first fit, which is not smoothed). Invalid
// samples (NaN, infinite, negative, at or beyond the utilisation limit) are ignored; it also
// returns how many samples were used.
func (f Fitter) Fit(capacityRPS float64, samples []Sample, prev *QueueProfile) (QueueProfile, int) {
	f = f.withDefaults()
	implied := make([]float64, 0, len(samples))
	for _, s := range samples {
		l := s.LatencyMs()
		if numberErr(s.LoadRPS) != nil || numberErr(l) != nil || !(l > 0) || !(capacityRPS > 0) {
			continue
		}
		u := s.LoadRPS / capacityRPS
		if u > f.MaxUtilisation {
			continue
		}
		implied = append(implied, l*(1-u))
	}
	prior := f.PriorBaseMs
	if prev != nil && prev.BaseMs > 0 {
		prior = prev.BaseMs
	}
	est := prior
	if n := float64(len(implied)); n > 0 {
		sort.Float64s(implied)
		var med float64
		if m := len(implied); m%2 == 1 {
			med = implied[m/2]
		} else {
			med = 0.5 * (implied[m/2-1] + implied[m/2])
		}
		est = (f.PriorWeight*f.PriorBaseMs + n*med) / (f.PriorWeight + n)
	}
	if prev != nil && prev.BaseMs > 0 {
		est = prev.BaseMs + f.Smoothing*(est-prev.BaseMs)
	}
	return QueueProfile{BaseMs: est}, len(implied)
}
