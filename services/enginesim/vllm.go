package enginesim

import (
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics formats an engine can serve at /metrics (Options.MetricsFormat).
const (
	// MetricsSwitchyard serves the simulator's own switchyard_enginesim_* metrics only.
	MetricsSwitchyard = "switchyard"
	// MetricsVLLM also serves vLLM's metric names, labels, types and
	// histogram buckets, computed from the simulator's state, so that the
	// engine agent can front it exactly as it fronts a vLLM server.
	MetricsVLLM = "vllm"
)

// vllmBlockSize is the KV block size the vLLM mode reports in
// vllm:cache_config_info (vLLM's default for CUDA).
const vllmBlockSize = 16

// vllmMetrics are vLLM's Prometheus instruments (vllm/v1/metrics/loggers.py),
// labelled model_name and engine (the data-parallel rank, "0") as vLLM labels them.
type vllmMetrics struct {
	success                    *prometheus.CounterVec
	promptTokens, genTokens    prometheus.Counter
	prefixQueries, prefixHits  prometheus.Counter
	ttft, itl, tpot, e2e, gens prometheus.Histogram
}

func validMetricsFormat(f string) error {
	switch f {
	case "", MetricsSwitchyard, MetricsVLLM:
		return nil
	}
	return fmt.Errorf("%w: MetricsFormat is %q, want %q or %q", ErrOptions, f, MetricsSwitchyard, MetricsVLLM)
}

func newVLLMMetrics(e *Engine, reg *prometheus.Registry) *vllmMetrics {
	labels := prometheus.Labels{"model_name": e.opts.Model, "engine": "0"}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
	}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: labels, Buckets: buckets})
	}
	latency := []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
	token := []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	m := &vllmMetrics{
		success: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vllm:request_success_total", Help: "Count of successfully processed requests.", ConstLabels: labels,
		}, []string{"finished_reason"}),
		promptTokens:  counter("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		genTokens:     counter("vllm:generation_tokens_total", "Number of generation tokens processed."),
		prefixQueries: counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		prefixHits:    counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		ttft: hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
			[]float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}),
		itl:  hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", token),
		tpot: hist("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", token),
		e2e:  hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", latency),
		gens: hist("vllm:request_generation_tokens", "Number of generation tokens processed.", buckets125(max(1, e.opts.KVTokens))),
	}
	for _, reason := range []string{"stop", "length", "abort"} {
		m.success.WithLabelValues(reason) // vLLM exports every reason from the start
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, f)
	}
	locked := func(f func() float64) func() float64 {
		return func() float64 {
			e.mu.Lock()
			defer e.mu.Unlock()
			return f()
		}
	}
	prefixCaching := "False"
	if e.opts.KVEvents != "" {
		prefixCaching = "True"
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig",
		ConstLabels: prometheus.Labels{"engine": "0", "block_size": strconv.Itoa(vllmBlockSize),
			"num_gpu_blocks": strconv.Itoa(max(1, e.opts.KVTokens/vllmBlockSize)), "enable_prefix_caching": prefixCaching},
	})
	info.Set(1)
	reg.MustRegister(m.success, m.promptTokens, m.genTokens, m.prefixQueries, m.prefixHits,
		m.ttft, m.itl, m.tpot, m.e2e, m.gens, info,
		gauge("vllm:num_requests_running", "Number of requests in model execution batches.", locked(func() float64 { return float64(e.batch.Running()) })),
		gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", locked(func() float64 { return float64(e.batch.Queued()) })),
		gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", locked(e.kvUseLocked)),
	)
	return m
}

// buckets125 is vLLM's 1-2-5 series (1, 2, 5, 10, 20, 50, ...) up to limit,
// the bucket bounds it gives its token-count histograms (limit: the model length).
func buckets125(limit int) []float64 {
	var out []float64
	for p := 1; ; p *= 10 {
		for _, m := range []int{1, 2, 5} {
			if m*p > limit {
				return out
			}
			out = append(out, float64(m*p))
		}
	}
}

// firstToken records a request's prefill: its TTFT and prompt tokens, and
// as prefix-cache hits the tokens its prefix cache held (none without
// Options.KVEvents, which keeps the cache).
func (m *vllmMetrics) firstToken(r *request, ttft time.Duration) {
	if m == nil {
		return
	}
	m.ttft.Observe(ttft.Seconds())
	m.promptTokens.Add(float64(r.prompt))
	m.prefixQueries.Add(float64(r.prompt))
	m.prefixHits.Add(float64(r.cached))
}

// finished records a completed request: vLLM counts it as finished for
// "length" (the simulator always generates up to its token budget).
func (m *vllmMetrics) finished(r *request, now time.Time) {
	if m == nil {
		return
	}
	m.success.WithLabelValues("length").Inc()
	m.genTokens.Add(float64(r.generated))
	m.gens.Observe(float64(r.generated))
	m.e2e.Observe(now.Sub(r.arrived).Seconds())
	if r.generated > 1 {
		itl := r.lastAt.Sub(r.firstAt).Seconds() / float64(r.generated-1)
		// One observation per inter-token gap, at the request's mean gap: the
		// histogram's sum and count are those vLLM's would have.
		for range r.generated - 1 {
			m.itl.Observe(itl)
		}
		m.tpot.Observe(itl)
	}
}
