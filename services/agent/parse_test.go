package agent

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func TestParseFixtures(t *testing.T) {
	cases := []struct {
		file   string
		format Format
		served string
		check  func(t *testing.T, s Sample)
	}{
		{"vllm.txt", FormatVLLM, "", func(t *testing.T, s Sample) {
			// Two data-parallel ranks: counts sum, KV use averages.
			want(t, "running", s.Running, 8)
			want(t, "waiting", s.Waiting, 2)
			want(t, "kv", s.KVUse, 0.375)
			want(t, "completed (all finished reasons)", s.Completed, 200)
			want(t, "prompt tokens", s.PromptTokens, 51200)
			want(t, "generation tokens", s.GenTokens, 25600)
			want(t, "prefix hits", s.PrefixHits, 700)
			want(t, "prefix queries", s.PrefixQueries, 1000)
			wantHist(t, "ttft", s.TTFT, 10, 200)
			wantHist(t, "tbt (inter_token_latency)", s.TBT, 508, 25400)
			wantHist(t, "e2e", s.E2E, 540, 200)
			wantHist(t, "generated per request", s.GenPerRequest, 25600, 200)
			want(t, "block size", s.BlockSize, 16)
			want(t, "gpu blocks", s.GPUBlocks, 27264)
		}},
		{"vllm.txt", FormatVLLM, "other-model", func(t *testing.T, s Sample) {
			if s.Running.OK || s.TTFT.OK {
				t.Errorf("series of another model_name were read: running %+v ttft %+v", s.Running, s.TTFT)
			}
		}},
		{"vllm_old.txt", FormatVLLM, "llama-2-7b", func(t *testing.T, s Sample) {
			want(t, "running", s.Running, 4)
			want(t, "waiting", s.Waiting, 1)
			want(t, "kv (gpu_cache_usage_perc)", s.KVUse, 0.75)
			want(t, "prefix hit rate", s.PrefixHitRate, 0.4)
			wantHist(t, "tbt (time_per_output_token)", s.TBT, 3, 100)
			wantHist(t, "ttft", s.TTFT, 0.8, 10)
		}},
		{"sglang.txt", FormatSGLang, "", func(t *testing.T, s Sample) {
			want(t, "running", s.Running, 28)
			want(t, "waiting", s.Waiting, 7)
			want(t, "kv (token_usage)", s.KVUse, 0.28)
			want(t, "cache hit rate", s.PrefixHitRate, 0.0075)
			want(t, "completed", s.Completed, 29000)
			wantHist(t, "ttft", s.TTFT, 2900, 29000)
			wantHist(t, "tbt", s.TBT, 151151.44, 7.557572e+06)
		}},
		{"sglang_underscore.txt", FormatSGLang, "", func(t *testing.T, s Sample) {
			want(t, "running (underscore name)", s.Running, 3)
			want(t, "waiting (underscore name)", s.Waiting, 1)
			want(t, "arrived (received counter)", s.Arrived, 42)
			wantHist(t, "ttft (underscore name)", s.TTFT, 2, 40)
		}},
		{"tgi.txt", FormatTGI, "", func(t *testing.T, s Sample) {
			want(t, "running (batch size)", s.Running, 16)
			want(t, "waiting (queue)", s.Waiting, 4)
			want(t, "arrived", s.Arrived, 120)
			want(t, "completed", s.Completed, 110)
			wantHist(t, "ttft (queue)", s.TTFT, 5.5, 110)
			wantHist(t, "ttft extra (prefill forward only)", s.TTFTExtra, 2, 40)
			wantHist(t, "tbt", s.TBT, 2.2, 110)
			wantHist(t, "generated per request", s.GenPerRequest, 14080, 110)
			if s.KVUse.OK {
				t.Errorf("TGI exposes no KV use, got %+v", s.KVUse)
			}
		}},
		{"llamacpp.txt", FormatLlamaCPP, "", func(t *testing.T, s Sample) {
			want(t, "running (processing)", s.Running, 2)
			want(t, "waiting (deferred)", s.Waiting, 1)
			want(t, "kv", s.KVUse, 0.125)
			wantHist(t, "tbt (predicted seconds / tokens)", s.TBT, 69.38, 3469)
		}},
	}
	for _, tc := range cases {
		t.Run(string(tc.format)+"/"+tc.file+"/"+tc.served, func(t *testing.T) {
			p, err := NewParser(tc.format, tc.served)
			if err != nil {
				t.Fatal(err)
			}
			s, err := p.Parse(readFixture(t, tc.file))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			tc.check(t, s)
		})
	}
}

func want(t *testing.T, what string, c Counter, v float64) {
	t.Helper()
	if !c.OK || !near(c.V, v) {
		t.Errorf("%s = %+v, want %v", what, c, v)
	}
}

func wantHist(t *testing.T, what string, h Hist, sum, count float64) {
	t.Helper()
	if !h.OK || !near(h.Sum, sum) || !near(h.Count, count) {
		t.Errorf("%s = %+v, want sum %v count %v", what, h, sum, count)
	}
}

func TestParseRepairsAFewBadLines(t *testing.T) {
	p, _ := NewParser(FormatVLLM, "")
	text := string(readFixture(t, "vllm.txt"))
	text = strings.Replace(text, "# TYPE vllm:num_requests_waiting gauge\n",
		"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"9\" 1\n", 1)
	s, err := p.Parse([]byte(text))
	if err != nil {
		t.Fatalf("Parse with one bad line: %v", err)
	}
	if s.Repaired != 1 {
		t.Errorf("Repaired = %d, want 1", s.Repaired)
	}
	want(t, "running after repair", s.Running, 8)
	want(t, "waiting after repair", s.Waiting, 2)

	for name, text := range map[string]string{
		"garbage in wanted names": strings.Repeat("vllm:num_requests_running{{{ not metrics\n", 50),
		"another engine's text":   string(readFixture(t, "sglang.txt")),
		"empty":                   "",
	} {
		if _, err := p.Parse([]byte(text)); !errors.Is(err, ErrMetrics) {
			t.Errorf("Parse(%s) = %v, want ErrMetrics", name, err)
		}
	}
}

func TestParseFormatAndSpec(t *testing.T) {
	if _, err := ParseFormat("triton"); !errors.Is(err, ErrUnknownFormat) {
		t.Errorf("ParseFormat(triton) = %v, want ErrUnknownFormat", err)
	}
	e, err := ParseEngineSpec("name=v1,url=http://127.0.0.1:18101,metrics=vllm,max_running=8,capacity_rps=40", "llama", "r1")
	if err != nil {
		t.Fatal(err)
	}
	if e.Name != "v1" || e.Model != "llama" || e.Region != "r1" || e.Format != FormatVLLM || e.Known.MaxRunning != 8 || e.Known.CapacityRPS != 40 {
		t.Errorf("ParseEngineSpec = %+v", e)
	}
	for _, bad := range []string{"", "name", "name=a,name=b", "name=a,cap=1", "name=a,max_running=x", "name=a,capacity_rps=NaN", "name=a,metrics=foo"} {
		if _, err := ParseEngineSpec(bad, "llama", ""); err == nil {
			t.Errorf("ParseEngineSpec(%q) accepted", bad)
		}
	}
}

func TestEstimatorDeltasAndReset(t *testing.T) {
	e := NewEstimator(Known{DefaultCapacityRPS: 1})
	t0 := time.Unix(1000, 0)
	s := func(done, ttftSum, ttftN, tbtSum, tbtN, run, wait float64) Sample {
		return Sample{
			Completed: Counter{done, true}, Running: Counter{run, true}, Waiting: Counter{wait, true},
			TTFT: Hist{ttftSum, ttftN, true}, TBT: Hist{tbtSum, tbtN, true},
			GenPerRequest: Hist{done * 100, done, true},
		}
	}
	v := e.Update(s(100, 5, 100, 20, 1000, 4, 0), t0)
	if v.HaveRate || v.LoadRPS != 0 {
		t.Errorf("first sample gave a rate: %+v", v)
	}
	// 1 s later: 10 more done, 2 more held → 12 arrivals/s; TTFT mean of the
	// interval (1 s over 10) = 100 ms, not the cumulative 50 ms.
	v = e.Update(s(110, 6, 110, 22, 1100, 5, 1), t0.Add(time.Second))
	if !near(v.LoadRPS, 12) || !near(v.TTFTMs, 100) || !near(v.TBTMs, 20) || !near(v.OutputTokens, 100) {
		t.Errorf("interval values = %+v, want load 12, ttft 100, tbt 20, otok 100", v)
	}
	hits := NewEstimator(Known{})
	hits.Update(Sample{PrefixHits: Counter{70, true}, PrefixQueries: Counter{100, true}}, t0)
	if hv := hits.Update(Sample{PrefixHits: Counter{100, true}, PrefixQueries: Counter{200, true}}, t0.Add(time.Second)); !near(hv.PrefixHitRate, 0.3) {
		t.Errorf("prefix hit ratio %v, want 0.3 (30 hits of 100 queries in the interval)", hv.PrefixHitRate)
	}
	if v.MaxRunning != 5 {
		t.Errorf("MaxRunning learned = %d, want 5 (running while waiting > 0)", v.MaxRunning)
	}
	// No new observations: means repeat.
	v = e.Update(s(110, 6, 110, 22, 1100, 5, 1), t0.Add(2*time.Second))
	if !near(v.TTFTMs, 100) || v.LoadRPS != 0 || v.CounterReset {
		t.Errorf("quiet interval = %+v, want ttft kept at 100, load 0", v)
	}
	// The engine restarted: counters start again from zero.
	v = e.Update(s(3, 0.6, 3, 0.3, 30, 1, 0), t0.Add(3*time.Second))
	if !v.CounterReset {
		t.Fatalf("reset not seen: %+v", v)
	}
	if !near(v.TTFTMs, 200) || !near(v.TBTMs, 10) || !near(v.LoadRPS, 4) {
		t.Errorf("after reset = %+v, want ttft 200 (0.6/3), tbt 10, load 4 (3 done + 1 held)", v)
	}
	if v.CapacityRPS <= 0 || math.IsNaN(v.CapacityRPS) {
		t.Errorf("capacity %v", v.CapacityRPS)
	}
}

func TestEstimatorKnownWins(t *testing.T) {
	e := NewEstimator(Known{CapacityRPS: 40, MaxRunning: 8, BaseLatencyMs: 900, DefaultCapacityRPS: 1})
	v := e.Update(Sample{Running: Counter{20, true}, Waiting: Counter{3, true}}, time.Unix(1, 0))
	if v.CapacityRPS != 40 || v.MaxRunning != 8 || v.BaseLatencyMs != 900 {
		t.Errorf("values = %+v, want the known capacity, max running and base", v)
	}
}
