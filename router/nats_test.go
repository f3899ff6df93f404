package router_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/router/upstream"
	"github.com/switchyard-dev/switchyard/services/enginesim"
	"github.com/switchyard-dev/switchyard/testenv"
)

// natsRequest sends body to subject with headers and collects the reply
// messages until one carries messages.HeaderLast.
func natsRequest(t *testing.T, nc *nats.Conn, subject, body string, hdr map[string]string) []*nats.Msg {
	t.Helper()
	out, err := natsTry(t, nc, subject, body, hdr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// natsTry is natsRequest returning, rather than failing on, an error from
// the replies — ErrNoResponders while no router has subscribed yet — for
// use in a condition that is polled.
func natsTry(t *testing.T, nc *nats.Conn, subject, body string, hdr map[string]string) ([]*nats.Msg, error) {
	t.Helper()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	m := nats.NewMsg(subject)
	m.Reply = inbox
	m.Data = []byte(body)
	for k, v := range hdr {
		m.Header.Set(k, v)
	}
	if err := nc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	var out []*nats.Msg
	for {
		r, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			return out, fmt.Errorf("after %d replies: %w", len(out), err)
		}
		out = append(out, r)
		if r.Header.Get(messages.HeaderLast) == "true" {
			return out, nil
		}
	}
}

// startSimEngine starts an enginesim engine serving HTTP and NATS and
// publishing its signals.
func startSimEngine(t *testing.T, env *testenv.NATS, name string) *enginesim.Engine {
	t.Helper()
	return testenv.StartEngine(t, enginesim.Options{Name: name, Model: "llama", MaxBatch: 8, BaseTBTMs: 5, TBTGrowthMs: 0.1,
		OutputTokens: 8, PromptTokens: 16, Seed: 1, Conn: env.Dial(t, name), SignalInterval: 100 * time.Millisecond})
}

func TestNATSFrontAndTransportWithEngineSim(t *testing.T) {
	env := testenv.StartNATS(t)
	startSimEngine(t, env, "s1")
	svc := runService(t, router.ServiceOptions{Conn: env.Dial(t, "router"), Cluster: "A", Router: "r1", PreferNATS: true})
	testenv.WaitFor(t, 5*time.Second, "engine signal with a NATS subject", func() bool {
		ep, ok := svc.Signals().Endpoints("llama", "s1")
		return ok && ep.Subject == "sy.infer.llama.s1" && ep.URL != ""
	})
	testenv.WaitFor(t, 5*time.Second, "local-policy table", func() bool {
		tb, _, ok := svc.Store().Table("llama")
		return ok && tb.Slots() > 0
	})
	client := env.Dial(t, "client")
	subject := "sy.req.A.llama"

	// Streamed over the NATS front, forwarded over NATS: several messages,
	// the last one marked, each a chat chunk.
	msgs := natsRequest(t, client, subject, chatJSON("llama", true, "hello"), map[string]string{"x-session-id": "s-1"})
	if len(msgs) < 3 {
		t.Fatalf("%d reply messages for a streamed request, want several", len(msgs))
	}
	for i, m := range msgs {
		if m.Header.Get(messages.HeaderStatus) != "200" || m.Header.Get("x-switchyard-engine") != "s1" {
			t.Fatalf("reply %d headers %v", i, m.Header)
		}
		var c struct {
			Object string `json:"object"`
		}
		if err := json.Unmarshal(m.Data, &c); err != nil || c.Object != "chat.completion.chunk" {
			t.Fatalf("reply %d: %q (%v)", i, m.Data, err)
		}
	}
	// Not streamed: one message.
	msgs = natsRequest(t, client, subject, chatJSON("llama", false, "hello"), nil)
	if len(msgs) != 1 || msgs[0].Header.Get(messages.HeaderStatus) != "200" || !strings.Contains(string(msgs[0].Data), `"chat.completion"`) {
		t.Fatalf("non-streamed reply: %d messages, first %v %q", len(msgs), msgs[0].Header, msgs[0].Data)
	}
	// Errors: OpenAI error JSON with the status header, in one final message.
	for _, tc := range []struct {
		subject, body string
		status        string
	}{
		{"sy.req.A.nope", chatJSON("nope", false, "x"), "404"},
		{subject, `{"model":`, "400"},
		{subject, chatJSON("other", false, "x"), "400"},
	} {
		msgs := natsRequest(t, client, tc.subject, tc.body, nil)
		var e struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
			} `json:"error"`
		}
		if len(msgs) != 1 || msgs[0].Header.Get(messages.HeaderStatus) != tc.status ||
			json.Unmarshal(msgs[0].Data, &e) != nil || e.Error.Message == "" || e.Error.Type == "" {
			t.Fatalf("%s %s: %d messages, headers %v body %q; want one %s error", tc.subject, tc.body, len(msgs),
				msgs[0].Header, msgs[0].Data, tc.status)
		}
	}

	// The HTTP front forwarding over NATS renders SSE, event by event.
	req, _ := http.NewRequest(http.MethodPost, "http://"+svc.Addr()+"/v1/chat/completions",
		strings.NewReader(chatJSON("llama", true, "hello")))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("HTTP over NATS: status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			events = append(events, d)
		}
	}
	if len(events) < 3 || events[len(events)-1] != "[DONE]" || !strings.Contains(events[0], "chat.completion.chunk") {
		t.Fatalf("SSE events over NATS: %q", events)
	}
}

func TestNATSFrontNoEngine(t *testing.T) {
	env := testenv.StartNATS(t)
	pub := publishSignals(t, env.Dial(t, "engines"), env.Names, 100*time.Millisecond,
		fakeSignal{model: "m", engine: "e1", capacity: 10, health: 0, url: "http://127.0.0.1:9"})
	_ = pub
	svc := runService(t, router.ServiceOptions{Conn: env.Dial(t, "router"), Cluster: "A", Router: "r1"})
	testenv.WaitFor(t, 5*time.Second, "model known", func() bool {
		_, _, ok := svc.Store().Table("m")
		return ok
	})
	msgs := natsRequest(t, env.Dial(t, "client"), "sy.req.A.m", chatJSON("m", false, "x"), nil)
	if len(msgs) != 1 || msgs[0].Header.Get(messages.HeaderStatus) != "503" || msgs[0].Header.Get("Retry-After") != "1" {
		t.Fatalf("no engine: %d messages, headers %v body %q", len(msgs), msgs[0].Header, msgs[0].Data)
	}
}

func TestNATSFrontToHTTPEngineStreams(t *testing.T) {
	env := testenv.StartNATS(t)
	e1 := newHTTPEngine(t, "e1")
	publishSignals(t, env.Dial(t, "engines"), env.Names, 100*time.Millisecond,
		fakeSignal{model: "m", engine: "e1", capacity: 10, health: 1, url: e1.srv.URL})
	svc := runService(t, router.ServiceOptions{Conn: env.Dial(t, "router"), Cluster: "A", Router: "r1"})
	testenv.WaitFor(t, 5*time.Second, "routable", func() bool {
		tb, _, ok := svc.Store().Table("m")
		return ok && tb.Slots() > 0
	})
	msgs := natsRequest(t, env.Dial(t, "client"), "sy.req.A.m", chatJSON("m", true, "x"), nil)
	var got []string
	for _, m := range msgs {
		got = append(got, string(m.Data))
	}
	want := []string{`{"i":0,"engine":"e1"}`, `{"i":1,"engine":"e1"}`, `{"i":2,"engine":"e1"}`}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("SSE relayed as messages %q, want %q", got, want)
	}
}

func TestReportsPublished(t *testing.T) {
	env := testenv.StartNATS(t)
	e1, e2 := newHTTPEngine(t, "e1"), newHTTPEngine(t, "e2")
	publishSignals(t, env.Dial(t, "engines"), env.Names, 100*time.Millisecond,
		fakeSignal{model: "m", engine: "e1", capacity: 10, health: 1, url: e1.srv.URL},
		fakeSignal{model: "m", engine: "e2", capacity: 10, health: 1, url: e2.srv.URL})
	nc := env.Dial(t, "reports")
	var mu sync.Mutex
	var reports []messages.RouterReport
	var bad []error
	sub, err := nc.Subscribe(env.Names.ReportFilter(), func(m *nats.Msg) {
		var r messages.RouterReport
		mu.Lock()
		defer mu.Unlock()
		if err := messages.DecodeInto(m.Data, &r); err != nil {
			bad = append(bad, err)
			return
		}
		if want := fmt.Sprintf(`^%s-[0-9a-f]{16}-%s-%d$`, r.Router, r.Model, r.Seq); !regexp.MustCompile(want).MatchString(m.Header.Get("Nats-Msg-Id")) ||
			m.Subject != "sy.report.m.A.r1" {
			bad = append(bad, fmt.Errorf("subject %s msg id %q, want %q", m.Subject, m.Header.Get("Nats-Msg-Id"), want))
		}
		reports = append(reports, r)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// The test engines serve /healthz: probing it shows probes reach them.
	svc := runService(t, router.ServiceOptions{Conn: env.Dial(t, "router"), Cluster: "A", Router: "r1",
		ReportInterval: 200 * time.Millisecond, RTTProbe: "http:/healthz"})
	testenv.WaitFor(t, 5*time.Second, "routable", func() bool {
		tb, _, ok := svc.Store().Table("m")
		return ok && tb.Slots() > 0
	})
	const n = 60
	client := &http.Client{}
	bodyBytes := 0
	for i := 0; i < n; i++ {
		body := chatJSON("m", i%3 == 0, fmt.Sprintf("q%d", i))
		bodyBytes += len(body)
		if status, _, _ := postChat(t, client, svc.Addr(), body, ""); status != 200 {
			t.Fatalf("status %d", status)
		}
	}
	var requests, sent, ok, prompt int64
	testenv.WaitFor(t, 10*time.Second, "reports with every request and RTTs", func() bool {
		mu.Lock()
		defer mu.Unlock()
		requests, sent, ok, prompt = 0, 0, 0, 0
		rtt := false
		for _, r := range reports {
			requests += r.Requests
			prompt += r.PromptTokens
			for _, o := range r.Engines {
				sent += o.Sent
				ok += o.Succeeded
			}
			rtt = rtt || len(r.RTTMs) == 2
		}
		return requests == n && sent == n && ok == n && rtt
	})
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Fatalf("bad reports: %v", bad)
	}
	var lastSeq uint64
	for _, r := range reports {
		if r.Seq <= lastSeq || r.IntervalS <= 0 || r.IntervalS > 2 || r.Cluster != "A" {
			t.Fatalf("report %+v after seq %d", r, lastSeq)
		}
		lastSeq = r.Seq
		for e, o := range r.Engines {
			// TTFT is averaged over streamed answers only, latency over all.
			if o.Succeeded > 0 && (o.LatencyMs <= 0 || o.TTFTMs < 0) {
				t.Fatalf("engine %s outcome %+v", e, o)
			}
		}
	}
	if e1.probes.Load() == 0 || e2.probes.Load() == 0 {
		t.Fatalf("RTT probes e1=%d e2=%d", e1.probes.Load(), e2.probes.Load())
	}
	// Each request's prompt is at least one token and at most its body's
	// bytes over protocol.BytesPerToken.
	if prompt < n || prompt > int64(bodyBytes/protocol.BytesPerToken) {
		t.Fatalf("reports carry %d prompt tokens for %d requests of %d bytes, want %d..%d", prompt, n, bodyBytes, n, bodyBytes/protocol.BytesPerToken)
	}
}

func TestServiceStopsCleanly(t *testing.T) {
	env := testenv.StartNATS(t)
	nc := env.Dial(t, "router")
	e1 := newHTTPEngine(t, "e1")
	publishSignals(t, env.Dial(t, "engines"), env.Names, 100*time.Millisecond,
		fakeSignal{model: "m", engine: "e1", capacity: 10, health: 1, url: e1.srv.URL})
	svc, err := router.NewService(router.ServiceOptions{Conn: nc, Cluster: "A", Router: "r1", HTTPAddr: "127.0.0.1:0",
		ReportInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	testenv.WaitFor(t, 5*time.Second, "routable", func() bool {
		tb, _, ok := svc.Store().Table("m")
		return ok && tb.Slots() > 0
	})
	if status, _, _ := postChat(t, &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}, svc.Addr(),
		chatJSON("m", false, "x"), ""); status != 200 {
		t.Fatalf("status %d", status)
	}
	natsRequest(t, env.Dial(t, "client"), "sy.req.A.m", chatJSON("m", true, "x"), nil)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	// No goroutine of the router package is left (the NATS server's and
	// the connections' own goroutines are not the router's).
	deadline := time.Now().Add(5 * time.Second)
	for {
		buf := make([]byte, 4<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "switchyard/router.") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("router goroutines left after Run returned:\n%s", stacks)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := http.Get("http://" + svc.Addr() + "/healthz"); err == nil {
		t.Fatal("HTTP front still answering after Run returned")
	}
}

func TestNATSTransportFailures(t *testing.T) {
	env := testenv.StartNATS(t)
	nc := env.Dial(t, "router")
	tr, err := upstream.NewNATSTransport(upstream.NATSTransportOptions{Conn: nc, FirstReplyTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	req := &upstream.Request{Endpoint: protocol.EndpointChat, Model: "m", Body: []byte(chatJSON("m", true, "x")),
		Header: http.Header{}, Stream: true}
	ctx := context.Background()

	// Nobody listens: a fast error, not a timeout.
	start := time.Now()
	if _, err := tr.Forward(ctx, selection.Engine{Name: "gone", Subject: "sy.infer.m.gone"}, req); err == nil ||
		!strings.Contains(err.Error(), "no responders") || time.Since(start) > 150*time.Millisecond {
		t.Fatalf("no responders: err %v after %v", err, time.Since(start))
	}
	// An engine that never answers: the first-reply timeout.
	engine := env.Dial(t, "engine")
	sub, err := engine.Subscribe("sy.infer.m.mute", func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := engine.Flush(); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if _, err := tr.Forward(ctx, selection.Engine{Name: "mute", Subject: "sy.infer.m.mute"}, req); err == nil ||
		time.Since(start) < 200*time.Millisecond || time.Since(start) > 2*time.Second {
		t.Fatalf("mute engine: err %v after %v", err, time.Since(start))
	}
	// An engine error is relayed with its status; cancelling the request
	// unblocks a stream that stalls after its first reply.
	sub2, err := engine.Subscribe("sy.infer.m.e", func(m *nats.Msg) {
		r := nats.NewMsg(m.Reply)
		if strings.Contains(string(m.Data), "bad") {
			r.Header.Set(messages.HeaderStatus, "429")
			r.Header.Set(messages.HeaderLast, "true")
			r.Data = []byte(`{"error":{"message":"busy","type":"rate_limit"}}`)
		} else {
			r.Header.Set(messages.HeaderStatus, "200")
			r.Data = []byte(`{"i":0}`)
		}
		_ = engine.PublishMsg(r)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub2.Unsubscribe() }()
	if err := engine.Flush(); err != nil {
		t.Fatal(err)
	}
	bad := *req
	bad.Body = []byte(chatJSON("m", true, "bad"))
	resp, err := tr.Forward(ctx, selection.Engine{Name: "e", Subject: "sy.infer.m.e"}, &bad)
	if err != nil || resp.Status != 429 {
		t.Fatalf("engine error: %v, %+v", err, resp)
	}
	_ = resp.Body.Close()
	cctx, cancel := context.WithCancel(ctx)
	resp, err = tr.Forward(cctx, selection.Engine{Name: "e", Subject: "sy.infer.m.e"}, req)
	if err != nil || resp.Status != 200 {
		t.Fatalf("stalling stream: %v", err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 1024)
	n, err := resp.Body.Read(buf)
	if err != nil || string(buf[:n]) != "data: {\"i\":0}\n\n" {
		t.Fatalf("first event %q, %v", buf[:n], err)
	}
	time.AfterFunc(50*time.Millisecond, cancel)
	if _, err := resp.Body.Read(buf); err == nil {
		t.Fatal("read after cancel succeeded")
	}
}
