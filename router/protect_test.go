package router

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/guard"
	"github.com/switchyard-dev/switchyard/router/httpfront"
	"github.com/switchyard-dev/switchyard/router/live"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/selection"
)

// Engine behaviours of progEngine.
const (
	modeOK          int32 = iota
	mode500               // answer 500
	mode429               // answer 429
	modeHang              // accept and never answer until the client gives up
	modeDieMidway         // send headers and one SSE event, then drop the connection
	modeHold              // stream one event, then wait for release
	modeConnRefused       // listener closed (set by closing the server)
)

// progEngine is a loopback engine whose behaviour a test switches.
type progEngine struct {
	name     string
	srv      *httptest.Server
	mode     atomic.Int32
	requests atomic.Int64
	inflight atomic.Int64
	release  chan struct{}
}

func newProgEngine(t *testing.T, name string, mode int32) *progEngine {
	t.Helper()
	e := &progEngine{name: name, release: make(chan struct{})}
	e.mode.Store(mode)
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(func() {
		select {
		case <-e.release:
		default:
			close(e.release)
		}
		e.srv.CloseClientConnections()
		e.srv.Close()
	})
	if mode == modeConnRefused {
		e.srv.Close()
	}
	return e
}

func (e *progEngine) serve(w http.ResponseWriter, r *http.Request) {
	e.requests.Add(1)
	e.inflight.Add(1)
	defer e.inflight.Add(-1)
	_, _ = io.ReadAll(r.Body)
	switch e.mode.Load() {
	case mode500:
		http.Error(w, `{"error":{"message":"boom"}}`, http.StatusInternalServerError)
		return
	case mode429:
		http.Error(w, `{"error":{"message":"busy"}}`, http.StatusTooManyRequests)
		return
	case modeHang:
		<-r.Context().Done()
		return
	case modeDieMidway:
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fmt.Fprintf(w, "data: {\"i\":0,\"engine\":%q}\n\n", e.name)
		w.(http.Flusher).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
		return
	case modeHold:
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, "data: {\"i\":0}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-e.release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprintf(w, "data: {\"i\":0,\"engine\":%q}\n\ndata: [DONE]\n\n", e.name)
}

// clock is a settable test clock: real time plus an offset.
type clock struct{ off atomic.Int64 }

func (c *clock) now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *clock) advance(d time.Duration) { c.off.Add(int64(d)) }
func streamBody(content string) string {
	return `{"model":"m","stream":true,"messages":[{"role":"user","content":"` + content + `"}]}`
}
func (e *progEngine) count() int64   { return e.requests.Load() }
func (e *progEngine) set(mode int32) { e.mode.Store(mode) }

// pfront is a handler over progEngines for model "m".
type pfront struct {
	h       *Handler
	url     string
	tables  *StaticTables
	table   *selection.Table
	engines []*progEngine
	client  *http.Client
}

func newPFront(t *testing.T, kind httpfront.ServerKind, modes []int32, weights []float64, figs *guard.Figures, opts Options) *pfront {
	t.Helper()
	f := &pfront{tables: NewStaticTables()}
	var es []selection.Engine
	for i, m := range modes {
		e := newProgEngine(t, fmt.Sprintf("e%d", i), m)
		f.engines = append(f.engines, e)
		es = append(es, selection.Engine{Name: e.name, URL: e.srv.URL, Weight: weights[i]})
	}
	f.table = mustTable(t, es, selection.TableOptions{})
	f.tables.Set("m", f.table, control.Info{Generation: 1, Mode: control.ModeSnapshot, Created: time.Now(), Figures: figs})
	opts.Tables = f.tables
	opts.Cluster = "A"
	h, err := NewHandler(opts)
	if err != nil {
		t.Fatal(err)
	}
	f.h = h
	f.url = serveFront(t, kind, h, httpfront.ServerOptions{})
	f.client = testClient(t)
	return f
}

// sessionFor returns a session id whose primary engine is engine i, other
// than those in not.
func (f *pfront) sessionFor(t *testing.T, i int, not ...string) string {
	t.Helper()
	for k := 0; k < 100000; k++ {
		s := fmt.Sprintf("s%d", k)
		if slices.Contains(not, s) {
			continue
		}
		key, _ := protocol.AffinityKey(s, &protocol.Request{Model: "m"})
		if j, _ := f.table.Primary(key); j == i {
			return s
		}
	}
	t.Fatalf("no session for engine %d", i)
	return ""
}

type result struct {
	status int
	body   string
	header http.Header
	err    error
	dur    time.Duration
}

func (f *pfront) do(body string, hdr map[string]string) result {
	req, _ := http.NewRequest(http.MethodPost, f.url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	start := time.Now()
	resp, err := f.client.Do(req)
	if err != nil {
		return result{err: err, dur: time.Since(start)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, body: string(b), header: resp.Header, err: err, dur: time.Since(start)}
}

func (f *pfront) attempts() int { return int(metricValue(f.h.metrics.attempts)) }
func (f *pfront) retries(reason string) int {
	return int(metricValue(f.h.metrics.retries.WithLabelValues(reason)))
}

func TestRetryToAnotherEngine(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		for _, tc := range []struct {
			name   string
			mode   int32
			reason string
		}{
			{"connect", modeConnRefused, "connect"},
			{"5xx", mode500, "5xx"},
			{"429", mode429, "429"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f := newPFront(t, kind, []int32{tc.mode, modeOK, modeOK}, []float64{0.5, 0.25, 0.25}, nil, Options{})
				s := f.sessionFor(t, 0)
				r := f.do(streamBody("x"), map[string]string{messages.HeaderSessionID: s})
				if r.err != nil || r.status != 200 || !strings.Contains(r.body, "[DONE]") {
					t.Fatalf("got %d %q %v", r.status, r.body, r.err)
				}
				if eng := r.header.Get(messages.HeaderEngine); eng == "e0" || eng == "" {
					t.Fatalf("served by %q", eng)
				}
				if f.attempts() != 2 || f.retries(tc.reason) != 1 {
					t.Fatalf("attempts %d, retries{%s} %d; want 2, 1", f.attempts(), tc.reason, f.retries(tc.reason))
				}
			})
		}
	})
}

// TestRetryMovesKey: a keyed request retried on another engine moves its
// key there — the engine that served it holds its newest prefix — so the
// key's next request goes there too, even once the first engine is healthy.
func TestRetryMovesKey(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		f := newPFront(t, kind, []int32{mode500, modeOK, modeOK}, []float64{0.5, 0.25, 0.25}, nil, Options{})
		s := f.sessionFor(t, 0)
		r := f.do(streamBody("x"), map[string]string{messages.HeaderSessionID: s})
		served := r.header.Get(messages.HeaderEngine)
		if r.status != 200 || served == "e0" || served == "" {
			t.Fatalf("first request: %d from %q %v, want a retry served elsewhere", r.status, served, r.err)
		}
		f.engines[0].mode.Store(modeOK)
		for i := range 3 {
			r = f.do(streamBody("x"), map[string]string{messages.HeaderSessionID: s})
			if got := r.header.Get(messages.HeaderEngine); r.status != 200 || got != served {
				t.Fatalf("request %d after the retry: %d from %q, want %q (where the retry put the key)", i+2, r.status, got, served)
			}
		}
	})
}

// TestClientGoneBeforeFirstByte: a client that goes away while its request
// waits for the engine's first byte — streamed or not — cancels the
// engine's request at once, not when the per-attempt deadline fires.
func TestClientGoneBeforeFirstByte(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
				f := newPFront(t, kind, []int32{modeHang}, []float64{1}, nil, Options{Protection: live.ProtectionOptions{
					FirstByteTimeout: time.Minute, WholeFirstByteTimeout: time.Minute}})
				body := chatBody
				if stream {
					body = streamBody("x")
				}
				conn, err := net.Dial("tcp", strings.TrimPrefix(f.url, "http://"))
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				if _, err := fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
					t.Fatal(err)
				}
				waitFor(t, 5*time.Second, func() bool { return f.engines[0].inflight.Load() == 1 })
				gone := time.Now()
				_ = conn.Close()
				waitFor(t, 5*time.Second, func() bool { return f.engines[0].inflight.Load() == 0 })
				waitFor(t, 5*time.Second, func() bool { return f.h.Live("m").TotalInFlight() == 0 })
				t.Logf("the engine's request ended %v after the client went away", time.Since(gone).Round(time.Millisecond))
			})
		}
	})
}

func TestNoRetryAfterFirstByte(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		f := newPFront(t, kind, []int32{modeDieMidway, modeOK, modeOK}, []float64{0.5, 0.25, 0.25}, nil, Options{})
		s := f.sessionFor(t, 0)
		r := f.do(streamBody("x"), map[string]string{messages.HeaderSessionID: s})
		if r.status != 200 || !strings.Contains(r.body, `"engine":"e0"`) || strings.Contains(r.body, "[DONE]") {
			t.Fatalf("want a truncated stream from e0, got %d %q", r.status, r.body)
		}
		if f.attempts() != 1 || f.engines[1].count()+f.engines[2].count() != 0 {
			t.Fatalf("attempts %d (others %d, %d); want exactly one", f.attempts(), f.engines[1].count(), f.engines[2].count())
		}
	})
}

func TestHangingEngineDeadlineThenRetry(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		for _, stream := range []bool{true, false} {
			t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
				f := newPFront(t, kind, []int32{modeHang, modeOK}, []float64{0.5, 0.5}, nil, Options{Protection: live.ProtectionOptions{
					FirstByteTimeout: 100 * time.Millisecond, WholeFirstByteTimeout: 150 * time.Millisecond}})
				s := f.sessionFor(t, 0)
				body := streamBody("x")
				if !stream {
					body = chatBody
				}
				r := f.do(body, map[string]string{messages.HeaderSessionID: s})
				if r.status != 200 || r.header.Get(messages.HeaderEngine) != "e1" {
					t.Fatalf("got %d from %q: %q", r.status, r.header.Get(messages.HeaderEngine), r.body)
				}
				if r.dur < 100*time.Millisecond || r.dur > 2*time.Second {
					t.Fatalf("took %v", r.dur)
				}
				if f.retries("timeout") != 1 {
					t.Fatalf("retries{timeout} = %d", f.retries("timeout"))
				}
			})
		}
	})
}

func TestAttemptsCapped(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		f := newPFront(t, kind, []int32{mode500, mode500, mode500, mode500, mode500}, []float64{0.2, 0.2, 0.2, 0.2, 0.2}, nil,
			Options{Protection: live.ProtectionOptions{Eject: live.EjectOptions{After: -1}, Budget: guard.BudgetOptions{Ratio: 5, MaxTokens: 100}}})
		for i := 0; i < 10; i++ {
			r := f.do(streamBody(fmt.Sprint(i)), nil)
			if r.status != 500 {
				t.Fatalf("status %d, want the last engine's 500", r.status)
			}
		}
		total := int64(0)
		for _, e := range f.engines {
			total += e.count()
		}
		if total != 30 || f.attempts() != 30 {
			t.Fatalf("%d engine requests, %d attempts for 10 requests; want 30 (3 each)", total, f.attempts())
		}
	})
}

func TestBudgetStopsRetries(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		f := newPFront(t, kind, []int32{mode500, mode500, mode500}, []float64{0.3, 0.3, 0.3}, nil,
			Options{Protection: live.ProtectionOptions{Eject: live.EjectOptions{After: -1}, Budget: guard.BudgetOptions{Ratio: 0.001, MaxTokens: 2}}})
		start := time.Now()
		const n = 200
		for i := 0; i < n; i++ {
			f.do(streamBody(fmt.Sprint(i)), nil)
		}
		el := time.Since(start).Seconds()
		retries := f.attempts() - n
		// One starting token, 0.001 per request, one a second from the floor.
		if max := 2 + int(el) + 1; retries > max {
			t.Fatalf("%d retries in %.2fs, budget allows %d", retries, el, max)
		}
		if amp := f.h.amp.Ratio(); amp > 1+float64(2+int(el))/n {
			t.Fatalf("amplification %.3f", amp)
		}
		t.Logf("%d requests in %.2fs: %d retries, amplification %.3f", n, el, retries, f.h.amp.Ratio())
	})
}

func TestAmplificationHalfFailingHighUtilisation(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		modes := []int32{mode500, modeOK, mode500, modeOK, mode500, modeOK}
		w := []float64{1.0 / 6, 1.0 / 6, 1.0 / 6, 1.0 / 6, 1.0 / 6, 1.0 / 6}
		figs := &guard.Figures{Utilisation: 0.9, DemandRPS: 1000, Latency: time.Second}
		f := newPFront(t, kind, modes, w, figs, Options{})
		const n = 600
		var ok atomic.Int64
		var wg sync.WaitGroup
		jobs := make(chan int)
		for k := 0; k < 8; k++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range jobs {
					if f.do(streamBody(fmt.Sprint(i)), nil).status == 200 {
						ok.Add(1)
					}
				}
			}()
		}
		for i := 0; i < n; i++ {
			jobs <- i
		}
		close(jobs)
		wg.Wait()
		amp := float64(f.attempts()) / n
		if amp > 1.1 || f.h.amp.Ratio() > 1.1 {
			t.Fatalf("amplification %.3f (window %.3f), want ≤ 1.1", amp, f.h.amp.Ratio())
		}
		t.Logf("amplification %.3f, %d/%d succeeded", amp, ok.Load(), n)
	})
}

func TestEjectionAndHalfOpenRecovery(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		var clk clock
		f := newPFront(t, kind, []int32{mode500, modeOK}, []float64{0.5, 0.5}, nil,
			Options{Now: clk.now, Protection: live.ProtectionOptions{MaxAttempts: 1}})
		s := f.sessionFor(t, 0)
		hdr := map[string]string{messages.HeaderSessionID: s}
		gauge := func() float64 { return metricValue(f.h.metrics.ejected.WithLabelValues("m", "e0")) }
		for i := 0; i < 3; i++ {
			if r := f.do(streamBody("x"), hdr); r.status != 500 {
				t.Fatalf("request %d: %d", i, r.status)
			}
		}
		if gauge() != 1 || !f.h.Live("m").Engine("e0").Ejected() {
			t.Fatal("e0 not ejected after 3 failures")
		}
		// Ejected: the key's requests go to e1.
		for i := 0; i < 5; i++ {
			if r := f.do(streamBody("x"), hdr); r.status != 200 || r.header.Get(messages.HeaderEngine) != "e1" {
				t.Fatalf("while ejected: %d from %q", r.status, r.header.Get(messages.HeaderEngine))
			}
		}
		if f.engines[0].count() != 3 {
			t.Fatalf("e0 got %d requests while ejected", f.engines[0].count())
		}
		// After the backoff one probe goes through; it fails: ejected for 2 s.
		// The session above now stays on e1, where the router sent it last
		// (PickRecent); a session new to the router finds e0 again.
		hdr = map[string]string{messages.HeaderSessionID: f.sessionFor(t, 0, s)}
		clk.advance(1100 * time.Millisecond)
		f.do(streamBody("x"), hdr)
		if f.engines[0].count() != 4 || gauge() != 1 {
			t.Fatalf("half-open probe: e0 has %d requests, gauge %v", f.engines[0].count(), gauge())
		}
		clk.advance(1100 * time.Millisecond)
		f.do(streamBody("x"), hdr)
		if f.engines[0].count() != 4 {
			t.Fatal("probe sent before the doubled backoff ended")
		}
		// Recovered: the next probe succeeds and lifts the ejection.
		f.engines[0].set(modeOK)
		clk.advance(time.Second)
		hdr = map[string]string{messages.HeaderSessionID: f.sessionFor(t, 0, s, hdr[messages.HeaderSessionID])}
		if r := f.do(streamBody("x"), hdr); r.header.Get(messages.HeaderEngine) != "e0" || r.status != 200 {
			t.Fatalf("probe: %d from %q", r.status, r.header.Get(messages.HeaderEngine))
		}
		if gauge() != 0 || f.h.Live("m").Engine("e0").Ejected() {
			t.Fatal("e0 still ejected after a successful probe")
		}
		// A stream the engine breaks counts as a failure: three eject again.
		f.engines[0].set(modeDieMidway)
		for i := 0; i < 3; i++ {
			f.do(streamBody("x"), hdr)
		}
		waitFor(t, 2*time.Second, func() bool { return gauge() == 1 })
	})
}

func TestShedConsistentPerKey(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		f := newPFront(t, kind, []int32{modeOK, modeOK}, []float64{0.35, 0.35}, &guard.Figures{ShedFraction: 0.3}, Options{})
		shedSessions := 0
		const sessions = 300
		for i := 0; i < sessions; i++ {
			var codes []int
			for k := 0; k < 3; k++ {
				codes = append(codes, f.do(streamBody("x"), map[string]string{messages.HeaderSessionID: fmt.Sprint("conv-", i)}).status)
			}
			if codes[0] != codes[1] || codes[1] != codes[2] || (codes[0] != 200 && codes[0] != 429) {
				t.Fatalf("session %d flip-flopped: %v", i, codes)
			}
			if codes[0] == 429 {
				shedSessions++
			}
		}
		if frac := float64(shedSessions) / sessions; frac < 0.22 || frac > 0.38 {
			t.Fatalf("shed %.2f of sessions, want about 0.3", frac)
		}
	})
}

func TestShedByPriorityOrder(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		for _, figs := range []*guard.Figures{
			{ShedFraction: 1.0 / 3},
			{ShedFraction: 1.0 / 3, HasShedByPriority: true, ShedByPriority: [3]float64{1, 0.27, 0}},
		} {
			f := newPFront(t, kind, []int32{modeOK, modeOK}, []float64{0.3, 0.3}, figs, Options{})
			pattern := []string{"sheddable", "standard", "standard", "standard", "standard", "critical", "critical", "critical", "sheddable", ""}
			served := map[string]int{}
			shed := map[string]int{}
			for i := 0; i < 600; i++ {
				p := pattern[i%len(pattern)]
				r := f.do(streamBody("x"), map[string]string{messages.HeaderPriority: p, messages.HeaderSessionID: fmt.Sprint("k", i)})
				if p == "" {
					p = "standard"
				}
				switch r.status {
				case 200:
					served[p]++
				case 429:
					shed[p]++
				default:
					t.Fatalf("status %d", r.status)
				}
			}
			if shed["critical"] != 0 || served["sheddable"] != 0 {
				t.Fatalf("shed %v served %v: critical shed or sheddable served", shed, served)
			}
			frac := float64(shed["standard"]) / float64(shed["standard"]+served["standard"])
			if frac < 0.18 || frac > 0.36 {
				t.Fatalf("standard shed fraction %.2f, want about 0.27", frac)
			}
			total := 0
			for _, n := range shed {
				total += n
			}
			t.Logf("shed %v served %v (total shed %.3f)", shed, served, float64(total)/600)
		}
		f := newPFront(t, kind, []int32{modeOK}, []float64{1}, nil, Options{})
		if r := f.do(streamBody("x"), map[string]string{messages.HeaderPriority: "urgent"}); r.status != 400 || !strings.Contains(r.body, "invalid_header") {
			t.Fatalf("invalid priority: %d %q", r.status, r.body)
		}
	})
}

func TestShedAnswerFast(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		f := newPFront(t, kind, []int32{modeOK}, []float64{0.5}, &guard.Figures{ShedFraction: 1}, Options{})
		var durs []time.Duration
		for i := 0; i < 400; i++ {
			r := f.do(streamBody("x"), map[string]string{messages.HeaderSessionID: fmt.Sprint("s", i)})
			if r.status != 429 || r.header.Get("Retry-After") != "1" {
				t.Fatalf("shed answer %d, Retry-After %q", r.status, r.header.Get("Retry-After"))
			}
			var body struct {
				Error struct {
					Message, Type string
					Code          *string
				}
			}
			if err := json.Unmarshal([]byte(r.body), &body); err != nil || body.Error.Type != protocol.ErrTypeUnavailable ||
				body.Error.Code == nil || *body.Error.Code != "overloaded" || body.Error.Message == "" {
				t.Fatalf("body %q", r.body)
			}
			durs = append(durs, r.dur)
		}
		sort.Slice(durs, func(a, b int) bool { return durs[a] < durs[b] })
		p99 := durs[len(durs)*99/100]
		t.Logf("shed answers: p50 %v p99 %v", durs[len(durs)/2], p99)
		// The goal is 5 ms at the p99 (measured on the real stack without the
		// race detector by TestReliabilityOverload); under -race on a busy
		// 2-core machine every request is several times slower, so the bound
		// here only says that a shed answer waits on nothing.
		limit := 5 * time.Millisecond
		if raceEnabled {
			limit = 25 * time.Millisecond
		}
		if p99 > limit {
			t.Fatalf("shed p99 %v, want < %v", p99, limit)
		}
		if f.engines[0].count() != 0 {
			t.Fatal("a shed request reached the engine")
		}
		if n := metricValue(f.h.metrics.shed.WithLabelValues("snapshot", "standard")); n != 400 {
			t.Fatalf("shed_total %v", n)
		}
	})
}

// burster sends bursts of streamed requests of a priority class to a front
// whose engines hold every request, and counts the answers by class and
// status ("standard429").
type burster struct {
	f     *pfront
	codes sync.Map
	wg    sync.WaitGroup
}

// burst sends n requests of class prio at once.
func (b *burster) burst(prio string, n int) {
	for i := 0; i < n; i++ {
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			r := b.f.do(streamBody("x"), map[string]string{messages.HeaderPriority: prio})
			v, _ := b.codes.LoadOrStore(fmt.Sprint(prio, r.status), new(atomic.Int64))
			v.(*atomic.Int64).Add(1)
		}()
	}
}

// then is burst for a chain of conditions; it returns true.
func (b *burster) then(prio string, n int) bool { b.burst(prio, n); return true }

// count returns the answers of class and status k, e.g. "critical200".
func (b *burster) count(k string) int64 {
	v, ok := b.codes.Load(k)
	if !ok {
		return 0
	}
	return v.(*atomic.Int64).Load()
}

// held returns the requests the engines hold.
func (b *burster) held() int64 {
	n := int64(0)
	for _, e := range b.f.engines {
		n += e.inflight.Load()
	}
	return n
}

// release lets the engines answer and waits for every burst's answers.
func (b *burster) release() {
	for _, e := range b.f.engines {
		close(e.release)
	}
	b.wg.Wait()
}

func TestAdmissionShedsBurst(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		// Allotment: m = 4 req/s × 1 s in flight on average; max(8, 1.5·m + 4·√m)
		// = 14; sheddable requests get 80% of it (11), critical ones 125% (17).
		figs := &guard.Figures{DemandRPS: 4, Latency: time.Second, Utilisation: 0.95} // near its limit: admission applies
		f := newPFront(t, kind, []int32{modeHold, modeHold}, []float64{0.5, 0.5}, figs, Options{})
		b := &burster{f: f}
		count, held := b.count, b.held
		b.burst("sheddable", 20)
		// Poll without failing, so that the engines are released (and the
		// bursts' goroutines end) whatever happens.
		ok := poll(5*time.Second, func() bool { return held() == 11 && count("sheddable429") == 9 }) &&
			b.then("standard", 10) &&
			poll(5*time.Second, func() bool { return held() == 14 && count("standard429") == 7 }) &&
			b.then("critical", 10) &&
			poll(5*time.Second, func() bool { return held() == 17 && count("critical429") == 7 })
		b.release()
		if !ok {
			t.Fatalf("held %d; shed %d sheddable, %d standard, %d critical", held(), count("sheddable429"), count("standard429"), count("critical429"))
		}
		if count("sheddable200") != 11 || count("standard200") != 3 || count("critical200") != 3 {
			t.Fatalf("served %d sheddable, %d standard, %d critical", count("sheddable200"), count("standard200"), count("critical200"))
		}
	})
}

// TestFirstByteSplitRelay checks that bytes read before committing are
// relayed once, in order, ahead of the rest.
func TestFirstByteSplitRelay(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			for i := 0; i < 5; i++ {
				fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
				w.(http.Flusher).Flush()
			}
		}))
		defer srv.Close()
		front := serveOneEngine(t, kind, srv.URL)
		resp, err := testClient(t).Post(front+"/v1/chat/completions", "application/json", strings.NewReader(streamBody("x")))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		var got []string
		for sc.Scan() {
			if l := sc.Text(); l != "" {
				got = append(got, l)
			}
		}
		if len(got) != 5 || got[0] != `data: {"i":0}` || got[4] != `data: {"i":4}` {
			t.Fatalf("relayed %q", got)
		}
	})
}

// metricValue reads a counter or gauge.
func metricValue(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// poll reports whether cond holds within timeout, checking every few ms.
func poll(timeout time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// mapRegions is a RegionResolver over a fixed map of engine regions.
type mapRegions map[string]string

func (m mapRegions) Region(_, engine string) string { return m[engine] }

// TestRetryLeavesFailedRegionForSpare: both engines the snapshot plans
// (region r2) fail. A request is retried in r2 first, then on the nearest
// engine of weight zero (the snapshot's spare, by predicted latency), and
// once both planned engines are ejected requests go to that spare engine
// at once, before any new snapshot.
func TestRetryLeavesFailedRegionForSpare(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		snap := &messages.WeightSnapshot{Weights: map[string]float64{"e0": 0.5, "e1": 0.5, "e2": 0, "e3": 0},
			LatencyMs: map[string]float64{"e0": 150, "e1": 150, "e2": 180, "e3": 160}, DemandRPS: 10}
		figs := guard.FiguresOf(snap)
		if !slices.Equal(figs.Spare, []string{"e3", "e2"}) {
			t.Fatalf("spare engines %v, want [e3 e2] (nearest first)", figs.Spare)
		}
		f := newPFront(t, kind, []int32{mode500, mode500, modeOK, modeOK}, []float64{0.5, 0.5, 0, 0}, figs,
			Options{Regions: mapRegions{"e0": "r2", "e1": "r2", "e2": "r3", "e3": "r1"},
				Protection: live.ProtectionOptions{Eject: live.EjectOptions{After: 2}, Budget: guard.BudgetOptions{Ratio: 5, MaxTokens: 100}}})
		r := f.do(streamBody("x"), nil)
		if r.status != 200 || r.header.Get(messages.HeaderEngine) != "e3" {
			t.Fatalf("first request: got %d from %q: %q", r.status, r.header.Get(messages.HeaderEngine), r.body)
		}
		if f.attempts() != 3 || f.engines[0].count() != 1 || f.engines[1].count() != 1 || f.engines[2].count() != 0 {
			t.Fatalf("attempts %d, e0 %d e1 %d e2 %d; want 3 attempts: e0, e1, then the spare e3",
				f.attempts(), f.engines[0].count(), f.engines[1].count(), f.engines[2].count())
		}
		// A second failure each ejects e0 and e1 (After 2).
		for i := 0; i < 2; i++ {
			if r := f.do(streamBody("x"), nil); r.status != 200 || r.header.Get(messages.HeaderEngine) != "e3" {
				t.Fatalf("request %d: got %d from %q: %q", i+2, r.status, r.header.Get(messages.HeaderEngine), r.body)
			}
		}
		if !f.h.Live("m").Engine("e0").Ejected() || !f.h.Live("m").Engine("e1").Ejected() {
			t.Fatalf("e0 ejected %v, e1 ejected %v; want both", f.h.Live("m").Engine("e0").Ejected(), f.h.Live("m").Engine("e1").Ejected())
		}
		before, failed := f.attempts(), f.engines[0].count()+f.engines[1].count()
		for i := 0; i < 5; i++ {
			if r := f.do(streamBody(fmt.Sprint("y", i)), nil); r.status != 200 || r.header.Get(messages.HeaderEngine) != "e3" {
				t.Fatalf("after ejection: got %d from %q: %q", r.status, r.header.Get(messages.HeaderEngine), r.body)
			}
		}
		if got := f.attempts() - before; got != 5 || f.engines[0].count()+f.engines[1].count() != failed {
			t.Fatalf("after ejection: %d attempts for 5 requests, %d more to the ejected engines; want 5 and 0",
				got, f.engines[0].count()+f.engines[1].count()-failed)
		}
	})
}
