package agent

import (
	"math"
	"time"
)

// Known holds what the operator states about an engine that its metrics do
// not say; a zero field is learned (see Estimator).
type Known struct {
	// CapacityRPS is the request rate the engine sustains, req/s.
	CapacityRPS float64
	// MaxRunning is the engine's largest batch (vLLM --max-num-seqs, SGLang
	// --max-running-requests, TGI --max-batch-size, llama.cpp --parallel).
	MaxRunning int
	// BaseLatencyMs is the engine-side latency of one request on an idle engine, ms.
	BaseLatencyMs float64
	// DefaultCapacityRPS is published as capacity while nothing better is
	// known (no CapacityRPS, and no MaxRunning stated or learned yet).
	DefaultCapacityRPS float64
}

// Values are the signal fields an Estimator derives from samples.
type Values struct {
	// TTFTMs and TBTMs are the newest interval means, ms.
	TTFTMs, TBTMs float64
	// Queue and Running are the engine's gauges; MaxRunning is stated or learned (0: unknown).
	Queue, Running, MaxRunning int
	// KVUse is the KV-cache fraction in use.
	KVUse float64
	// CapacityRPS is stated or learned; LoadRPS is the interval's arrival rate, req/s.
	CapacityRPS, LoadRPS float64
	// OutputTokens is the mean generated tokens per request.
	OutputTokens float64
	// BaseLatencyMs is stated or learned (0: unknown).
	BaseLatencyMs float64
	// PrefixHitRate is the engine's own prefix-cache hit ratio: the interval's
	// Δhits/Δqueries (vLLM), or the engine's gauge (SGLang, older vLLM).
	PrefixHitRate float64
	// MeanLatencyMs is the newest mean request latency, ms.
	MeanLatencyMs float64
	// CounterReset says this sample's counters went down (an engine restart);
	// HaveRate says LoadRPS was measured (false on the first sample).
	CounterReset, HaveRate bool
}

// Estimator turns successive Samples of one engine into signal Values.
//
// Methods, field by field:
//   - running, queue, kv_use: the engine's gauges as scraped (summed over
//     data-parallel ranks; kv_use averaged).
//   - ttft_ms, tbt_ms: histogram deltas between two scrapes, mean =
//     Δsum/Δcount; an interval with no new observation repeats the
//     previous mean (0 would read as infinitely fast).
//   - load_rps: an arrival counter's delta over the interval where the
//     engine has one (TGI); otherwise arrivals = completions + the change in
//     requests held (running + waiting), over the interval — a request that
//     arrived is either finished or still held.
//   - output_tokens: Δsum/Δcount of the generated-tokens-per-request
//     histogram, else Δgeneration tokens / Δcompletions.
//   - max_running: Known.MaxRunning; else the highest running count seen
//     while requests were waiting (a queue forms only when the batch is
//     full), 0 until then.
//   - capacity_rps: Known.CapacityRPS; else max_running / the mean request
//     latency (Little's law for a full batch; the latency is the e2e
//     histogram's mean, else ttft + output_tokens × tbt), at least the
//     highest completion rate seen; else Known.DefaultCapacityRPS.
//   - base_latency_ms: Known.BaseLatencyMs; else the lowest per-interval
//     ttft + (output_tokens − 1) × tbt seen, which approaches the idle
//     latency from above.
//
// A counter or histogram count that goes down means the engine restarted:
// the current values are then the deltas (Prometheus's rate() does the same).
type Estimator struct {
	known Known

	prev   Sample
	prevAt time.Time
	have   bool

	ttft, tbt, otok, lat, hitRate float64
	maxRunSeen                    int
	peakDone                      float64
	base                          float64
}

// NewEstimator returns an Estimator using what the operator knows.
func NewEstimator(k Known) *Estimator { return &Estimator{known: k} }

// Update folds a sample taken at at and returns the values to publish.
func (e *Estimator) Update(s Sample, at time.Time) Values {
	v := Values{
		Running: gaugeInt(s.Running),
		Queue:   gaugeInt(s.Waiting),
		KVUse:   math.Min(1, math.Max(0, s.KVUse.V)),
	}
	if s.PrefixHitRate.OK {
		e.hitRate = math.Min(1, s.PrefixHitRate.V)
	}
	if v.Queue > 0 && v.Running > e.maxRunSeen {
		e.maxRunSeen = v.Running
	}
	if e.have {
		dt := at.Sub(e.prevAt).Seconds()
		reset := resetSeen(e.prev, s)
		v.CounterReset = reset
		p := e.prev
		if reset {
			p = Sample{} // counting started again from zero
		}
		if m, ok := histMean(p.TTFT, s.TTFT); ok {
			e.ttft = m * 1000
			if x, ok := histMean(p.TTFTExtra, s.TTFTExtra); ok {
				e.ttft += x * 1000
			}
		}
		if m, ok := histMean(p.TBT, s.TBT); ok {
			e.tbt = m * 1000
		}
		// vLLM counts prefix-cache hits and queries: the interval's hit ratio.
		if q, ok := counterDelta(p.PrefixQueries, s.PrefixQueries); ok && q > 0 {
			if hits, ok := counterDelta(p.PrefixHits, s.PrefixHits); ok {
				e.hitRate = math.Min(1, hits/q)
			}
		}
		done, doneOK := counterDelta(p.Completed, s.Completed)
		if m, ok := histMean(p.GenPerRequest, s.GenPerRequest); ok {
			e.otok = m
		} else if g, ok := counterDelta(p.GenTokens, s.GenTokens); ok && doneOK && done > 0 {
			e.otok = g / done
		}
		if m, ok := histMean(p.E2E, s.E2E); ok {
			e.lat = m * 1000
		} else if e.ttft > 0 && e.otok > 0 {
			e.lat = e.ttft + math.Max(0, e.otok-1)*e.tbt
		}
		if dt > 0 {
			if a, ok := counterDelta(p.Arrived, s.Arrived); ok {
				v.LoadRPS, v.HaveRate = a/dt, true
			} else if doneOK {
				held := float64(v.Running + v.Queue)
				if !reset {
					held -= float64(gaugeInt(e.prev.Running) + gaugeInt(e.prev.Waiting))
				}
				v.LoadRPS, v.HaveRate = math.Max(0, done+held)/dt, true
			}
			if doneOK {
				e.peakDone = math.Max(e.peakDone, done/dt)
			}
		}
		if e.ttft > 0 && e.otok > 0 {
			b := e.ttft + math.Max(0, e.otok-1)*e.tbt
			if e.base == 0 || b < e.base {
				e.base = b
			}
		}
	}
	e.prev, e.prevAt, e.have = s, at, true

	v.TTFTMs, v.TBTMs, v.OutputTokens, v.MeanLatencyMs, v.PrefixHitRate = e.ttft, e.tbt, e.otok, e.lat, e.hitRate
	v.MaxRunning = e.known.MaxRunning
	if v.MaxRunning == 0 {
		v.MaxRunning = e.maxRunSeen
	}
	switch {
	case e.known.CapacityRPS > 0:
		v.CapacityRPS = e.known.CapacityRPS
	case v.MaxRunning > 0 && e.lat > 0:
		v.CapacityRPS = math.Max(float64(v.MaxRunning)/(e.lat/1000), e.peakDone)
	default:
		v.CapacityRPS = math.Max(e.known.DefaultCapacityRPS, e.peakDone)
	}
	v.BaseLatencyMs = e.known.BaseLatencyMs
	if v.BaseLatencyMs == 0 {
		v.BaseLatencyMs = e.base
	}
	return v
}

// gaugeInt rounds a count gauge to an int, bounded to what a signal accepts.
func gaugeInt(c Counter) int {
	if !c.OK || !finite(c.V) || c.V <= 0 {
		return 0
	}
	return int(math.Min(math.Round(c.V), 1<<40))
}

// resetSeen says whether any cumulative value went down between prev and cur.
func resetSeen(prev, cur Sample) bool {
	down := func(p, c Counter) bool { return p.OK && c.OK && c.V < p.V }
	hdown := func(p, c Hist) bool { return p.OK && c.OK && (c.Count < p.Count || c.Sum < p.Sum) }
	return down(prev.Completed, cur.Completed) || down(prev.Arrived, cur.Arrived) ||
		down(prev.PromptTokens, cur.PromptTokens) || down(prev.GenTokens, cur.GenTokens) ||
		hdown(prev.TTFT, cur.TTFT) || hdown(prev.TBT, cur.TBT) || hdown(prev.E2E, cur.E2E) ||
		hdown(prev.GenPerRequest, cur.GenPerRequest)
}

// counterDelta is cur − prev, with a missing prev (after a reset) read as 0.
func counterDelta(prev, cur Counter) (float64, bool) {
	if !cur.OK {
		return 0, false
	}
	d := cur.V - prev.V
	if d < 0 {
		d = cur.V
	}
	return d, true
}

// histMean is Δsum/Δcount, false when nothing new was observed.
func histMean(prev, cur Hist) (float64, bool) {
	if !cur.OK {
		return 0, false
	}
	dc, ds := cur.Count-prev.Count, cur.Sum-prev.Sum
	if dc < 0 || ds < 0 {
		dc, ds = cur.Count, cur.Sum
	}
	if dc <= 0 {
		return 0, false
	}
	m := ds / dc
	if !finite(m) || m < 0 || m > 86400 {
		return 0, false
	}
	return m, true
}
