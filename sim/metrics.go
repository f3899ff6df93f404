package sim

import (
	"math"
	"slices"
)

// metrics collects one run's measurements.
type metrics struct {
	f                 *fleet
	ttft, tbt, e2e    []float32
	arrivedN, shedN   int64
	failedN, served   int64
	good, cross       int64
	promptTok, hitTok int64
	samples           []Sample
	lastSample        float64
	reversalsWeights  int64
	weightUpdates     int64
	remappedSum       float64
	targetUtilSum     []float64
	targetUtilN       int64
}

func newMetrics(f *fleet) *metrics {
	return &metrics{f: f, targetUtilSum: make([]float64, len(f.engines))}
}

func (m *metrics) counts(r *run, q int32) bool {
	t := r.arrivals[q].AtMs
	return t >= m.f.measureFrom && t < m.f.measureTo
}

func (m *metrics) arrived(r *run, q int32) {
	if m.counts(r, q) {
		m.arrivedN++
	}
}

func (m *metrics) shed(r *run, q int32) {
	if m.counts(r, q) {
		m.shedN++
	}
}

func (m *metrics) fail(r *run, q int32) {
	if m.counts(r, q) {
		m.failedN++
	}
}

// done records a finished request; tbt is its mean time between tokens.
func (m *metrics) done(r *run, q int32, tbt float64) {
	if !m.counts(r, q) {
		return
	}
	a := &r.arrivals[q]
	rq := &r.reqs[q]
	c, j := int(a.Cluster), int(rq.engine)
	d := m.f.oneWay[c][j]
	ttft := rq.first + d - a.AtMs
	e2e := r.now + d - a.AtMs
	m.ttft = append(m.ttft, float32(ttft))
	m.e2e = append(m.e2e, float32(e2e))
	if a.Output > 1 {
		m.tbt = append(m.tbt, float32(tbt))
	}
	m.served++
	if ttft <= m.f.sc.SLO.TTFTMs && tbt <= m.f.sc.SLO.TBTMs {
		m.good++
	}
	if m.f.clusters[c].region != m.f.engines[j].region {
		m.cross++
	}
	m.promptTok += int64(a.Prompt)
	m.hitTok += int64(rq.hitTok)
}

// Sample is one window of the time series: each engine's share of the
// requests dispatched in the window and its utilisation (requests dispatched
// per second over its effective capacity).
type Sample struct {
	// TimeS is the window's end, seconds.
	TimeS float64 `json:"time_s"`
	// Share and Utilisation are indexed like Result.Engines.
	Share       []float64 `json:"share"`
	Utilisation []float64 `json:"utilisation"`
	// Dispatched is the number of requests dispatched in the window.
	Dispatched int64 `json:"dispatched"`
}

func (m *metrics) sample(r *run) {
	width := (r.now - m.lastSample) / 1000
	if width <= 0 {
		return
	}
	s := Sample{TimeS: r.now / 1000, Share: make([]float64, len(r.engines)), Utilisation: make([]float64, len(r.engines))}
	var total int64
	for j := range r.engines {
		total += r.engines[j].window
	}
	s.Dispatched = total
	for j := range r.engines {
		e := &r.engines[j]
		if total > 0 {
			s.Share[j] = float64(e.window) / float64(total)
		}
		if c := e.d.capacity * e.speed; c > 0 && e.up {
			s.Utilisation[j] = float64(e.window) / width / c
		}
		e.window = 0
	}
	m.lastSample = r.now
	m.samples = append(m.samples, s)
}

// Result is what one policy achieved on a scenario.
type Result struct {
	// Policy is the policy's name.
	Policy string `json:"policy"`
	// Requests counts the measured arrivals (after the warm-up).
	Requests int64 `json:"requests"`
	// TTFT and TBT percentiles and end-to-end statistics, ms, over served requests.
	TTFTP50Ms float64 `json:"ttft_p50_ms"`
	TTFTP90Ms float64 `json:"ttft_p90_ms"`
	TTFTP99Ms float64 `json:"ttft_p99_ms"`
	TBTP50Ms  float64 `json:"tbt_p50_ms"`
	TBTP99Ms  float64 `json:"tbt_p99_ms"`
	E2EMeanMs float64 `json:"e2e_mean_ms"`
	E2EP99Ms  float64 `json:"e2e_p99_ms"`
	// Goodput is the share of measured arrivals served within the SLO.
	Goodput float64 `json:"goodput"`
	// KVHitRate is cached prompt tokens over prompt tokens of served requests.
	KVHitRate float64 `json:"kv_hit_rate"`
	// ShedFraction and FailedFraction are shares of measured arrivals shed by
	// the policy, or lost to failures (or unfinished at the end).
	ShedFraction   float64 `json:"shed_fraction"`
	FailedFraction float64 `json:"failed_fraction"`
	// CrossRegionShare is the share of served requests served outside their cluster's region.
	CrossRegionShare float64 `json:"cross_region_share"`
	// PeakUtilisation is the largest mean utilisation of an engine over the
	// measured period (requests dispatched per second over nominal capacity).
	PeakUtilisation float64 `json:"peak_utilisation"`
	// PeakWindowUtilisation is the largest utilisation of an engine in one sample window.
	PeakWindowUtilisation float64 `json:"peak_window_utilisation"`
	// TrafficShareStddev is the standard deviation over measured windows of
	// each engine's traffic share, averaged over engines.
	TrafficShareStddev float64 `json:"traffic_share_stddev"`
	// TrafficShareExcessStddev is the same with the sampling noise of a
	// window's binomial count removed (√max(0, variance − p(1−p)/n)): the
	// variation that routing, not chance, causes.
	TrafficShareExcessStddev float64 `json:"traffic_share_excess_stddev"`
	// ShareReversals counts direction changes of engines' traffic shares
	// between windows by more than 0.01 (with hysteresis).
	ShareReversals int64 `json:"share_reversals"`
	// WeightReversals counts sign changes of per-(cluster, engine) weight
	// moves larger than 0.001 between updates (weighted policies only).
	WeightReversals int64 `json:"weight_reversals"`
	// WeightUpdates counts installed weight tables; KeysRemappedPerUpdate is
	// the mean share of keys whose primary engine changed per update.
	WeightUpdates         int64   `json:"weight_updates"`
	KeysRemappedPerUpdate float64 `json:"keys_remapped_per_update"`
	// TargetPeakUtilisation is, for switchyard, the largest mean utilisation
	// the optimizer planned for an engine over the measured period.
	TargetPeakUtilisation float64 `json:"target_peak_utilisation,omitempty"`
	// Samples is the time series of traffic shares and utilisation.
	Samples []Sample `json:"-"`
	// TTFTSorted and E2ESorted are the sorted latencies, ms, for CDF plots.
	TTFTSorted []float32 `json:"-"`
	E2ESorted  []float32 `json:"-"`
}

func quantile(s []float32, q float64) float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	k := int(math.Ceil(q*float64(len(s)))) - 1
	k = max(0, min(k, len(s)-1))
	return float64(s[k])
}

func (m *metrics) result(r *run, name string) Result {
	res := Result{Policy: name, Requests: m.arrivedN}
	slices.Sort(m.ttft)
	slices.Sort(m.tbt)
	slices.Sort(m.e2e)
	res.TTFTP50Ms, res.TTFTP90Ms, res.TTFTP99Ms = quantile(m.ttft, .5), quantile(m.ttft, .9), quantile(m.ttft, .99)
	res.TBTP50Ms, res.TBTP99Ms = quantile(m.tbt, .5), quantile(m.tbt, .99)
	res.E2EP99Ms = quantile(m.e2e, .99)
	var sum float64
	for _, v := range m.e2e {
		sum += float64(v)
	}
	if len(m.e2e) > 0 {
		res.E2EMeanMs = sum / float64(len(m.e2e))
	} else {
		res.E2EMeanMs = math.NaN()
	}
	if m.arrivedN > 0 {
		res.Goodput = float64(m.good) / float64(m.arrivedN)
		res.ShedFraction = float64(m.shedN) / float64(m.arrivedN)
		res.FailedFraction = float64(m.failedN) / float64(m.arrivedN)
	}
	if m.promptTok > 0 {
		res.KVHitRate = float64(m.hitTok) / float64(m.promptTok)
	}
	if m.served > 0 {
		res.CrossRegionShare = float64(m.cross) / float64(m.served)
	}
	span := (m.f.measureTo - m.f.measureFrom) / 1000
	for j := range r.engines {
		if c := r.engines[j].d.capacity; c > 0 && span > 0 {
			res.PeakUtilisation = math.Max(res.PeakUtilisation, float64(r.engines[j].measured)/span/c)
		}
	}
	// Time series over the measured period.
	var win []Sample
	for _, s := range m.samples {
		start := s.TimeS*1000 - m.f.sc.SamplePeriodMs
		if start >= m.f.measureFrom-1e-9 && s.TimeS*1000 <= m.f.measureTo+1e-9 {
			win = append(win, s)
		}
	}
	ne := len(r.engines)
	if len(win) > 1 {
		var sd, ex float64
		for j := 0; j < ne; j++ {
			var mean, sq, noise float64
			for _, s := range win {
				mean += s.Share[j]
			}
			mean /= float64(len(win))
			for _, s := range win {
				sq += (s.Share[j] - mean) * (s.Share[j] - mean)
				res.PeakWindowUtilisation = math.Max(res.PeakWindowUtilisation, s.Utilisation[j])
				if s.Dispatched > 0 {
					noise += s.Share[j] * (1 - s.Share[j]) / float64(s.Dispatched)
				}
			}
			v := sq / float64(len(win)-1)
			sd += math.Sqrt(v)
			ex += math.Sqrt(math.Max(0, v-noise/float64(len(win))))
			res.ShareReversals += reversals(win, j, 0.01)
		}
		res.TrafficShareStddev = sd / float64(ne)
		res.TrafficShareExcessStddev = ex / float64(ne)
	}
	res.WeightReversals = m.reversalsWeights
	res.WeightUpdates = m.weightUpdates
	if m.weightUpdates > 0 {
		res.KeysRemappedPerUpdate = m.remappedSum / float64(m.weightUpdates)
	}
	if m.targetUtilN > 0 {
		for _, u := range m.targetUtilSum {
			res.TargetPeakUtilisation = math.Max(res.TargetPeakUtilisation, u/float64(m.targetUtilN))
		}
	}
	res.Samples = m.samples
	res.TTFTSorted, res.E2ESorted = m.ttft, m.e2e
	return res
}

// reversals counts direction changes of engine j's share: a move counts once
// the share has travelled more than th from its last turning point.
func reversals(win []Sample, j int, th float64) int64 {
	var n int64
	dir := 0
	lo, hi := win[0].Share[j], win[0].Share[j]
	ext := lo
	for _, s := range win[1:] {
		v := s.Share[j]
		switch dir {
		case 0:
			lo, hi = math.Min(lo, v), math.Max(hi, v)
			if v-lo > th {
				dir, ext = 1, v
			} else if hi-v > th {
				dir, ext = -1, v
			}
		case 1:
			if v > ext {
				ext = v
			} else if ext-v > th {
				n++
				dir, ext = -1, v
			}
		case -1:
			if v < ext {
				ext = v
			} else if v-ext > th {
				n++
				dir, ext = 1, v
			}
		}
	}
	return n
}
