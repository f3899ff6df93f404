package enginesim_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/enginesim"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestNewValidates: New and Validate refuse each bad field, naming it, with
// an error that is ErrOptions.
func TestNewValidates(t *testing.T) {
	base := fastOpts("e1")
	cases := []struct {
		mut  func(o *enginesim.Options)
		want string
	}{
		{func(o *enginesim.Options) { o.Name = "" }, "Name"},
		{func(o *enginesim.Options) { o.Model = "a b" }, "Model"},
		{func(o *enginesim.Options) { o.ServedModel = "x\ty" }, "ServedModel"},
		{func(o *enginesim.Options) { o.Region = "r 1" }, "Region"},
		{func(o *enginesim.Options) { o.MaxBatch = -1 }, "MaxBatch is -1"},
		{func(o *enginesim.Options) { o.BaseTBTMs = math.NaN() }, "BaseTBTMs is NaN"},
		{func(o *enginesim.Options) { o.TimeScale = -1 }, "TimeScale is -1"},
		{func(o *enginesim.Options) { o.KVTokens = 10 }, "KVTokens is 10"},
		{func(o *enginesim.Options) { o.Failure.ErrorRate = 1.5 }, "Failure.ErrorRate is 1.5"},
		{func(o *enginesim.Options) { o.NATSQueue = "q.x" }, "NATSQueue"},
		{func(o *enginesim.Options) { o.NATSTimeout = -time.Second }, "NATSTimeout is -1s"},
		{func(o *enginesim.Options) { o.SignalInterval = -time.Second }, "SignalInterval is -1s"},
		{func(o *enginesim.Options) { o.MetricsFormat = "tgi" }, "MetricsFormat"},
	}
	if err := base.Validate(); err != nil {
		t.Fatalf("Validate of good options: %v", err)
	}
	for _, c := range cases {
		o := base
		c.mut(&o)
		for name, err := range map[string]error{"Validate": o.Validate(), "New": func() error { _, err := enginesim.New(o); return err }()} {
			if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, enginesim.ErrOptions) {
				t.Errorf("%s with bad %s: %v, want an ErrOptions naming it", name, c.want, err)
			}
		}
	}
}

func TestCapacityFormula(t *testing.T) {
	o := fastOpts("e1")
	// B=4, p=100·0.02=2 ms, T=10, TBT(4)=10+0.5·3=11.5 ms: 1000·4/(4·2+9·11.5) = 4000/111.5.
	if got, want := enginesim.Capacity(o), 4000/111.5; math.Abs(got-want) > 1e-9 {
		t.Fatalf("Capacity = %v, want %v", got, want)
	}
	o.TimeScale = 0.5
	if got, want := enginesim.Capacity(o), 2*4000/111.5; math.Abs(got-want) > 1e-9 {
		t.Fatalf("Capacity at time scale 0.5 = %v, want %v", got, want)
	}
	// The KV cache bounds the batch: 330 tokens hold 3 requests of 110.
	o = fastOpts("e1")
	o.KVTokens = 330
	if got, want := enginesim.Capacity(o), 3000/(3*2+9*11.0); math.Abs(got-want) > 1e-9 {
		t.Fatalf("KV-bound Capacity = %v, want %v", got, want)
	}
	if got := enginesim.Capacity(enginesim.Options{}); got < 12.9 || got > 13.1 {
		t.Fatalf("default Capacity = %v, want about 13", got)
	}
	b, err := enginesim.BatchForCapacity(enginesim.Options{OutputTokens: 32}, 100)
	if err != nil {
		t.Fatal(err)
	}
	if c := enginesim.Capacity(enginesim.Options{OutputTokens: 32, MaxBatch: b}); c < 100 {
		t.Fatalf("BatchForCapacity gave %d with capacity %v < 100", b, c)
	}
	t.Logf("100 req/s with 32 output tokens needs max batch %d", b)
	if c := enginesim.Capacity(enginesim.Options{OutputTokens: 32, MaxBatch: b - 1}); c >= 100 {
		t.Fatalf("BatchForCapacity gave %d but %d already reaches 100 (%v)", b, b-1, c)
	}
	if _, err := enginesim.BatchForCapacity(enginesim.Options{}, 1e6); err == nil {
		t.Fatal("BatchForCapacity(1e6 req/s) succeeded")
	}
}

func TestStreamingChat(t *testing.T) {
	o := fastOpts("e-stream")
	o.OutputTokens = 30
	e := startEngine(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	resp, err := post(ctx, http.DefaultClient, e.URL()+"/v1/chat/completions", chatBody(true, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get(messages.NATSHeaderEngine) != "e-stream" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, headers %v", resp.StatusCode, resp.Header)
	}
	evs := readSSE(t, resp.Body)
	if len(evs) < 10 {
		t.Fatalf("%d events, want one per token or a few", len(evs))
	}
	if evs[len(evs)-1].data != "[DONE]" {
		t.Fatalf("last event %q, want [DONE]", evs[len(evs)-1].data)
	}
	first, last := evs[0].at.Sub(start), evs[len(evs)-1].at.Sub(start)
	if first > last/4 {
		t.Fatalf("first chunk after %s, last after %s: the first should arrive well before the last", first, last)
	}
	if last < 29*10*time.Millisecond {
		t.Fatalf("30 tokens at >= 10 ms TBT streamed in %s", last)
	}
	var text strings.Builder
	var finish string
	for i, ev := range evs[:len(evs)-1] {
		c := decodeChunk(t, []byte(ev.data))
		if c.Object != "chat.completion.chunk" || c.Model != "llama" || len(c.Choices) != 1 {
			t.Fatalf("chunk %d: %s", i, ev.data)
		}
		if i == 0 && c.Choices[0].Delta.Role != "assistant" {
			t.Fatalf("first chunk has no assistant role: %s", ev.data)
		}
		text.WriteString(c.Choices[0].Delta.Content)
		if c.Choices[0].FinishReason != nil {
			finish = *c.Choices[0].FinishReason
		}
	}
	if finish != "stop" || len(strings.Fields(text.String())) != 30 {
		t.Fatalf("finish %q, text %q: want stop and 30 words", finish, text.String())
	}
}

func TestNonStreamingAndEndpoints(t *testing.T) {
	e := startEngine(t, fastOpts("e-plain"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := post(ctx, http.DefaultClient, e.URL()+"/v1/chat/completions", chatBody(false, 4))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	c := decodeChunk(t, body)
	if resp.StatusCode != 200 || c.Object != "chat.completion" || c.Choices[0].Message.Role != "assistant" ||
		c.Usage == nil || c.Usage.CompletionTokens != 4 || c.Usage.PromptTokens != 100 || c.Usage.TotalTokens != 104 ||
		*c.Choices[0].FinishReason != "length" || resp.Header.Get(messages.NATSHeaderEngine) != "e-plain" {
		t.Fatalf("status %d body %s", resp.StatusCode, body)
	}

	resp, err = post(ctx, http.DefaultClient, e.URL()+"/v1/completions", []byte(`{"model":"llama","prompt":"hello world, how are you"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	c = decodeChunk(t, body)
	if resp.StatusCode != 200 || c.Object != "text_completion" || c.Usage.CompletionTokens != 10 || c.Usage.PromptTokens != 6 ||
		c.Choices[0].Text != "The quick brown fox jumps over the lazy dog. The " || *c.Choices[0].FinishReason != "stop" {
		t.Fatalf("completions: status %d body %s", resp.StatusCode, body)
	}

	for _, bad := range []struct {
		path, body string
		status     int
		code       string
	}{
		{"/v1/chat/completions", `{"model":"other","messages":[{"role":"user","content":"x"}]}`, 404, "model_not_found"},
		{"/v1/chat/completions", `{"messages":[]}`, 400, "invalid_request"},
		{"/v1/completions", `{not json`, 400, "invalid_request"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":0}`, 400, "invalid_request"},
	} {
		resp, err := post(ctx, http.DefaultClient, e.URL()+bad.path, []byte(bad.body))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if c := decodeChunk(t, body); resp.StatusCode != bad.status || c.Error == nil || c.Error.Code != bad.code {
			t.Errorf("%s %s: status %d body %s, want %d %s", bad.path, bad.body, resp.StatusCode, body, bad.status, bad.code)
		}
	}

	for path, want := range map[string]string{"/v1/models": `"id":"llama"`, "/healthz": `"status":"ok"`,
		"/metrics": "switchyard_enginesim_ttft_seconds_count"} {
		resp, err := http.Get(e.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %d %s, want it to contain %s", path, resp.StatusCode, body, want)
		}
	}
	resp, err = http.Get(e.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{"switchyard_enginesim_queue_depth", "switchyard_enginesim_running_requests", "switchyard_enginesim_tbt_seconds_bucket", `engine="e-plain"`} {
		if !strings.Contains(string(body), m) {
			t.Errorf("metrics lack %s", m)
		}
	}
}

func TestQueueingDelaysLaterRequests(t *testing.T) {
	o := fastOpts("e-queue")
	o.MaxBatch = 2
	e := startEngine(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ttfts := make([]time.Duration, 6)
	var wg sync.WaitGroup
	for i := range ttfts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, ttfts[i] = streamed(t, ctx, http.DefaultClient, e.URL())
		}()
	}
	// While the batch is full the rest wait in the queue.
	testenv.WaitFor(t, 5*time.Second, "4 requests queued behind a batch of 2", func() bool {
		s := e.Stats()
		return s.Queue == 4 && s.Running == 2
	})
	wg.Wait()
	sort.Slice(ttfts, func(i, j int) bool { return ttfts[i] < ttfts[j] })
	// One request: prefill 2 ms + 9 decode steps of 10.5 ms ≈ 96 ms.
	service := 90 * time.Millisecond
	if ttfts[1] > 50*time.Millisecond {
		t.Errorf("first two TTFTs %v, want about the 2-4 ms prefill", ttfts[:2])
	}
	if ttfts[2] < service || ttfts[4] < 2*service {
		t.Errorf("TTFTs %v: requests 3-4 should wait one service time (%s) and 5-6 two", ttfts, service)
	}
}

func TestThroughputUnderOverloadMatchesCapacity(t *testing.T) {
	o := fastOpts("e-load")
	o.MaxBatch = 8
	o.BaseTBTMs, o.TBTGrowthMs = 8, 1 // TBT(8) = 15 ms
	capacity := enginesim.Capacity(o) // 1000·8/(8·2 + 9·15) ≈ 53 req/s
	e := startEngine(t, o)
	if e.Capacity() != capacity {
		t.Fatalf("engine Capacity %v, package Capacity %v", e.Capacity(), capacity)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	var done []time.Time
	var wg sync.WaitGroup
	for range 24 { // three times the batch: always a queue
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				resp, err := post(ctx, client, e.URL()+"/v1/chat/completions", chatBody(false, 0))
				if err != nil {
					return
				}
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 {
					return
				}
				mu.Lock()
				done = append(done, time.Now())
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	sort.Slice(done, func(i, j int) bool { return done[i].Before(done[j]) })
	// Skip the first batch (it started without a queue) and measure from its end.
	k := o.MaxBatch
	if len(done) < 4*k {
		t.Fatalf("only %d completions", len(done))
	}
	rate := float64(len(done)-k) / done[len(done)-1].Sub(done[k-1]).Seconds()
	t.Logf("measured %.1f req/s over %d completions; Capacity() = %.1f req/s", rate, len(done), capacity)
	if math.Abs(rate-capacity)/capacity > 0.15 {
		t.Fatalf("throughput %.1f req/s, Capacity() %.1f: off by more than 15%%", rate, capacity)
	}
}

func TestErrorRateInjection(t *testing.T) {
	o := fastOpts("e-err")
	o.OutputTokens, o.BaseTBTMs = 1, 1
	o.MaxBatch = 32
	o.Failure = enginesim.Failure{ErrorRate: 0.3}
	e := startEngine(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const n = 300
	var errs, oks atomic.Int64
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			resp, err := post(ctx, http.DefaultClient, e.URL()+"/v1/completions", []byte(`{"prompt":"hi"}`))
			if err != nil {
				t.Error(err)
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch resp.StatusCode {
			case 200:
				oks.Add(1)
			case 500:
				if c := decodeChunk(t, body); c.Error == nil || c.Error.Type != "server_error" {
					t.Errorf("500 without an OpenAI error body: %s", body)
				}
				errs.Add(1)
			default:
				t.Errorf("status %d", resp.StatusCode)
			}
		}()
	}
	wg.Wait()
	frac := float64(errs.Load()) / n
	if oks.Load()+errs.Load() != n || frac < 0.22 || frac > 0.38 {
		t.Fatalf("%d errors and %d successes of %d: error fraction %.2f, want about 0.3", errs.Load(), oks.Load(), n, frac)
	}
	if s := e.Stats(); s.Errors != uint64(errs.Load()) || s.Arrived != n {
		t.Fatalf("stats %+v", s)
	}
}

func TestHangBlocksUntilClientGivesUp(t *testing.T) {
	o := fastOpts("e-hang")
	e := startEngine(t, o)
	if err := e.SetFailure(enginesim.Failure{Hang: true}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	resp, err := post(ctx, http.DefaultClient, e.URL()+"/v1/chat/completions", chatBody(true, 0))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("hanging engine answered with status %d", resp.StatusCode)
	}
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("got %v after %s, want the client's deadline after 300ms", err, time.Since(start))
	}
	// Clearing the failure makes it answer again.
	if err := e.SetFailure(enginesim.Failure{}); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if evs, _ := streamed(t, ctx2, http.DefaultClient, e.URL()); len(evs) == 0 {
		t.Fatal("no answer after the hang was cleared")
	}
}

func TestAddedLatency(t *testing.T) {
	o := fastOpts("e-slow")
	o.Failure = enginesim.Failure{AddedLatencyMs: 150}
	e := startEngine(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, ttft := streamed(t, ctx, http.DefaultClient, e.URL())
	if ttft < 150*time.Millisecond || ttft > 400*time.Millisecond {
		t.Fatalf("TTFT %s with 150 ms added latency", ttft)
	}
}

func TestCrashAfterAndRecover(t *testing.T) {
	o := fastOpts("e-crash")
	o.AdminListen = "127.0.0.1:0"
	o.Failure = enginesim.Failure{CrashAfter: 3}
	e := startEngine(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for i := range 3 {
		resp, err := post(ctx, client, e.URL()+"/v1/chat/completions", chatBody(false, 2))
		if err != nil {
			t.Fatalf("request %d before the crash: %v", i+1, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d before the crash: status %d", i+1, resp.StatusCode)
		}
	}
	for i := range 2 {
		resp, err := post(ctx, client, e.URL()+"/v1/chat/completions", chatBody(false, 2))
		if err == nil {
			resp.Body.Close()
			t.Fatalf("request %d after crash_after 3 got status %d, want a connection error", 4+i, resp.StatusCode)
		}
	}
	if f := e.Failure(); !f.Crashed {
		t.Fatalf("failure after the crash: %+v", f)
	}
	// Recover through the admin endpoint.
	resp, err := post(ctx, client, "http://"+adminAddr(t, e)+"/admin/failure", []byte(`{"crashed":false,"crash_after":0}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"crashed":false`) {
		t.Fatalf("admin recover: %d %s", resp.StatusCode, body)
	}
	resp, err = post(ctx, client, e.URL()+"/v1/chat/completions", chatBody(false, 2))
	if err != nil {
		t.Fatalf("request after recovery: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("request after recovery: status %d", resp.StatusCode)
	}
}

// adminAddr is the host:port of the admin listener, which stays up through a crash.
func adminAddr(t *testing.T, e *enginesim.Engine) string {
	t.Helper()
	u := e.AdminURL()
	if u == "" {
		t.Fatal("no admin URL")
	}
	return strings.TrimPrefix(u, "http://")
}

func TestAdminFailureEndpoint(t *testing.T) {
	opts := fastOpts("e-admin")
	opts.AdminListen = "127.0.0.1:0"
	e := startEngine(t, opts)
	admin := "http://" + adminAddr(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Failure injection is the admin listener's alone: on the inference
	// port, any client of the engine could switch it off.
	for _, m := range []string{http.MethodGet, http.MethodPost} {
		req, _ := http.NewRequestWithContext(ctx, m, e.URL()+"/admin/failure", strings.NewReader(`{"error_rate":1}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("%s /admin/failure on the inference port: %d, want 404", m, resp.StatusCode)
		}
	}
	if f := e.Failure(); f.ErrorRate != 0 {
		t.Fatalf("the inference port's POST injected %+v", f)
	}
	resp, err := post(ctx, http.DefaultClient, admin+"/admin/failure", []byte(`{"error_rate":1,"capacity_factor":0.5}`))
	if err != nil {
		t.Fatal(err)
	}
	var f enginesim.Failure
	_ = json.NewDecoder(resp.Body).Decode(&f)
	resp.Body.Close()
	if resp.StatusCode != 200 || f.ErrorRate != 1 || f.CapacityFactor != 0.5 {
		t.Fatalf("admin set: %d %+v", resp.StatusCode, f)
	}
	if got, want := e.Capacity(), enginesim.Capacity(fastOpts("x"))/2; math.Abs(got-want) > 1e-9 {
		t.Fatalf("Capacity after factor 0.5 = %v, want %v", got, want)
	}
	resp, err = post(ctx, http.DefaultClient, e.URL()+"/v1/chat/completions", chatBody(false, 0))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 500 {
		t.Fatalf("status %d with error_rate 1", resp.StatusCode)
	}
	// A partial update keeps the other fields.
	resp, err = post(ctx, http.DefaultClient, admin+"/admin/failure", []byte(`{"error_rate":0}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if f := e.Failure(); f.ErrorRate != 0 || f.CapacityFactor != 0.5 {
		t.Fatalf("after a partial update: %+v", f)
	}
	for _, bad := range []string{`{"error_rate":2}`, `{"nonsense":1}`, `[`} {
		resp, err := post(ctx, http.DefaultClient, admin+"/admin/failure", []byte(bad))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("admin %s: %d %s, want 400", bad, resp.StatusCode, body)
		}
	}
}

func TestClientDisconnectFreesSlot(t *testing.T) {
	o := fastOpts("e-cancel")
	o.MaxBatch = 1
	o.OutputTokens = 1000 // ten seconds of tokens
	o.KVTokens = 10000
	e := startEngine(t, o)
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := post(ctx, http.DefaultClient, e.URL()+"/v1/chat/completions", chatBody(true, 0))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Second, "request running", func() bool { return e.Stats().Running == 1 })
	cancel()
	resp.Body.Close()
	testenv.WaitFor(t, 2*time.Second, "slot freed after the client left", func() bool { return e.Stats().Running == 0 })
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	resp, err = post(ctx2, http.DefaultClient, e.URL()+"/v1/chat/completions", chatBody(false, 3))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("next request: status %d", resp.StatusCode)
	}
}
