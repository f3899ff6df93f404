package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/agent"
	"github.com/switchyard-dev/switchyard/services/enginesim"
	"github.com/switchyard-dev/switchyard/testenv"
)

// startVLLMSim starts a simulated engine that serves vLLM's metrics and no
// signals of its own, as an engine fronted by the agent.
func startVLLMSim(t *testing.T, name string) *enginesim.Engine {
	t.Helper()
	e, err := enginesim.New(enginesim.Options{
		Name: name, Model: "llama", MaxBatch: 4, PrefillMsPerToken: 0.05, BaseTBTMs: 5, TBTGrowthMs: 0.5,
		OutputTokens: 12, PromptTokens: 100, Seed: 1, MetricsFormat: enginesim.MetricsVLLM,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// signals collects the signals published on one engine's subject.
type signals struct {
	mu  sync.Mutex
	got []messages.EngineSignal
	bad int
}

func watch(t *testing.T, nc *nats.Conn, subject string) *signals {
	t.Helper()
	s := &signals{}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		var sig messages.EngineSignal
		s.mu.Lock()
		defer s.mu.Unlock()
		if err := messages.DecodeInto(m.Data, &sig); err != nil {
			s.bad++
			return
		}
		s.got = append(s.got, sig)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return s
}

func (s *signals) snapshot() ([]messages.EngineSignal, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]messages.EngineSignal(nil), s.got...), s.bad
}

func (s *signals) any(f func(messages.EngineSignal) bool) bool {
	got, _ := s.snapshot()
	for _, g := range got {
		if f(g) {
			return true
		}
	}
	return false
}

func runAgent(t *testing.T, o agent.Options) *agent.Agent {
	t.Helper()
	a, err := agent.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = a.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return a
}

// load sends n chat requests, conc at a time, and waits for all of them.
func load(t *testing.T, base string, n, conc int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "llama", "max_tokens": 12,
		"messages": []map[string]any{{"role": "user", "content": strings.Repeat("abcd", 99)}}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	var failed atomic.Int32
	for range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				failed.Add(1)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		t.Fatalf("%d of %d requests failed", f, n)
	}
}

func engineConfig(name, u string) agent.EngineConfig {
	return agent.EngineConfig{Name: name, Model: "llama", Region: "r1", URL: u, Format: agent.FormatVLLM,
		Known: agent.Known{CapacityRPS: 40}}
}

// TestAgentPublishesVLLMSimSignals runs the agent against a simulated engine
// serving vLLM's /metrics over 127.0.0.1 and a real embedded NATS: the
// signals on sy.signal.llama.v1 carry the engine's running and queued
// requests, TTFT and TBT from its histograms, the stated capacity, the
// learned batch size, and its address.
func TestAgentPublishesVLLMSimSignals(t *testing.T) {
	n := testenv.StartNATS(t)
	sim := startVLLMSim(t, "v1")
	subj, _ := n.Names.SignalSubject("llama", "v1")
	sigs := watch(t, n.Conn, subj)
	a := runAgent(t, agent.Options{Conn: n.Conn, Engines: []agent.EngineConfig{engineConfig("v1", sim.URL())},
		Interval: 50 * time.Millisecond, Logger: zerolog.Nop()})

	testenv.WaitFor(t, 5*time.Second, "a first signal", func() bool { return sigs.any(func(messages.EngineSignal) bool { return true }) })
	// 48 requests, 16 at a time, on a batch of 4: requests run and queue.
	load(t, sim.URL(), 48, 16)
	testenv.WaitFor(t, 5*time.Second, "a signal with running and queued requests", func() bool {
		return sigs.any(func(s messages.EngineSignal) bool { return s.Running > 0 && s.Queue > 0 })
	})
	testenv.WaitFor(t, 5*time.Second, "a signal with TTFT, TBT and max running", func() bool {
		return sigs.any(func(s messages.EngineSignal) bool { return s.TTFTMs > 0 && s.TBTMs > 0 && s.MaxRunning == 4 })
	})
	got, bad := sigs.snapshot()
	if bad > 0 {
		t.Errorf("%d signals failed to decode", bad)
	}
	st := sim.Stats()
	var last messages.EngineSignal
	for _, s := range got {
		if s.Engine != "v1" || s.Model != "llama" || s.Region != "r1" {
			t.Fatalf("signal names %s/%s/%s, want llama/v1/r1", s.Model, s.Engine, s.Region)
		}
		if s.CapacityRPS != 40 || s.Health != 1 {
			t.Fatalf("signal capacity %v health %v, want 40 and 1", s.CapacityRPS, s.Health)
		}
		if s.Running > 4 {
			t.Fatalf("running %d above the engine's batch of 4", s.Running)
		}
		if s.TTFTMs > 0 {
			last = s
		}
	}
	if len(last.Transports) != 1 || last.Transports[0].Address != sim.URL() {
		t.Errorf("transports %+v, want http %s", last.Transports, sim.URL())
	}
	// The per-interval means must be of the engine's order of magnitude.
	ttft, tbt := float64(st.MeanTTFT)/1e6, float64(st.MeanTBT)/1e6
	if last.TTFTMs < ttft/10 || last.TTFTMs > ttft*10 {
		t.Errorf("signalled TTFT %.2f ms, engine's mean %.2f ms", last.TTFTMs, ttft)
	}
	if last.TBTMs < tbt/3 || last.TBTMs > tbt*3 {
		t.Errorf("signalled TBT %.2f ms, engine's mean %.2f ms", last.TBTMs, tbt)
	}
	if !sigs.any(func(s messages.EngineSignal) bool { return s.LoadRPS > 0 }) {
		t.Error("no signal carried an arrival rate")
	}
	if es, _ := a.Stats("llama", "v1"); es.ScrapeFailures != 0 || es.Published == 0 {
		t.Errorf("agent stats %+v", es)
	}
}

// flaky fronts an engine: it can delay a number of requests, hang all of
// them, or switch to another backend.
type flaky struct {
	mu      sync.Mutex
	backend *httputil.ReverseProxy
	delayN  int           // the next delayN requests wait delay first
	delay   time.Duration //
	hang    bool          // every request waits for its client to give up
}

func newFlaky(t *testing.T, backend string) (*flaky, string) {
	f := &flaky{}
	f.setBackend(backend)
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv.URL
}

func (f *flaky) setBackend(u string) {
	p, _ := url.Parse(u)
	rp := httputil.NewSingleHostReverseProxy(p)
	rp.ErrorLog = log.New(io.Discard, "", 0) // refused backends are part of the tests
	f.mu.Lock()
	f.backend = rp
	f.mu.Unlock()
}

func (f *flaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	b, hang := f.backend, f.hang
	var wait time.Duration
	if f.delayN > 0 {
		f.delayN--
		wait = f.delay
	}
	f.mu.Unlock()
	if hang {
		<-r.Context().Done()
		return
	}
	if wait > 0 {
		select {
		case <-time.After(wait):
		case <-r.Context().Done():
			return
		}
	}
	b.ServeHTTP(w, r)
}

// TestAgentSlowScrapeIsNotDown: scrapes and health probes that time out
// once are not a down engine — every signal keeps health 1 and they keep
// coming; then an engine its agent cannot reach at all is not published as
// down either: the agent goes silent.
func TestAgentSlowScrapeIsNotDown(t *testing.T) {
	n := testenv.StartNATS(t)
	sim := startVLLMSim(t, "v2")
	f, front := newFlaky(t, sim.URL())
	subj, _ := n.Names.SignalSubject("llama", "v2")
	sigs := watch(t, n.Conn, subj)
	a := runAgent(t, agent.Options{Conn: n.Conn, Engines: []agent.EngineConfig{engineConfig("v2", front)},
		Interval: 50 * time.Millisecond, ScrapeTimeout: 150 * time.Millisecond, StaleAfter: 600 * time.Millisecond,
		Logger: zerolog.Nop()})
	testenv.WaitFor(t, 5*time.Second, "signals", func() bool { es, _ := a.Stats("llama", "v2"); return es.Published >= 3 })

	f.mu.Lock()
	f.delayN, f.delay = 2, 400*time.Millisecond // one metrics scrape and one health probe time out
	f.mu.Unlock()
	testenv.WaitFor(t, 5*time.Second, "a timed-out scrape", func() bool { es, _ := a.Stats("llama", "v2"); return es.ScrapeFailures >= 1 })
	before, _ := a.Stats("llama", "v2")
	testenv.WaitFor(t, 5*time.Second, "signals after the timeout", func() bool {
		es, _ := a.Stats("llama", "v2")
		return es.Published >= before.Published+5 && es.Scrapes > before.Scrapes
	})
	got, _ := sigs.snapshot()
	for _, s := range got {
		if s.Health != 1 {
			t.Fatalf("a slow scrape published health %v", s.Health)
		}
	}
	if es, _ := a.Stats("llama", "v2"); es.Silent != 0 {
		t.Errorf("one slow scrape silenced the agent %d times: %+v", es.Silent, es)
	}

	// Unreachable (every request hangs): silent, never health 0.
	f.mu.Lock()
	f.hang = true
	f.mu.Unlock()
	testenv.WaitFor(t, 5*time.Second, "the agent to go silent", func() bool { es, _ := a.Stats("llama", "v2"); return es.Silent >= 3 })
	count := len(got)
	got, _ = sigs.snapshot()
	for _, s := range got[count:] {
		if s.Health != 1 {
			t.Fatalf("an unreachable engine was published with health %v", s.Health)
		}
	}
	stalled, _ := a.Stats("llama", "v2")
	// Several more silent intervals, and nothing published in them.
	testenv.WaitFor(t, 5*time.Second, "more silent intervals", func() bool {
		es, _ := a.Stats("llama", "v2")
		return es.Silent >= stalled.Silent+5
	})
	if es, _ := a.Stats("llama", "v2"); es.Published != stalled.Published {
		t.Errorf("published %d signals while the engine was unreachable", es.Published-stalled.Published)
	}
	f.mu.Lock()
	f.hang = false
	f.mu.Unlock()
	testenv.WaitFor(t, 5*time.Second, "publishing to resume", func() bool {
		es, _ := a.Stats("llama", "v2")
		return es.Published > stalled.Published
	})
}

// TestAgentEngineRestartAndCrash: an engine restart (its counters start
// again from zero) is seen as a reset and the signals stay valid; an engine
// whose port refuses connections is published with health 0.
func TestAgentEngineRestartAndCrash(t *testing.T) {
	n := testenv.StartNATS(t)
	first := startVLLMSim(t, "v3")
	f, front := newFlaky(t, first.URL())
	subj, _ := n.Names.SignalSubject("llama", "v3")
	sigs := watch(t, n.Conn, subj)
	subj4, _ := n.Names.SignalSubject("llama", "v4")
	crashed := watch(t, n.Conn, subj4)
	a := runAgent(t, agent.Options{Conn: n.Conn, Engines: []agent.EngineConfig{engineConfig("v3", front), engineConfig("v4", first.URL())},
		Interval: 50 * time.Millisecond, Logger: zerolog.Nop()})
	load(t, front, 24, 8)
	testenv.WaitFor(t, 5*time.Second, "TTFT from the first engine", func() bool {
		return sigs.any(func(s messages.EngineSignal) bool { return s.TTFTMs > 0 })
	})
	second := startVLLMSim(t, "v3")
	f.setBackend(second.URL())
	load(t, front, 4, 4)
	testenv.WaitFor(t, 5*time.Second, "the restart to be seen", func() bool { es, _ := a.Stats("llama", "v3"); return es.Resets >= 1 })
	es, _ := a.Stats("llama", "v3")
	if es.Last.TTFTMs <= 0 || es.Last.LoadRPS < 0 {
		t.Errorf("values after the reset: %+v", es.Last)
	}
	if _, bad := sigs.snapshot(); bad > 0 {
		t.Errorf("%d invalid signals", bad)
	}

	// Crash the first engine, which a second engine entry of the same agent
	// reads directly: its listener closes and connections are refused.
	if err := first.SetFailure(enginesim.Failure{Crashed: true}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "health 0 for a crashed engine", func() bool {
		es, _ := a.Stats("llama", "v4")
		return es.Health == 0 && es.HealthFailures >= 3
	})
	testenv.WaitFor(t, 5*time.Second, "a health-0 signal for it", func() bool {
		return crashed.any(func(s messages.EngineSignal) bool { return s.Health == 0 && s.Running == 0 })
	})
	if es, _ := a.Stats("llama", "v3"); es.Health != 1 {
		t.Errorf("the other engine of the agent has health %v", es.Health)
	}
}

// TestAgentUnservedHealthPathIsNotDown: a health path the engine does not
// serve (404) is a configuration fault, not a down engine.
func TestAgentUnservedHealthPathIsNotDown(t *testing.T) {
	n := testenv.StartNATS(t)
	sim := startVLLMSim(t, "v5")
	ec := engineConfig("v5", sim.URL())
	ec.HealthPath = "/not-served"
	a := runAgent(t, agent.Options{Conn: n.Conn, Engines: []agent.EngineConfig{ec},
		Interval: 30 * time.Millisecond, HealthFailures: 2, Logger: zerolog.Nop()})
	testenv.WaitFor(t, 5*time.Second, "signals", func() bool { es, _ := a.Stats("llama", "v5"); return es.Published >= 10 })
	if es, _ := a.Stats("llama", "v5"); es.Health != 1 || es.HealthFailures != 0 {
		t.Errorf("health %v after %d failures, want 1 and 0 for a 404 health path", es.Health, es.HealthFailures)
	}
}
