package router

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/httpfront"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/router/upstream"
)

// waitFor polls cond until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fakeEngine is an OpenAI-ish engine on a real loopback socket. Streamed
// answers send chunks SSE events, delay apart.
type fakeEngine struct {
	name     string
	srv      *httptest.Server
	chunks   int
	delay    time.Duration
	requests atomic.Int64
	canceled atomic.Int64
	mu       sync.Mutex
	lastID   string
}

func newFakeEngine(t *testing.T, name string, chunks int, delay time.Duration) *fakeEngine {
	e := &fakeEngine{name: name, chunks: chunks, delay: delay}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *fakeEngine) serve(w http.ResponseWriter, r *http.Request) {
	e.requests.Add(1)
	e.mu.Lock()
	e.lastID = r.Header.Get(messages.HeaderRequestID)
	e.mu.Unlock()
	body, _ := io.ReadAll(r.Body)
	if !strings.Contains(string(body), `"stream":true`) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","engine":%q}`, e.name)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	for i := 0; i < e.chunks; i++ {
		fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			e.canceled.Add(1)
			return
		case <-time.After(e.delay):
		}
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func (e *fakeEngine) requestID() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lastID
}

// serverKinds lists the HTTP server implementations every front test runs
// against.
func serverKinds() []httpfront.ServerKind {
	return []httpfront.ServerKind{httpfront.ServerStd, httpfront.ServerFast}
}

// forEachServer runs test as a subtest for each server kind.
func forEachServer(t *testing.T, test func(t *testing.T, kind httpfront.ServerKind)) {
	t.Helper()
	for _, kind := range serverKinds() {
		t.Run(string(kind), func(t *testing.T) { test(t, kind) })
	}
}

// serveOneEngine serves a default handler on a front of kind whose only
// model, "m", has one engine, "e" at engineURL, and returns the front's URL.
func serveOneEngine(t testing.TB, kind httpfront.ServerKind, engineURL string) string {
	t.Helper()
	tables := NewStaticTables()
	tables.Set("m", mustTable(t, []selection.Engine{{Name: "e", URL: engineURL, Weight: 1}}, selection.TableOptions{}), control.Info{Mode: control.ModeSnapshot})
	h, err := NewHandler(Options{Tables: tables})
	if err != nil {
		t.Fatal(err)
	}
	return serveFront(t, kind, h, httpfront.ServerOptions{})
}

// serveFront serves h with a server of kind (and opts) on a loopback port
// until the test ends, and returns its base URL.
func serveFront(t testing.TB, kind httpfront.ServerKind, h *Handler, opts httpfront.ServerOptions) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	opts.Kind = kind
	srv, err := NewServer(h, opts)
	if err != nil {
		t.Fatalf("NewServer(%s): %v", kind, err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("%s server: Serve returned %v, want http.ErrServerClosed", kind, err)
		}
	})
	return "http://" + ln.Addr().String()
}

// testClient is an HTTP client whose idle connections close when the test
// ends.
func testClient(t testing.TB) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// front is a router front over fake engines for one model "m".
type front struct {
	h       *Handler
	url     string
	client  *http.Client
	tables  *StaticTables
	engines []*fakeEngine
}

func newFront(t *testing.T, kind httpfront.ServerKind, weights []float64, chunks int, delay time.Duration, opts Options) *front {
	f := &front{tables: NewStaticTables()}
	var es []selection.Engine
	for i, w := range weights {
		fe := newFakeEngine(t, fmt.Sprintf("eng%d", i), chunks, delay)
		f.engines = append(f.engines, fe)
		es = append(es, selection.Engine{Name: fe.name, URL: fe.srv.URL, Weight: w})
	}
	f.tables.Set("m", mustTable(t, es, selection.TableOptions{}), control.Info{Generation: 7, Mode: control.ModeSnapshot, Created: time.Now()})
	opts.Tables = f.tables
	opts.Cluster = "A"
	h, err := NewHandler(opts)
	if err != nil {
		t.Fatalf("NewHandler: %v", err)
	}
	f.h = h
	f.url = serveFront(t, kind, h, httpfront.ServerOptions{})
	f.client = testClient(t)
	return f
}

func (f *front) post(t *testing.T, path, body string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, f.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return resp
}

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hello"}]}`

// keylessBody has no session, user or prompt content: it is spread by weight.
const keylessBody = `{"model":"m","messages":[{"role":"user","content":""}]}`
const chatStreamBody = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}`

func TestStreamRelayedEventByEvent(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		const chunks, delay = 6, 100 * time.Millisecond
		f := newFront(t, kind, []float64{1}, chunks, delay, Options{})
		start := time.Now()
		resp := f.post(t, "/v1/chat/completions", chatStreamBody, nil)
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get(messages.HeaderEngine) != "eng0" {
			t.Fatalf("status %d engine %q", resp.StatusCode, resp.Header.Get(messages.HeaderEngine))
		}
		sc := bufio.NewScanner(resp.Body)
		var first, last time.Duration
		events := 0
		for sc.Scan() {
			if !strings.HasPrefix(sc.Text(), "data: ") {
				continue
			}
			if events == 0 {
				first = time.Since(start)
			}
			last = time.Since(start)
			events++
		}
		if events != chunks+1 {
			t.Fatalf("got %d events, want %d", events, chunks+1)
		}
		if gap := last - first; gap < time.Duration(chunks-1)*delay*8/10 {
			t.Fatalf("first event at %v, last at %v: the stream was buffered", first, last)
		}
		t.Logf("first event after %v, last after %v", first, last)
	})
}

func TestClientDisconnectCancelsEngine(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		f := newFront(t, kind, []float64{1}, 1000, 20*time.Millisecond, Options{})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.url+"/v1/chat/completions", strings.NewReader(chatStreamBody))
		resp, err := f.client.Do(req)
		if err != nil {
			t.Fatalf("POST: %v", err)
		}
		defer resp.Body.Close()
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "data: ") {
			t.Fatalf("first line %q: %v", line, err)
		}
		cancel()
		waitFor(t, 5*time.Second, func() bool { return f.engines[0].canceled.Load() == 1 })
		waitFor(t, 5*time.Second, func() bool { return f.h.Live("m").TotalInFlight() == 0 })
	})
}

func TestShareFollowsWeights(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		weights := []float64{0.5, 0.3, 0.2}
		for _, keyed := range []bool{true, false} {
			t.Run(fmt.Sprintf("session=%v", keyed), func(t *testing.T) {
				f := newFront(t, kind, weights, 1, 0, Options{})
				const n, workers = 2000, 8
				var mu sync.Mutex
				counts := map[string]int{}
				var wg sync.WaitGroup
				var next atomic.Int64
				for w := 0; w < workers; w++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							i := next.Add(1)
							if i > n {
								return
							}
							hdr := map[string]string{}
							body := keylessBody
							if keyed {
								hdr[messages.HeaderSessionID] = fmt.Sprintf("session-%d", i)
								body = chatBody
							}
							resp := f.post(t, "/v1/chat/completions", body, hdr)
							_, _ = io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
							if resp.StatusCode != http.StatusOK {
								t.Errorf("status %d", resp.StatusCode)
								return
							}
							mu.Lock()
							counts[resp.Header.Get(messages.HeaderEngine)]++
							mu.Unlock()
						}
					}()
				}
				wg.Wait()
				for i, w := range weights {
					got := float64(counts[fmt.Sprintf("eng%d", i)]) / n
					if math.Abs(got-w) > 0.05 {
						t.Errorf("eng%d: share %.3f, want %.3f ± 0.05", i, got, w)
					}
				}
				t.Logf("counts %v", counts)
			})
		}
	})
}

func TestSessionSticksToEngine(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		f := newFront(t, kind, []float64{0.25, 0.25, 0.25, 0.25}, 1, 0, Options{})
		for s := 0; s < 20; s++ {
			want := ""
			for i := 0; i < 5; i++ {
				resp := f.post(t, "/v1/chat/completions", chatBody, map[string]string{messages.HeaderSessionID: fmt.Sprintf("conv-%d", s)})
				resp.Body.Close()
				got := resp.Header.Get(messages.HeaderEngine)
				// The router releases a request after its client has the
				// body; until then the engine counts as loaded and the
				// bounded-load guard may rightly move the next turn. A
				// conversation whose turns do not overlap must stick.
				waitFor(t, 5*time.Second, func() bool { return f.h.Live("m").TotalInFlight() == 0 })
				if want == "" {
					want = got
				} else if got != want {
					t.Fatalf("session conv-%d went to %s then %s", s, want, got)
				}
			}
		}
	})
}

func TestRequestIDPropagated(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		f := newFront(t, kind, []float64{1}, 1, 0, Options{})
		resp := f.post(t, "/v1/chat/completions", chatBody, map[string]string{messages.HeaderRequestID: "abc-123"})
		resp.Body.Close()
		if got := resp.Header.Get(messages.HeaderRequestID); got != "abc-123" || f.engines[0].requestID() != "abc-123" {
			t.Fatalf("request id: client saw %q, engine saw %q, want abc-123", got, f.engines[0].requestID())
		}
		resp = f.post(t, "/v1/chat/completions", chatBody, nil)
		resp.Body.Close()
		if got := resp.Header.Get(messages.HeaderRequestID); !strings.HasPrefix(got, "req_") || f.engines[0].requestID() != got {
			t.Fatalf("generated request id %q, engine saw %q", got, f.engines[0].requestID())
		}
	})
}

func TestBadInput(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		f := newFront(t, kind, []float64{1}, 1, 0, Options{MaxBodyBytes: 1024})
		// A model whose only engine is down, and one whose engine does not listen.
		dead, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("listen: %v", err)
		}
		deadURL := "http://" + dead.Addr().String()
		dead.Close()
		f.tables.Set("down", mustTable(t, []selection.Engine{{Name: "d0", URL: f.engines[0].srv.URL, Weight: 1}}, selection.TableOptions{}), control.Info{Mode: control.ModeSnapshot})
		f.h.SetEngineDown("down", "d0", true)
		f.tables.Set("gone", mustTable(t, []selection.Engine{{Name: "g0", URL: deadURL, Weight: 1}}, selection.TableOptions{}), control.Info{Mode: control.ModeSnapshot})

		cases := []struct {
			name   string
			method string
			path   string
			body   string
			hdr    map[string]string
			status int
			typ    string
		}{
			{"malformed JSON", "POST", "/v1/chat/completions", `{"model":"m",`, nil, 400, protocol.ErrTypeInvalidRequest},
			{"missing model", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`, nil, 400, protocol.ErrTypeInvalidRequest},
			{"unknown model", "POST", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, nil, 404, protocol.ErrTypeNotFound},
			{"prompt wrong type", "POST", "/v1/completions", `{"model":"m","prompt":{"a":1}}`, nil, 400, protocol.ErrTypeInvalidRequest},
			{"messages wrong type", "POST", "/v1/chat/completions", `{"model":"m","messages":"hi"}`, nil, 400, protocol.ErrTypeInvalidRequest},
			{"body over limit", "POST", "/v1/completions", `{"model":"m","prompt":"` + strings.Repeat("x", 2000) + `"}`, nil, 413, protocol.ErrTypeInvalidRequest},
			{"session id too long", "POST", "/v1/chat/completions", chatBody, map[string]string{messages.HeaderSessionID: strings.Repeat("s", 300)}, 400, protocol.ErrTypeInvalidRequest},
			{"session id with space", "POST", "/v1/chat/completions", chatBody, map[string]string{messages.HeaderSessionID: "a b"}, 400, protocol.ErrTypeInvalidRequest},
			{"request id non-ASCII", "POST", "/v1/chat/completions", chatBody, map[string]string{messages.HeaderRequestID: "é"}, 400, protocol.ErrTypeInvalidRequest},
			{"content type", "POST", "/v1/chat/completions", chatBody, map[string]string{"Content-Type": "text/plain"}, 415, protocol.ErrTypeInvalidRequest},
			{"GET on chat", "GET", "/v1/chat/completions", "", nil, 405, protocol.ErrTypeInvalidRequest},
			{"unknown path", "GET", "/v2/x", "", nil, 404, protocol.ErrTypeNotFound},
			{"no engine available", "POST", "/v1/chat/completions", `{"model":"down","messages":[{"role":"user","content":"x"}]}`, nil, 503, protocol.ErrTypeUnavailable},
			{"engine unreachable", "POST", "/v1/chat/completions", `{"model":"gone","messages":[{"role":"user","content":"x"}]}`, nil, 502, protocol.ErrTypeServer},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				req, _ := http.NewRequest(c.method, f.url+c.path, strings.NewReader(c.body))
				req.Header.Set("Content-Type", "application/json")
				for k, v := range c.hdr {
					req.Header.Set(k, v)
				}
				resp, err := f.client.Do(req)
				if err != nil {
					t.Fatalf("%s %s: %v", c.method, c.path, err)
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != c.status {
					t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, body)
				}
				assertOpenAIError(t, body, c.typ)
				if c.status == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "1" {
					t.Fatalf("503 with Retry-After %q, want 1", resp.Header.Get("Retry-After"))
				}
			})
		}
	})
}

// TestSlowHeaders: a client that never finishes its headers is disconnected
// after ReadHeaderTimeout.
func TestSlowHeaders(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		f := newFront(t, kind, []float64{1}, 1, 0, Options{})
		// The server's header deadline starts when it accepts the connection,
		// so the clock starts before the dial (not after it: on a busy machine
		// this goroutine may run again only long after the server accepted).
		start := time.Now()
		addr := strings.TrimPrefix(serveFront(t, kind, f.h, httpfront.ServerOptions{ReadHeaderTimeout: 200 * time.Millisecond}), "http://")
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Partial: "); err != nil {
			t.Fatalf("write: %v", err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		rest, err := io.ReadAll(conn) // returns at EOF: the server closed the connection
		if err != nil {
			t.Fatalf("server did not close the connection: %v (read %q)", err, rest)
		}
		if el := time.Since(start); el < 150*time.Millisecond || el > 3*time.Second {
			t.Fatalf("closed after %v, want about 200ms", el)
		}
		if len(rest) > 0 && !strings.HasPrefix(string(rest), "HTTP/1.1 408") {
			t.Fatalf("unexpected answer %q", rest)
		}
	})
}

// TestSlowBody: a client that sends its header but not its body within
// BodyReadTimeout gets a 400 in the OpenAI shape.
func TestSlowBody(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		f := newFront(t, kind, []float64{1}, 1, 0, Options{BodyReadTimeout: 200 * time.Millisecond})
		conn, err := net.Dial("tcp", strings.TrimPrefix(f.url, "http://"))
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer conn.Close()
		start := time.Now()
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody[:10])
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("read response: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if el := time.Since(start); el < 150*time.Millisecond || el > 3*time.Second {
			t.Fatalf("answered after %v, want about 200ms", el)
		}
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("status %d, want 400: %s", resp.StatusCode, body)
		}
		assertOpenAIError(t, body, protocol.ErrTypeInvalidRequest)
		if f.engines[0].requests.Load() != 0 {
			t.Fatalf("the engine was called")
		}
	})
}

// TestIdleTimeout: the server closes a keep-alive connection idle for
// IdleTimeout.
func TestIdleTimeout(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		f := newFront(t, kind, []float64{1}, 1, 0, Options{})
		addr := strings.TrimPrefix(serveFront(t, kind, f.h, httpfront.ServerOptions{IdleTimeout: 200 * time.Millisecond}), "http://")
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer conn.Close()
		// The idle deadline starts after the answer is written, so after
		// this: the connection cannot close sooner than 200ms from here.
		start := time.Now()
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody)
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("read response: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("status %d, close %v: want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
		}
		rest, err := io.ReadAll(br) // returns at EOF: the server closed the connection
		if err != nil {
			t.Fatalf("server did not close the idle connection: %v (read %q)", err, rest)
		}
		if el := time.Since(start); el < 190*time.Millisecond || el > 3*time.Second || len(rest) > 0 {
			t.Fatalf("closed after %v with %q, want about 200ms and nothing", el, rest)
		}
	})
}

// TestRawInvalidHeaderValue: header bytes that HTTP forbids are refused
// with a 400 before anything is forwarded (by net/http itself, or by
// fasthttp or the handler's header check).
func TestRawInvalidHeaderValue(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		f := newFront(t, kind, []float64{1}, 1, 0, Options{})
		conn, err := net.Dial("tcp", strings.TrimPrefix(f.url, "http://"))
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Session-Id: a\x01b\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody)
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("read response: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("status %d, want 400", resp.StatusCode)
		}
		if f.engines[0].requests.Load() != 0 {
			t.Fatalf("the engine was called")
		}
	})
}

func TestStatusEndpoints(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		f := newFront(t, kind, []float64{0.6, 0.3}, 1, 0, Options{})
		resp := f.post(t, "/v1/chat/completions", chatBody, nil)
		resp.Body.Close()
		cases := []struct {
			path   string
			status int
			want   []string
		}{
			{"/v1/models", 200, []string{`"object":"list"`, `"id":"m"`}},
			{"/healthz", 200, []string{`"ok"`}},
			{"/readyz", 200, []string{`"ready":true`, `"mode":"snapshot"`, `"generation":7`, `"snapshot_age_seconds"`, `"engines":2`}},
			{"/metrics", 200, []string{
				`switchyard_router_requests_total{code="200",model="m"} 1`,
				`switchyard_router_engine_requests_total`,
				`switchyard_router_request_duration_seconds_bucket`,
				`switchyard_router_ttft_seconds_bucket`,
				`switchyard_router_in_flight_requests{model="m"} 0`,
				`switchyard_router_snapshot_generation{model="m"} 7`,
				`switchyard_router_local_policy{model="m"} 0`,
			}},
		}
		for _, c := range cases {
			t.Run(c.path, func(t *testing.T) {
				// Poll: the handler lowers the in-flight gauge after the answer
				// reached the client, so the first scrape may still count it.
				var body []byte
				var missing []string
				deadline := time.Now().Add(2 * time.Second)
				for {
					resp, err := f.client.Get(f.url + c.path)
					if err != nil {
						t.Fatalf("GET %s: %v", c.path, err)
					}
					body, _ = io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != c.status {
						t.Fatalf("status %d, want %d", resp.StatusCode, c.status)
					}
					missing = missing[:0]
					for _, w := range c.want {
						if !strings.Contains(string(body), w) {
							missing = append(missing, w)
						}
					}
					if len(missing) == 0 || time.Now().After(deadline) {
						break
					}
					time.Sleep(10 * time.Millisecond)
				}
				for _, w := range missing {
					t.Errorf("body lacks %q:\n%s", w, body)
				}
			})
		}
		// Not ready without tables.
		f.tables.Delete("m")
		resp, err := f.client.Get(f.url + "/readyz")
		if err != nil {
			t.Fatalf("GET /readyz: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("/readyz without tables: status %d, want 503", resp.StatusCode)
		}
	})
}

// panicTransport is a Transport whose Forward panics, as a bug would.
type panicTransport struct{}

func (panicTransport) Forward(context.Context, selection.Engine, *upstream.Request) (*upstream.Response, error) {
	panic(http.ErrAbortHandler) // the panic net/http recovers without logging
}

// TestPanicInRequestKeepsServing: a request whose handling panics loses its
// connection, the front's in-flight gauge is lowered again, and the server
// goes on serving (net/http recovers panics itself; fasthttp would end the
// process without the front's recover). The engine's in-flight count taken
// by forward before the panic is not released, on either front.
func TestPanicInRequestKeepsServing(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		f := newFront(t, kind, []float64{1}, 1, 0, Options{Transport: panicTransport{}})
		for i := 0; i < 2; i++ {
			resp, err := f.client.Post(f.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
			if err == nil {
				resp.Body.Close()
				t.Fatalf("request %d: status %d, want the connection closed without an answer", i, resp.StatusCode)
			}
		}
		resp, err := f.client.Get(f.url + "/healthz")
		if err != nil {
			t.Fatalf("GET /healthz after the panics: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /healthz after the panics: status %d", resp.StatusCode)
		}
		if v := metricValue(f.h.metrics.inFlight.WithLabelValues("m")); v != 0 {
			t.Fatalf("in-flight gauge %v after the panics, want 0", v)
		}
	})
}

func TestWriteError(t *testing.T) {
	rec := httptest.NewRecorder()
	protocol.WriteError(rec, protocol.NewAPIError(http.StatusNotFound, protocol.ErrTypeNotFound, "model_not_found", "model", "no such model"))
	if rec.Code != http.StatusNotFound || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, content type %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	assertOpenAIError(t, rec.Body.Bytes(), protocol.ErrTypeNotFound)
}

// assertOpenAIError checks that body is an OpenAI-shaped error of type typ.
func assertOpenAIError(t testing.TB, body []byte, typ string) {
	t.Helper()
	var v struct {
		Error *struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &v); err != nil || v.Error == nil {
		t.Fatalf("body %q is not an OpenAI error: %v", body, err)
	}
	if v.Error.Message == "" || v.Error.Type != typ {
		t.Fatalf("error %+v, want type %q and a message", *v.Error, typ)
	}
	var raw map[string]map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := raw["error"][k]; !ok {
			t.Fatalf("body %q lacks error.%s", body, k)
		}
	}
}
