package agent

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// vllmText200 renders a vLLM-shaped /metrics text of 200 series: the gauges
// and counters the agent reads, two data-parallel ranks, and histograms with
// vLLM's bucket bounds (each bucket line is a series).
func vllmText200() (string, int) {
	var b strings.Builder
	series := 0
	lbl := func(rank int) string {
		return fmt.Sprintf(`engine="%d",model_name="meta-llama/Llama-3.1-8B-Instruct"`, rank)
	}
	for _, g := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"} {
		fmt.Fprintf(&b, "# HELP %s gauge.\n# TYPE %s gauge\n", g, g)
		for r := range 2 {
			fmt.Fprintf(&b, "%s{%s} %d.0\n", g, lbl(r), 3+r)
			series++
		}
	}
	for _, c := range []string{"vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total"} {
		fmt.Fprintf(&b, "# HELP %s counter.\n# TYPE %s counter\n", c, c)
		for r := range 2 {
			fmt.Fprintf(&b, "%s{%s} %d.0\n", c, lbl(r), 100000+r)
			series++
		}
	}
	b.WriteString("# HELP vllm:request_success_total ok.\n# TYPE vllm:request_success_total counter\n")
	for r := range 2 {
		for _, reason := range []string{"stop", "length", "abort"} {
			fmt.Fprintf(&b, "vllm:request_success_total{%s,finished_reason=%q} 10.0\n", lbl(r), reason)
			series++
		}
	}
	hists := []struct {
		name    string
		buckets []float64
	}{
		{"vllm:time_to_first_token_seconds", []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}},
		{"vllm:inter_token_latency_seconds", []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}},
		{"vllm:e2e_request_latency_seconds", []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}},
		{"vllm:request_queue_time_seconds", []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}},
	}
	for _, hs := range hists {
		fmt.Fprintf(&b, "# HELP %s h.\n# TYPE %s histogram\n", hs.name, hs.name)
		for r := range 2 {
			for i, le := range hs.buckets {
				fmt.Fprintf(&b, "%s_bucket{%s,le=\"%g\"} %d.0\n", hs.name, lbl(r), le, i*10)
				series++
			}
			fmt.Fprintf(&b, "%s_bucket{%s,le=\"+Inf\"} 300.0\n%s_count{%s} 300.0\n%s_sum{%s} 45.5\n",
				hs.name, lbl(r), hs.name, lbl(r), hs.name, lbl(r))
			series += 3
		}
	}
	b.WriteString("# HELP vllm:cache_config_info info.\n# TYPE vllm:cache_config_info gauge\n")
	b.WriteString(`vllm:cache_config_info{block_size="16",num_gpu_blocks="27264",engine="0"} 1.0` + "\n")
	series++
	return b.String(), series
}

// BenchmarkParseVLLM200 measures one scrape's parse of a 200-series vLLM
// text: "agent" is Parser.Parse as the agent runs it; "expfmt-all" hands the
// whole text to the text parser, for comparison in the same run.
func BenchmarkParseVLLM200(b *testing.B) {
	text, series := vllmText200()
	if series < 200 {
		b.Fatalf("fixture has %d series, want >= 200", series)
	}
	data := []byte(text)
	b.Run("agent", func(b *testing.B) {
		p, _ := NewParser(FormatVLLM, "")
		b.SetBytes(int64(len(data)))
		b.ReportAllocs()
		for b.Loop() {
			s, err := p.Parse(data)
			if err != nil || !s.TTFT.OK {
				b.Fatalf("parse: %v", err)
			}
		}
	})
	b.Run("expfmt-all", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		b.ReportAllocs()
		for b.Loop() {
			tp := expfmt.NewTextParser(model.UTF8Validation)
			if _, err := tp.TextToMetricFamilies(bytes.NewReader(data)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
