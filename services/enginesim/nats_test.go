package enginesim_test

import (
	"context"
	"io"
	"math"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/enginesim"
	"github.com/switchyard-dev/switchyard/testenv"
)

// natsRequest sends body to subject and collects reply messages until one
// carries messages.HeaderLast.
func natsRequest(t *testing.T, nc *nats.Conn, subject string, body []byte, timeout time.Duration) []*nats.Msg {
	t.Helper()
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subject, inbox, body); err != nil {
		t.Fatal(err)
	}
	var msgs []*nats.Msg
	deadline := time.Now().Add(timeout)
	for {
		m, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			t.Fatalf("after %d replies: %v", len(msgs), err)
		}
		msgs = append(msgs, m)
		if m.Header.Get(messages.HeaderLast) == "true" {
			return msgs
		}
	}
}

func TestNATSRequestReply(t *testing.T) {
	env := testenv.StartNATS(t)
	o := fastOpts("e-nats")
	o.Conn = env.Dial(t, "e-nats")
	o.NoSignals = true
	o.OutputTokens = 20
	e := startEngine(t, o)
	if e.InferSubject() != "sy.infer.llama.e-nats" {
		t.Fatalf("InferSubject %q", e.InferSubject())
	}
	client := env.Dial(t, "router")

	msgs := natsRequest(t, client, e.InferSubject(), chatBody(true, 0), 5*time.Second)
	if len(msgs) < 5 {
		t.Fatalf("%d reply messages for a streamed request, want several", len(msgs))
	}
	var text strings.Builder
	for i, m := range msgs {
		if m.Header.Get(messages.HeaderStatus) != "200" || m.Header.Get(messages.NATSHeaderEngine) != "e-nats" {
			t.Fatalf("reply %d headers %v", i, m.Header)
		}
		if last := m.Header.Get(messages.HeaderLast) == "true"; last != (i == len(msgs)-1) {
			t.Fatalf("reply %d of %d has %s=%v", i, len(msgs), messages.HeaderLast, last)
		}
		c := decodeChunk(t, m.Data)
		if c.Object != "chat.completion.chunk" {
			t.Fatalf("reply %d: %s", i, m.Data)
		}
		text.WriteString(c.Choices[0].Delta.Content)
	}
	final := decodeChunk(t, msgs[len(msgs)-1].Data)
	if final.Choices[0].FinishReason == nil || *final.Choices[0].FinishReason != "stop" || final.Usage == nil || final.Usage.CompletionTokens != 20 {
		t.Fatalf("last reply %s", msgs[len(msgs)-1].Data)
	}
	if n := len(strings.Fields(text.String())); n != 20 {
		t.Fatalf("streamed %d words, want 20", n)
	}

	msgs = natsRequest(t, client, e.InferSubject(), []byte(`{"prompt":"hello","max_tokens":3}`), 5*time.Second)
	if len(msgs) != 1 || msgs[0].Header.Get(messages.HeaderStatus) != "200" {
		t.Fatalf("non-streamed request: %d replies", len(msgs))
	}
	if c := decodeChunk(t, msgs[0].Data); c.Object != "text_completion" || c.Usage.CompletionTokens != 3 {
		t.Fatalf("non-streamed reply %s", msgs[0].Data)
	}

	msgs = natsRequest(t, client, e.InferSubject(), []byte(`{"model":"gpt-x","prompt":"hello"}`), 5*time.Second)
	if len(msgs) != 1 || msgs[0].Header.Get(messages.HeaderStatus) != "404" || decodeChunk(t, msgs[0].Data).Error == nil {
		t.Fatalf("wrong model: status %q body %s", msgs[0].Header.Get(messages.HeaderStatus), msgs[0].Data)
	}

	if err := e.SetFailure(enginesim.Failure{ErrorRate: 1}); err != nil {
		t.Fatal(err)
	}
	msgs = natsRequest(t, client, e.InferSubject(), chatBody(true, 0), 5*time.Second)
	if c := decodeChunk(t, msgs[0].Data); len(msgs) != 1 || msgs[0].Header.Get(messages.HeaderStatus) != "500" || c.Error == nil {
		t.Fatalf("injected error over NATS: %d replies, status %q, body %s", len(msgs), msgs[0].Header.Get(messages.HeaderStatus), msgs[0].Data)
	}

	// A crashed engine drops its subscription: requesters see no responders.
	if err := e.SetFailure(enginesim.Failure{Crashed: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Request(e.InferSubject(), chatBody(false, 1), time.Second); err != nats.ErrNoResponders {
		t.Fatalf("request to a crashed engine: %v, want no responders", err)
	}
	if err := e.SetFailure(enginesim.Failure{}); err != nil {
		t.Fatal(err)
	}
	if msgs := natsRequest(t, client, e.InferSubject(), chatBody(false, 2), 5*time.Second); msgs[0].Header.Get(messages.HeaderStatus) != "200" {
		t.Fatalf("after recovery: %v", msgs[0].Header)
	}
}

func TestSignalsFromLiveState(t *testing.T) {
	env := testenv.StartNATS(t)
	o := fastOpts("e-sig")
	o.PrefillMsPerToken = 0.2 // a 20 ms prefill for the 100-token prompt
	o.Conn = env.Dial(t, "e-sig")
	o.SignalInterval = 50 * time.Millisecond
	e := startEngine(t, o)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := env.JS.OrderedConsumer(ctx, env.Names.SignalStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"sy.signal.llama.e-sig"}})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var sigs []messages.EngineSignal
	cc, err := cons.Consume(func(m jetstream.Msg) {
		var s messages.EngineSignal
		if err := messages.DecodeInto(m.Data(), &s); err != nil {
			t.Errorf("undecodable signal: %v", err)
			return
		}
		mu.Lock()
		sigs = append(sigs, s)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	latest := func() (messages.EngineSignal, int) {
		mu.Lock()
		defer mu.Unlock()
		if len(sigs) == 0 {
			return messages.EngineSignal{}, 0
		}
		return sigs[len(sigs)-1], len(sigs)
	}

	// Sequential requests on an idle engine: every TTFT is one prefill. Two
	// warm-up requests first, so that a cold start does not skew the mean.
	var before enginesim.Stats
	for i := range 10 {
		if i == 2 {
			before = e.Stats()
		}
		resp, err := post(ctx, http.DefaultClient, e.URL()+"/v1/chat/completions", chatBody(false, 0))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	st := e.Stats()
	_, n0 := latest()
	testenv.WaitFor(t, 5*time.Second, "a signal after the load", func() bool { _, n := latest(); return n > n0 })
	s, _ := latest()
	// The engine's own mean TTFT over these 8 requests.
	sum := func(x enginesim.Stats) float64 { return float64(x.MeanTTFT) * float64(x.FirstTokens) }
	measured := (sum(st) - sum(before)) / float64(st.FirstTokens-before.FirstTokens) / float64(time.Millisecond)
	// The signal holds the mean over its last 50 ms interval (here the last
	// request or two), the reference is the mean over all eight: on a busy
	// machine single requests jitter by a few ms, hence 20%.
	if math.Abs(s.TTFTMs-measured)/measured > 0.2 || s.TTFTMs < 20 {
		t.Fatalf("signal TTFT %.2f ms, engine measured %.2f ms: want within 20%% (and >= the 20 ms prefill)", s.TTFTMs, measured)
	}
	// One request at a time: TBT(1) = 10 ms, give or take timer lateness
	// (steps are scheduled from the ideal end of the previous one).
	if s.TBTMs < 9.5 || s.TBTMs > 20 { // timers run late on a loaded machine, never early
		t.Fatalf("signal TBT %.2f ms, want about 10 ms (engine measured %s overall)", s.TBTMs, st.MeanTBT)
	}
	if s.CapacityRPS != e.Capacity() || s.Health != 1 || s.Replicas != 1 || s.OutputTokens != 10 || s.Region != "r1" {
		t.Fatalf("signal %+v", s)
	}
	want := []messages.Transport{{Kind: "http", Address: e.URL()}, {Kind: "nats", Address: "sy.infer.llama.e-sig"}}
	if len(s.Transports) != 2 || s.Transports[0] != want[0] || s.Transports[1] != want[1] {
		t.Fatalf("transports %+v, want %+v", s.Transports, want)
	}
	mu.Lock()
	for i := 1; i < len(sigs); i++ {
		if sigs[i].Seq != sigs[i-1].Seq+1 {
			t.Errorf("seq %d -> %d", sigs[i-1].Seq, sigs[i].Seq)
		}
	}
	sawLoad := false
	for _, s := range sigs {
		sawLoad = sawLoad || s.LoadRPS > 0
	}
	mu.Unlock()
	if !sawLoad {
		t.Error("no signal reported a load")
	}

	// Queue, running and KV use follow live state; health and capacity follow failure injection.
	if err := e.SetFailure(enginesim.Failure{CapacityFactor: 0.1, ErrorRate: 0.25}); err != nil {
		t.Fatal(err)
	}
	lctx, lcancel := context.WithCancel(ctx)
	defer lcancel()
	for range 8 {
		go func() {
			resp, err := post(lctx, http.DefaultClient, e.URL()+"/v1/chat/completions", chatBody(true, 0))
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	testenv.WaitFor(t, 10*time.Second, "a signal showing a full batch, a queue and the failure", func() bool {
		s, _ := latest()
		return s.Running == 4 && s.MaxRunning == o.MaxBatch && s.Queue > 0 && s.KVUse > 0 && s.Health == 0.75 &&
			math.Abs(s.CapacityRPS-enginesim.Capacity(o)*0.1) < 1e-9
	})
	lcancel()
	if err := e.SetFailure(enginesim.Failure{Hang: true}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "health 0 while hanging", func() bool { s, _ := latest(); return s.Health == 0 })
}

func TestCloseLeavesNoGoroutines(t *testing.T) {
	env := testenv.StartNATS(t)
	nc := env.Dial(t, "e-leak")
	client := env.Dial(t, "router")
	httpClient := &http.Client{Transport: &http.Transport{}}
	// A connection's first request starts its reply subscription, which stays
	// for the connection's life (the signal publisher's JetStream publishes
	// are requests on nc).
	for _, c := range []*nats.Conn{nc, client} {
		_, _ = c.Request("warm-up", nil, time.Millisecond)
	}
	base := runtime.NumGoroutine()
	baseStacks := make([]byte, 1<<20)
	baseStacks = baseStacks[:runtime.Stack(baseStacks, true)]

	o := fastOpts("e-leak")
	o.Conn = nc
	o.AdminListen = "127.0.0.1:0"
	o.SignalInterval = 20 * time.Millisecond
	e, err := enginesim.New(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// In-flight work of every kind when Close comes: HTTP and NATS streams, a hang.
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			resp, err := post(ctx, httpClient, e.URL()+"/v1/chat/completions", chatBody(true, 0))
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		go func() {
			defer wg.Done()
			_, _ = client.Request(e.InferSubject(), chatBody(false, 0), 2*time.Second)
		}()
	}
	testenv.WaitFor(t, 5*time.Second, "requests running", func() bool { return e.Stats().Running > 0 })
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	httpClient.CloseIdleConnections()
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := e.Start(context.Background()); err == nil {
		t.Fatal("Start after Close succeeded")
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after Close, %d before Start:\n%s\n\nBEFORE:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)], baseStacks)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRunStopsWithContext(t *testing.T) {
	e, err := enginesim.New(fastOpts("e-run"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	testenv.WaitFor(t, 5*time.Second, "serving", func() bool {
		if e.URL() == "" {
			return false
		}
		resp, err := http.Get(e.URL() + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
