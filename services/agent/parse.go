package agent

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Format names an engine's metrics dialect: which Prometheus names the agent reads.
type Format string

// The metrics formats the agent understands.
const (
	FormatVLLM     Format = "vllm"
	FormatSGLang   Format = "sglang"
	FormatTGI      Format = "tgi"
	FormatLlamaCPP Format = "llamacpp"
)

// Formats returns the supported formats, in the order the docs give them.
func Formats() []Format { return []Format{FormatVLLM, FormatSGLang, FormatTGI, FormatLlamaCPP} }

// ErrUnknownFormat is returned for a metrics format the agent does not know.
var ErrUnknownFormat = errors.New("agent: unknown metrics format")

// ErrMetrics wraps a metrics text that could not be parsed at all.
var ErrMetrics = errors.New("agent: bad metrics text")

// maxParseRepairs bounds how many malformed lines Parse drops and re-parses
// around: a few odd lines from a real engine are survivable, a text that is
// mostly garbage is a failed scrape.
const maxParseRepairs = 8

// Counter is one cumulative value read from a scrape; OK says it was present.
type Counter struct {
	V  float64
	OK bool
}

// Hist is the cumulative sum and count of a histogram or summary (or of two
// counters that form a ratio, such as seconds and tokens); OK says it was present.
type Hist struct {
	Sum, Count float64
	OK         bool
}

// Sample is what one scrape of an engine's metrics says, in engine-neutral
// terms. Gauges are current values; Counter and Hist fields are cumulative
// since the engine started, and become rates and means only as deltas
// between two samples (see Estimator).
type Sample struct {
	// Running and Waiting are the requests in the batch and in the queue.
	Running, Waiting Counter
	// KVUse is the KV-cache fraction in use, 0..1.
	KVUse Counter
	// Completed counts finished requests; Arrived counts accepted ones
	// (only engines with an arrival counter, TGI, have it).
	Completed, Arrived Counter
	// TTFT, TTFTExtra, TBT and E2E are latency histograms in seconds;
	// TTFTExtra, when present, is a second phase whose mean adds to TTFT's
	// (TGI: time in queue plus the prefill forward pass).
	TTFT, TTFTExtra, TBT, E2E Hist
	// GenPerRequest is a histogram of generated tokens per request.
	GenPerRequest Hist
	// PromptTokens and GenTokens count tokens processed.
	PromptTokens, GenTokens Counter
	// PrefixHits and PrefixQueries count prefix-cache blocks (or tokens) hit
	// and looked up; PrefixHitRate is a gauge some engines give instead.
	PrefixHits, PrefixQueries, PrefixHitRate Counter
	// BlockSize and GPUBlocks come from vLLM's cache_config_info labels.
	BlockSize, GPUBlocks Counter
	// Repaired is how many bad lines Parse dropped.
	Repaired int
}

// agg says how several series of one family combine.
type agg int

const (
	aggSum agg = iota
	aggMean
)

// field reads one Sample field from the first family present among names.
type field struct {
	names []string
	// label, when set, keeps only series with label=value (TGI's method="prefill").
	label, value string
	agg          agg
	counter      func(*Sample) *Counter
	hist         func(*Sample) *Hist
}

// ratio reads a Hist from two counters: Sum from sum, Count from count (llama.cpp).
type ratio struct {
	sum, count string
	hist       func(*Sample) *Hist
}

type dialect struct {
	fields []field
	ratios []ratio
	// modelLabel is the label naming the served model, for Options.ServedModel.
	modelLabel string
}

func c(f func(*Sample) *Counter) func(*Sample) *Counter { return f }
func h(f func(*Sample) *Hist) func(*Sample) *Hist       { return f }

// dialects maps each format to the metric names its engines expose, newest
// name first where an engine renamed one. Names are those of the engines'
// sources: vLLM vllm/v1/metrics/loggers.py (gpu_cache_usage_perc and
// time_per_output_token_seconds are the pre-0.10 names), SGLang
// python/sglang/srt/metrics/collector.py, TGI docs/source/reference/metrics.md
// (router/src), llama.cpp tools/server/server.cpp (--metrics).
var dialects = map[Format]dialect{
	FormatVLLM: {modelLabel: "model_name", fields: []field{
		{names: []string{"vllm:num_requests_running"}, counter: c(func(s *Sample) *Counter { return &s.Running })},
		{names: []string{"vllm:num_requests_waiting"}, counter: c(func(s *Sample) *Counter { return &s.Waiting })},
		{names: []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}, agg: aggMean, counter: c(func(s *Sample) *Counter { return &s.KVUse })},
		{names: []string{"vllm:request_success_total", "vllm:request_success"}, counter: c(func(s *Sample) *Counter { return &s.Completed })},
		{names: []string{"vllm:prompt_tokens_total", "vllm:prompt_tokens"}, counter: c(func(s *Sample) *Counter { return &s.PromptTokens })},
		{names: []string{"vllm:generation_tokens_total", "vllm:generation_tokens"}, counter: c(func(s *Sample) *Counter { return &s.GenTokens })},
		{names: []string{"vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total", "vllm:prefix_cache_hits"}, counter: c(func(s *Sample) *Counter { return &s.PrefixHits })},
		{names: []string{"vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total", "vllm:prefix_cache_queries"}, counter: c(func(s *Sample) *Counter { return &s.PrefixQueries })},
		{names: []string{"vllm:gpu_prefix_cache_hit_rate"}, agg: aggMean, counter: c(func(s *Sample) *Counter { return &s.PrefixHitRate })},
		{names: []string{"vllm:time_to_first_token_seconds"}, hist: h(func(s *Sample) *Hist { return &s.TTFT })},
		{names: []string{"vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"}, hist: h(func(s *Sample) *Hist { return &s.TBT })},
		{names: []string{"vllm:e2e_request_latency_seconds"}, hist: h(func(s *Sample) *Hist { return &s.E2E })},
		{names: []string{"vllm:request_generation_tokens"}, hist: h(func(s *Sample) *Hist { return &s.GenPerRequest })},
	}},
	FormatSGLang: {modelLabel: "model_name", fields: []field{
		{names: []string{"sglang:num_running_reqs"}, counter: c(func(s *Sample) *Counter { return &s.Running })},
		{names: []string{"sglang:num_queue_reqs"}, counter: c(func(s *Sample) *Counter { return &s.Waiting })},
		{names: []string{"sglang:token_usage"}, agg: aggMean, counter: c(func(s *Sample) *Counter { return &s.KVUse })},
		{names: []string{"sglang:cache_hit_rate"}, agg: aggMean, counter: c(func(s *Sample) *Counter { return &s.PrefixHitRate })},
		{names: []string{"sglang:num_requests_total", "sglang:num_requests"}, counter: c(func(s *Sample) *Counter { return &s.Completed })},
		{names: []string{"sglang:num_requests_received_total"}, counter: c(func(s *Sample) *Counter { return &s.Arrived })},
		{names: []string{"sglang:prompt_tokens_total", "sglang:prompt_tokens"}, counter: c(func(s *Sample) *Counter { return &s.PromptTokens })},
		{names: []string{"sglang:generation_tokens_total", "sglang:generation_tokens"}, counter: c(func(s *Sample) *Counter { return &s.GenTokens })},
		{names: []string{"sglang:time_to_first_token_seconds"}, hist: h(func(s *Sample) *Hist { return &s.TTFT })},
		{names: []string{"sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"}, hist: h(func(s *Sample) *Hist { return &s.TBT })},
		{names: []string{"sglang:e2e_request_latency_seconds"}, hist: h(func(s *Sample) *Hist { return &s.E2E })},
	}},
	FormatTGI: {fields: []field{
		{names: []string{"tgi_batch_current_size"}, counter: c(func(s *Sample) *Counter { return &s.Running })},
		{names: []string{"tgi_queue_size"}, counter: c(func(s *Sample) *Counter { return &s.Waiting })},
		{names: []string{"tgi_request_count"}, counter: c(func(s *Sample) *Counter { return &s.Arrived })},
		{names: []string{"tgi_request_success"}, counter: c(func(s *Sample) *Counter { return &s.Completed })},
		{names: []string{"tgi_request_queue_duration"}, hist: h(func(s *Sample) *Hist { return &s.TTFT })},
		{names: []string{"tgi_batch_forward_duration"}, label: "method", value: "prefill", hist: h(func(s *Sample) *Hist { return &s.TTFTExtra })},
		{names: []string{"tgi_request_mean_time_per_token_duration"}, hist: h(func(s *Sample) *Hist { return &s.TBT })},
		{names: []string{"tgi_request_duration"}, hist: h(func(s *Sample) *Hist { return &s.E2E })},
		{names: []string{"tgi_request_generated_tokens"}, hist: h(func(s *Sample) *Hist { return &s.GenPerRequest })},
	}},
	FormatLlamaCPP: {
		fields: []field{
			{names: []string{"llamacpp:requests_processing"}, counter: c(func(s *Sample) *Counter { return &s.Running })},
			{names: []string{"llamacpp:requests_deferred"}, counter: c(func(s *Sample) *Counter { return &s.Waiting })},
			{names: []string{"llamacpp:kv_cache_usage_ratio"}, agg: aggMean, counter: c(func(s *Sample) *Counter { return &s.KVUse })},
			{names: []string{"llamacpp:prompt_tokens_total"}, counter: c(func(s *Sample) *Counter { return &s.PromptTokens })},
			{names: []string{"llamacpp:tokens_predicted_total"}, counter: c(func(s *Sample) *Counter { return &s.GenTokens })},
		},
		// llama.cpp sums each slot's generation time: seconds per predicted
		// token is one request's time between tokens.
		ratios: []ratio{{sum: "llamacpp:tokens_predicted_seconds_total", count: "llamacpp:tokens_predicted_total", hist: h(func(s *Sample) *Hist { return &s.TBT })}},
	},
}

// ParseFormat returns the Format named s, or an error wrapping ErrUnknownFormat.
func ParseFormat(s string) (Format, error) {
	for _, f := range Formats() {
		if string(f) == s {
			return f, nil
		}
	}
	return "", fmt.Errorf("%w %q, want one of %v", ErrUnknownFormat, s, Formats())
}

// Parser turns metrics text of one format into Samples. It keeps no state
// between calls and is safe for concurrent use.
type Parser struct {
	format      Format
	d           dialect
	servedModel string
	// wanted holds the sample names the dialect reads (a histogram's _sum
	// and _count, never its buckets): Parse hands only those lines to the
	// text parser, which keeps the cost of a scrape independent of the
	// hundreds of series an engine exposes for dashboards.
	wanted map[string]bool
}

// NewParser returns a Parser for format. servedModel, when not empty, keeps
// only series whose model label (vLLM and SGLang: model_name) is servedModel
// or absent, for an engine process that serves several models.
func NewParser(format Format, servedModel string) (*Parser, error) {
	d, ok := dialects[format]
	if !ok {
		return nil, fmt.Errorf("%w %q, want one of %v", ErrUnknownFormat, format, Formats())
	}
	// Each name is also read in its underscore form (sglang_num_running_reqs
	// for sglang:num_running_reqs): newer SGLang releases and exporters that
	// rewrite names for OpenTelemetry use it. The documented name comes first.
	fields := make([]field, len(d.fields))
	for i, f := range d.fields {
		names := append([]string(nil), f.names...)
		for _, n := range f.names {
			if u := strings.ReplaceAll(n, ":", "_"); u != n {
				names = append(names, u)
			}
		}
		f.names = names
		fields[i] = f
	}
	d.fields = fields
	w := map[string]bool{"vllm:cache_config_info": true}
	for _, f := range d.fields {
		for _, n := range f.names {
			w[n] = true
			if f.hist != nil {
				w[n+"_sum"], w[n+"_count"] = true, true
			}
		}
	}
	for _, r := range d.ratios {
		w[r.sum], w[r.count] = true, true
	}
	return &Parser{format: format, d: d, servedModel: servedModel, wanted: w}, nil
}

// filter returns the lines of text that name a wanted sample or declare the
// TYPE of a wanted family; HELP lines, other families and histogram buckets
// are left out.
func (p *Parser) filter(text []byte) []byte {
	out := make([]byte, 0, len(text)/4)
	for len(text) > 0 {
		line := text
		if i := bytes.IndexByte(text, '\n'); i >= 0 {
			line, text = text[:i+1], text[i+1:]
		} else {
			text = nil
		}
		l := bytes.TrimLeft(line, " \t")
		if bytes.HasPrefix(l, []byte("#")) {
			rest, ok := bytes.CutPrefix(bytes.TrimLeft(l[1:], " \t"), []byte("TYPE"))
			if !ok {
				continue
			}
			name, _, _ := bytes.Cut(bytes.TrimLeft(rest, " \t"), []byte(" "))
			if p.wanted[string(name)] {
				out = appendLine(out, line)
			}
			continue
		}
		end := bytes.IndexAny(l, "{ \t")
		if end < 0 {
			continue
		}
		if p.wanted[string(l[:end])] {
			out = appendLine(out, line)
		}
	}
	return out
}

func appendLine(out, line []byte) []byte {
	out = append(out, line...)
	if len(line) == 0 || line[len(line)-1] != '\n' {
		out = append(out, '\n')
	}
	return out
}

// Parse reads a Prometheus text exposition. A line the text parser rejects
// is dropped and the rest parsed again, up to maxParseRepairs lines, so that
// one odd line does not blind the agent; a text with more is an error
// wrapping ErrMetrics. Parse never panics on any input.
func (p *Parser) Parse(text []byte) (s Sample, err error) {
	defer func() {
		// The parser is third-party code fed with input from the network:
		// a panic in it is a bad scrape, not a dead agent.
		if r := recover(); r != nil {
			s, err = Sample{}, fmt.Errorf("%w: parser panic: %v", ErrMetrics, r)
		}
	}()
	text = p.filter(text)
	var fams map[string]*dto.MetricFamily
	for attempt := 0; ; attempt++ {
		tp := expfmt.NewTextParser(model.UTF8Validation)
		fams, err = tp.TextToMetricFamilies(bytes.NewReader(text))
		if err == nil {
			s.Repaired = attempt
			break
		}
		var pe expfmt.ParseError
		if !errors.As(err, &pe) || pe.Line <= 0 || attempt >= maxParseRepairs {
			return Sample{}, fmt.Errorf("%w (%s, %d bytes): %v", ErrMetrics, p.format, len(text), err)
		}
		text = dropLine(text, pe.Line)
	}
	if len(fams) == 0 {
		return Sample{}, fmt.Errorf("%w: no %s metric in %d bytes of text (is the engine's metrics format %s?)", ErrMetrics, p.format, len(text), p.format)
	}
	for i := range p.d.fields {
		p.read(&s, fams, &p.d.fields[i])
	}
	for _, r := range p.d.ratios {
		sum, okS := p.total(fams[r.sum], "", "", aggSum)
		cnt, okC := p.total(fams[r.count], "", "", aggSum)
		if okS && okC {
			*r.hist(&s) = Hist{Sum: sum, Count: cnt, OK: true}
		}
	}
	if mf := fams["vllm:cache_config_info"]; mf != nil && p.format == FormatVLLM {
		for _, m := range mf.GetMetric() {
			if !p.keep(m) {
				continue
			}
			for _, lp := range m.GetLabel() {
				v, perr := strconv.ParseFloat(lp.GetValue(), 64)
				if perr != nil || !finite(v) || v < 0 {
					continue
				}
				switch lp.GetName() {
				case "block_size":
					s.BlockSize = Counter{V: v, OK: true}
				case "num_gpu_blocks":
					s.GPUBlocks = Counter{V: v, OK: true}
				}
			}
			break
		}
	}
	return s, nil
}

// dropLine returns text without its 1-based line n (a copy: the caller's
// buffer is not changed).
func dropLine(text []byte, n int) []byte {
	start := 0
	for i := 1; i < n; i++ {
		j := bytes.IndexByte(text[start:], '\n')
		if j < 0 {
			return text[:0]
		}
		start += j + 1
	}
	end := len(text)
	if j := bytes.IndexByte(text[start:], '\n'); j >= 0 {
		end = start + j + 1
	}
	out := make([]byte, 0, len(text)-(end-start))
	out = append(out, text[:start]...)
	return append(out, text[end:]...)
}

func (p *Parser) read(s *Sample, fams map[string]*dto.MetricFamily, f *field) {
	for _, name := range f.names {
		mf := fams[name]
		if mf == nil {
			continue
		}
		if f.hist != nil {
			if hs, ok := p.hist(mf, f.label, f.value); ok {
				*f.hist(s) = hs
				return
			}
			continue
		}
		if v, ok := p.total(mf, f.label, f.value, f.agg); ok {
			*f.counter(s) = Counter{V: v, OK: true}
			return
		}
	}
}

// keep says whether series m belongs to the served model.
func (p *Parser) keep(m *dto.Metric) bool {
	if p.servedModel == "" || p.d.modelLabel == "" {
		return true
	}
	for _, lp := range m.GetLabel() {
		if lp.GetName() == p.d.modelLabel {
			return lp.GetValue() == p.servedModel
		}
	}
	return true
}

func hasLabel(m *dto.Metric, name, value string) bool {
	if name == "" {
		return true
	}
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue() == value
		}
	}
	return false
}

// total combines the scalar value of every kept series of mf.
func (p *Parser) total(mf *dto.MetricFamily, label, value string, a agg) (float64, bool) {
	if mf == nil {
		return 0, false
	}
	sum, n := 0.0, 0
	for _, m := range mf.GetMetric() {
		if !p.keep(m) || !hasLabel(m, label, value) {
			continue
		}
		var v float64
		switch {
		case m.Gauge != nil:
			v = m.Gauge.GetValue()
		case m.Counter != nil:
			v = m.Counter.GetValue()
		case m.Untyped != nil:
			v = m.Untyped.GetValue()
		default:
			continue
		}
		if !finite(v) || v < 0 {
			continue // a NaN or negative gauge says nothing usable
		}
		sum += v
		n++
	}
	if n == 0 {
		return 0, false
	}
	if a == aggMean {
		return sum / float64(n), true
	}
	return sum, true
}

// hist sums the sum and count of every kept histogram or summary series of mf.
func (p *Parser) hist(mf *dto.MetricFamily, label, value string) (Hist, bool) {
	var out Hist
	for _, m := range mf.GetMetric() {
		if !p.keep(m) || !hasLabel(m, label, value) {
			continue
		}
		var sum, cnt float64
		switch {
		case m.Histogram != nil:
			sum, cnt = m.Histogram.GetSampleSum(), float64(m.Histogram.GetSampleCount())
			if cf := m.Histogram.GetSampleCountFloat(); cf > 0 {
				cnt = cf
			}
		case m.Summary != nil:
			sum, cnt = m.Summary.GetSampleSum(), float64(m.Summary.GetSampleCount())
		default:
			continue
		}
		if !finite(sum) || !finite(cnt) || sum < 0 || cnt < 0 {
			continue
		}
		out.Sum += sum
		out.Count += cnt
		out.OK = true
	}
	return out, out.OK
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
