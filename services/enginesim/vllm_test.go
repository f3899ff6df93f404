package enginesim_test

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/services/enginesim"
)

// TestVLLMMetricsMode checks that an engine in vLLM mode serves vLLM's
// names, labels and types at /metrics, computed from what it served, and
// answers vLLM's /health.
func TestVLLMMetricsMode(t *testing.T) {
	o := fastOpts("v1")
	o.MetricsFormat = enginesim.MetricsVLLM
	e := startEngine(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := post(ctx, http.DefaultClient, e.URL()+"/v1/chat/completions", chatBody(false, 5))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	get := func(path string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.URL()+path, nil)
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return r.StatusCode, string(b)
	}
	if code, _ := get("/health"); code != http.StatusOK {
		t.Errorf("/health = %d, want 200", code)
	}
	_, text := get("/metrics")
	for _, want := range []string{
		"# TYPE vllm:num_requests_running gauge",
		"# TYPE vllm:num_requests_waiting gauge",
		"# TYPE vllm:kv_cache_usage_perc gauge",
		"# TYPE vllm:request_success_total counter",
		`vllm:request_success_total{engine="0",finished_reason="length",model_name="llama"} 1`,
		`vllm:generation_tokens_total{engine="0",model_name="llama"} 5`,
		`vllm:prompt_tokens_total{engine="0",model_name="llama"} 100`,
		"# TYPE vllm:time_to_first_token_seconds histogram",
		`vllm:time_to_first_token_seconds_bucket{engine="0",model_name="llama",le="0.001"}`,
		`vllm:time_to_first_token_seconds_count{engine="0",model_name="llama"} 1`,
		`vllm:inter_token_latency_seconds_count{engine="0",model_name="llama"} 4`,
		`vllm:e2e_request_latency_seconds_count{engine="0",model_name="llama"} 1`,
		`vllm:cache_config_info{block_size="16",enable_prefix_caching="False",engine="0",num_gpu_blocks="`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", text)
	}
}

// TestPrefixCacheHits sends one prompt twice to an engine keeping a prefix
// cache: the second hits every full block, as vLLM's hit counter says, and
// skips their prefill.
func TestPrefixCacheHits(t *testing.T) {
	o := fastOpts("v1")
	o.MetricsFormat, o.KVEvents, o.PrefillMsPerToken, o.KVTokens = enginesim.MetricsVLLM, "tcp://127.0.0.1:0", 0.5, 16*1024
	e := startEngine(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	prompt := strings.Repeat("a shared system prompt ", 30) // 690 bytes: 173 tokens, 10 full blocks
	body := `{"model":"llama","max_tokens":1,"prompt":"` + prompt + `"}`
	took := make([]time.Duration, 2)
	for i := range took {
		start := time.Now()
		resp, err := post(ctx, http.DefaultClient, e.URL()+"/v1/completions", []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		took[i] = time.Since(start)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.URL()+"/metrics", nil)
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	for _, want := range []string{
		`vllm:prefix_cache_hits_total{engine="0",model_name="llama"} 160`,
		`vllm:prefix_cache_queries_total{engine="0",model_name="llama"} 346`,
		`enable_prefix_caching="True"`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// 173 prefilled tokens take 86 ms at 0.5 ms a token, 13 take 7 ms.
	if took[1] >= took[0] {
		t.Errorf("the second request took %s, the first %s: the cached prefix was prefilled again", took[1], took[0])
	}
}

// TestTokenPromptCachedAsGiven: a completion's prompt of token ids is
// cached as those ids, as vLLM caches it (not as the text of its JSON):
// two prompts sharing their first 32 ids share two blocks, and the second
// hits exactly those.
func TestTokenPromptCachedAsGiven(t *testing.T) {
	o := fastOpts("v1")
	o.MetricsFormat, o.KVEvents, o.KVTokens = enginesim.MetricsVLLM, "tcp://127.0.0.1:0", 16*1024
	e := startEngine(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ids := func(tail int) string {
		var b strings.Builder
		for i := range 40 {
			v := 100 + i
			if i >= 32 {
				v = tail + i
			}
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(v))
		}
		return b.String()
	}
	for _, tail := range []int{5000, 9000} {
		resp, err := post(ctx, http.DefaultClient, e.URL()+"/v1/completions", []byte(`{"model":"llama","max_tokens":1,"prompt":[`+ids(tail)+`]}`))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.URL()+"/metrics", nil)
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if want := `vllm:prefix_cache_hits_total{engine="0",model_name="llama"} 32`; !strings.Contains(string(b), want) {
		t.Errorf("/metrics lacks %q:\n%s", want, b)
	}
}
