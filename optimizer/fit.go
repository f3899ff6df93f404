package optimizer

import (
	"math"
	"slices"
)

// Defaults of FitOptions.
const (
	// DefaultFitWindow is how many recent samples the fit's median is taken
	// over: enough that one outlier moves nothing, few enough that a real change
	// of an engine shows within a minute of one-second state updates.
	DefaultFitWindow = 32
	// DefaultFitPriorSamples is how many samples the prior is worth: it
	// dominates the first two updates and is outweighed soon after.
	DefaultFitPriorSamples = 2
	// DefaultFitAlpha is how far the fit moves towards its target per update,
	// so that the profile does not chase momentary latency.
	DefaultFitAlpha = 0.2
	// DefaultFitMaxUtilisation is the highest utilisation at which a sample is
	// taken. Below half load the queue model's (1 − load/C) correction is small
	// and robust. Nearer capacity a continuous-batching engine's latency stays
	// nearly flat until its batch fills, so dividing by (1 − load/C) would make
	// a loaded engine look cheap, draw more traffic to it, and let the fit
	// chase the load it causes; such samples are left out.
	DefaultFitMaxUtilisation = 0.5
)

// FitOptions configures a BaseFit. Zero values take the defaults above.
type FitOptions struct {
	// Window is how many recent samples the median is taken over.
	Window int
	// PriorSamples is the weight of the prior, in samples.
	PriorSamples float64
	// Alpha is how far the fit moves towards its target per sample (0..1].
	Alpha float64
	// MaxUtilisation is the highest load/capacity at which a sample is taken (0..1).
	MaxUtilisation float64
}

func (o FitOptions) withDefaults() FitOptions {
	if o.Window <= 0 {
		o.Window = DefaultFitWindow
	}
	if !(o.PriorSamples > 0) || math.IsInf(o.PriorSamples, 0) {
		o.PriorSamples = DefaultFitPriorSamples
	}
	if !(o.Alpha > 0) || o.Alpha > 1 {
		o.Alpha = DefaultFitAlpha
	}
	if !(o.MaxUtilisation > 0) || o.MaxUtilisation >= 1 {
		o.MaxUtilisation = DefaultFitMaxUtilisation
	}
	return o
}

// Sample is one observation of an engine: its latencies at a load, and the
// capacity that load is relative to.
type Sample struct {
	// TimeMs orders samples: a sample not newer than the last one folded in is
	// ignored (a restarted watcher delivers current values again). 0 means
	// unordered: every sample is taken.
	TimeMs int64
	// LoadRPS is the engine's load when the sample was taken, and CapacityRPS
	// its effective capacity then (capacity × health).
	LoadRPS, CapacityRPS float64
	// TTFTMs is the time to first token and TBTMs the time between tokens, in ms.
	TTFTMs, TBTMs float64
	// OutputTokens is the (mean) number of output tokens of the requests.
	OutputTokens float64
}

// LatencyMs returns the sample's end-to-end engine latency: TTFT + output tokens × TBT.
func (s Sample) LatencyMs() float64 { return s.TTFTMs + s.OutputTokens*s.TBTMs }

// BaseFit is the online fit of one engine's queue profile L(x) = base/(1 − x/C),
// the one the optimizer service plans with and the simulator runs. Each sample
// at load x of capacity C implies base = latency·(1 − x/C); the fit's target is
// the median of the last Window samples (robust to outliers), pulled towards a
// prior as if the prior were PriorSamples extra samples, and the fit moves
// Alpha of the way to its target per sample. It also smooths the share of TTFT
// in the latency, for the TTFT profile. Fitting is deterministic. The zero
// value is ready to use with the default options.
type BaseFit struct {
	opts     FitOptions
	ready    bool
	samples  []float64 // ring of the last Window implied bases, ms
	next     int
	lastTime int64
	lastLat  float64 // the latency of the last valid sample, ms
	lastLoad float64 // and its load, req/s
	// unmeasured counts the samples since the latency last moved (see Add).
	unmeasured int
	base       float64 // fitted base, ms; 0 until the first sample
	ttftShare  float64 // smoothed TTFT / latency
}

// NewBaseFit returns an empty fit with the given options.
func NewBaseFit(o FitOptions) *BaseFit {
	return &BaseFit{opts: o.withDefaults(), ready: true}
}

// Add folds one sample into the fit and reports whether it was taken. prior
// is the base latency assumed before any sample (the engine's own idle-latency
// estimate when it reports one). Samples that are not newer than the last, or
// without a positive finite latency and capacity, or above MaxUtilisation,
// are skipped. A sample whose latency equals the previous valid sample's
// at another load (no request completed since) is skipped, or taken as the
// prior once a whole Window of samples has passed without a measurement.
func (f *BaseFit) Add(s Sample, prior float64) bool {
	if !f.ready {
		f.opts, f.ready = f.opts.withDefaults(), true
	}
	if s.TimeMs != 0 {
		if s.TimeMs <= f.lastTime {
			return false
		}
		f.lastTime = s.TimeMs
	}
	lat := s.LatencyMs()
	if !(lat > 0) || math.IsInf(lat, 0) || !(s.CapacityRPS > 0) || math.IsInf(s.CapacityRPS, 0) || !(s.LoadRPS >= 0) {
		return false
	}
	// A latency equal to the last sample's while the load moved is no
	// measurement: an engine's latency windows move only when requests
	// complete, while its load window decays, so an engine the plan stopped
	// feeding would read its last latency at ever lower loads and its fit
	// would climb to that latency, keeping it out of the plan. Such a
	// sample is skipped; once the fit has gone a whole window of samples
	// without a measurement, each further one counts as the prior, so that
	// the fit of an engine nothing measures returns to what the engine
	// states and the plan gives it traffic that measures it. (A steady
	// state, the same latency at the same load, is a measurement; an
	// engine idle for a few signals between requests keeps its fit.)
	stale := lat == f.lastLat && s.LoadRPS != f.lastLoad
	f.lastLat, f.lastLoad = lat, s.LoadRPS
	if stale {
		f.unmeasured++
	} else {
		f.unmeasured = 0
	}
	u := s.LoadRPS / s.CapacityRPS
	if u > f.opts.MaxUtilisation {
		return false
	}
	b := lat * (1 - u)
	if stale {
		if f.unmeasured <= f.opts.Window {
			return false
		}
		b = prior
	}
	if len(f.samples) < f.opts.Window {
		f.samples = append(f.samples, b)
	} else {
		f.samples[f.next] = b
		f.next = (f.next + 1) % f.opts.Window
	}
	if share := s.TTFTMs / lat; f.ttftShare == 0 {
		f.ttftShare = share
	} else {
		f.ttftShare += f.opts.Alpha * (share - f.ttftShare)
	}
	n := float64(len(f.samples))
	target := (f.opts.PriorSamples*prior + n*Median(f.samples)) / (f.opts.PriorSamples + n)
	if f.base == 0 {
		f.base = target
	} else {
		f.base += f.opts.Alpha * (target - f.base)
	}
	return true
}

// Samples returns how many samples the fit's window holds.
func (f *BaseFit) Samples() int {
	if f == nil {
		return 0
	}
	return len(f.samples)
}

// BaseMs returns the fitted base latency, or prior when there is no sample
// yet, and never less than floor, the engine's own estimate of its idle
// latency (0 when it reports none). A nil fit has no sample.
//
// An engine does not serve requests faster than it serves one alone, so a fit
// below its own idle latency is the fit's error, not news: the queue model's
// (1 − load/C) correction overshoots for a continuous-batching engine, whose
// latency grows far more slowly with load (at 40% load about 1.2× its idle
// latency where the queue model expects 1.67×, so the sample reads 0.73× the
// idle latency), and how far it overshoots depends on the loads at which an
// engine happened to be sampled: engines sampled at higher loads would look
// cheaper and be planned fuller. The fit still raises the base above the
// floor for an engine slower than it reports.
func (f *BaseFit) BaseMs(prior, floor float64) float64 {
	b := prior
	if f != nil && f.base > 0 {
		b = f.base
	}
	return math.Max(b, floor)
}

// TTFTMs returns the fitted TTFT at utilisation u (capped at 0.9), or 0 when
// there is no fit yet.
func (f *BaseFit) TTFTMs(u float64) float64 {
	if f == nil || !(f.base > 0) || !(f.ttftShare > 0) {
		return 0
	}
	u = math.Min(math.Max(u, 0), 0.9)
	return f.base * f.ttftShare / (1 - u)
}

// Median returns the median of xs (which it does not modify); 0 for none.
func Median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
