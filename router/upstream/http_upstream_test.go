package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/selection"
)

// countingServer is an httptest server that counts the connections it
// accepted.
type countingServer struct {
	srv   *httptest.Server
	conns atomic.Int64
}

func newCountingServer(t *testing.T, h http.HandlerFunc) *countingServer {
	cs := &countingServer{}
	cs.srv = httptest.NewUnstartedServer(h)
	cs.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			cs.conns.Add(1)
		}
	}
	cs.srv.Start()
	t.Cleanup(cs.srv.Close)
	return cs
}

func forwardAll(t *testing.T, tr *HTTPTransport, ctx context.Context, e selection.Engine, req *Request) (*Response, string) {
	t.Helper()
	resp, err := tr.Forward(ctx, e, req)
	if err != nil {
		t.Fatalf("Forward to %s: %v", e.URL, err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body from %s: %v", e.URL, err)
	}
	if err := resp.Body.Close(); err != nil {
		t.Fatalf("close body: %v", err)
	}
	return resp, string(b)
}

func upReq(body string) *Request {
	return &Request{Endpoint: protocol.EndpointChat, Model: "m", RequestID: "req-1", Body: []byte(body),
		Header: http.Header{"Authorization": {"Bearer k"}, messages.HeaderSessionID: {"s1"}}}
}

func TestUpstreamReusesConnectionAndPassesHeaders(t *testing.T) {
	var mu sync.Mutex
	var got []http.Header
	var bodies []string
	cs := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, r.Header.Clone())
		bodies = append(bodies, r.Method+" "+r.URL.Path+" "+string(b))
		mu.Unlock()
		w.Header().Set("X-Engine-Note", "n1")
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(string(b), "chunked") {
			w.(http.Flusher).Flush() // no Content-Length: chunked
		}
		fmt.Fprintf(w, `{"echo":%q}`, b)
	})
	tr := NewHTTPTransport(HTTPTransportOptions{})
	t.Cleanup(tr.CloseIdleConnections)
	e := selection.Engine{Name: "e1", URL: cs.srv.URL + "/"}
	for i := 0; i < 20; i++ {
		body := fmt.Sprintf(`{"n":%d}`, i)
		if i%2 == 1 {
			body = fmt.Sprintf(`{"n":%d,"chunked":1}`, i)
		}
		resp, b := forwardAll(t, tr, context.Background(), e, upReq(body))
		if resp.Status != 200 || resp.Header.Get("X-Engine-Note") != "n1" || resp.Header.Get("Transfer-Encoding") != "" {
			t.Fatalf("request %d: status %d header %v", i, resp.Status, resp.Header)
		}
		if want := fmt.Sprintf(`{"echo":%q}`, body); b != want {
			t.Fatalf("request %d: body %q, want %q", i, b, want)
		}
	}
	if n := cs.conns.Load(); n != 1 {
		t.Fatalf("20 sequential requests used %d connections, want 1 (keep-alive reuse)", n)
	}
	mu.Lock()
	defer mu.Unlock()
	h := got[0]
	if h.Get("Authorization") != "Bearer k" || h.Get(messages.HeaderSessionID) != "s1" || h.Get(messages.HeaderRequestID) != "req-1" ||
		h.Get("Content-Type") != "application/json" {
		t.Fatalf("engine got headers %v", h)
	}
	if bodies[0] != `POST /v1/chat/completions {"n":0}` {
		t.Fatalf("engine got %q", bodies[0])
	}
}

func TestUpstreamStreamsEventsAsTheyCome(t *testing.T) {
	next := make(chan struct{})
	cs := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if b, _ := io.ReadAll(r.Body); string(b) != `{"stream":true}` {
			fmt.Fprint(w, "{}")
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 3; i++ {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
		}
	})
	tr := NewHTTPTransport(HTTPTransportOptions{})
	t.Cleanup(tr.CloseIdleConnections)
	resp, err := tr.Forward(context.Background(), selection.Engine{Name: "e1", URL: cs.srv.URL}, upReq(`{"stream":true}`))
	if err != nil {
		t.Fatalf("Forward: %v", err)
	}
	buf := make([]byte, 1024)
	for i := 0; i < 3; i++ {
		// The engine sends event i+1 only after this read returned event i.
		k, err := resp.Body.Read(buf)
		if want := fmt.Sprintf("data: %d\n\n", i); string(buf[:k]) != want || err != nil {
			t.Fatalf("read %d: %q, %v; want %q", i, buf[:k], err, want)
		}
		next <- struct{}{}
	}
	if rest, err := io.ReadAll(resp.Body); err != nil || len(rest) != 0 {
		t.Fatalf("after the events: %q, %v", rest, err)
	}
	_ = resp.Body.Close()
	forwardAll(t, tr, context.Background(), selection.Engine{Name: "e1", URL: cs.srv.URL}, upReq(`{}`))
	if n := cs.conns.Load(); n != 1 {
		t.Fatalf("a chunked stream read to its end left its connection unused: %d connections", n)
	}
}

func TestUpstreamCancelClosesConnection(t *testing.T) {
	gone := make(chan struct{})
	cs := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: 0\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(gone)
	})
	tr := NewHTTPTransport(HTTPTransportOptions{})
	t.Cleanup(tr.CloseIdleConnections)
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := tr.Forward(ctx, selection.Engine{Name: "e1", URL: cs.srv.URL}, upReq(`{}`))
	if err != nil {
		t.Fatalf("Forward: %v", err)
	}
	buf := make([]byte, 64)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatalf("first read: %v", err)
	}
	readErr := make(chan error, 1)
	go func() {
		_, err := resp.Body.Read(buf) // blocks: the engine sends nothing more
		readErr <- err
	}()
	cancel()
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the engine did not see the request end after the context was cancelled")
	}
	select {
	case err := <-readErr:
		if err == nil {
			t.Fatal("a read blocked when the context was cancelled returned no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a read blocked when the context was cancelled did not return")
	}
	_ = resp.Body.Close()

	// Cancelled before the answer: Forward fails with the context's error.
	hang := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // the server notices a closed connection once the body is read
		<-r.Context().Done()
	})
	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if _, err := tr.Forward(ctx2, selection.Engine{Name: "e2", URL: hang.srv.URL}, upReq(`{}`)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Forward to a hanging engine past the deadline: %v, want context.DeadlineExceeded", err)
	}
}

// rawEngine serves each accepted connection with serve, on a real socket.
func rawEngine(t *testing.T, serve func(c net.Conn, br *bufio.Reader)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				serve(c, bufio.NewReader(c))
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// readRequest reads one request (head and Content-Length body) from br.
func readRequest(br *bufio.Reader) error {
	req, err := http.ReadRequest(br)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, req.Body)
	return err
}

func TestUpstreamStaleKeepAliveIsRedialled(t *testing.T) {
	var conns atomic.Int64
	url := rawEngine(t, func(c net.Conn, br *bufio.Reader) {
		conns.Add(1)
		// One answer per connection, then close it without saying so: the
		// client's pooled connection is stale.
		if readRequest(br) != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	})
	tr := NewHTTPTransport(HTTPTransportOptions{})
	t.Cleanup(tr.CloseIdleConnections)
	for i := 0; i < 3; i++ {
		resp, b := forwardAll(t, tr, context.Background(), selection.Engine{Name: "e", URL: url}, upReq(`{}`))
		if resp.Status != 200 || b != "ok" {
			t.Fatalf("request %d: %d %q", i, resp.Status, b)
		}
	}
	if n := conns.Load(); n != 3 {
		t.Fatalf("%d connections, want 3 (one per request after each stale one)", n)
	}
}

func TestUpstreamBadResponses(t *testing.T) {
	cases := []struct {
		name, answer string
		forwardErr   bool // Forward fails; else reading the body does
	}{
		{"garbage status line", "HTTP/9 xx\r\n\r\n", true},
		{"not http", "hello\r\n\r\n", true},
		{"no head end", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n", true},
		{"bad header line", "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", true},
		{"unsupported coding", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", true},
		{"conflicting lengths", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok", true},
		{"negative length", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", true},
		{"upgrade", "HTTP/1.1 101 Switching Protocols\r\n\r\n", true},
		{"short body", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nok", false},
		{"bad chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n", false},
		{"cut chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nok", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			url := rawEngine(t, func(c net.Conn, br *bufio.Reader) {
				if readRequest(br) == nil {
					_, _ = io.WriteString(c, tc.answer)
				}
			})
			tr := NewHTTPTransport(HTTPTransportOptions{})
			t.Cleanup(tr.CloseIdleConnections)
			resp, err := tr.Forward(context.Background(), selection.Engine{Name: "e", URL: url}, upReq(`{}`))
			if tc.forwardErr {
				if err == nil {
					_ = resp.Body.Close()
					t.Fatalf("Forward accepted %q", tc.answer)
				}
				if !strings.Contains(err.Error(), `engine "e"`) {
					t.Fatalf("error %q does not name the engine", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Forward: %v", err)
			}
			defer func() { _ = resp.Body.Close() }()
			if _, err := io.ReadAll(resp.Body); err == nil {
				t.Fatalf("reading the body of %q succeeded", tc.answer)
			}
		})
	}
}

func TestUpstreamConnectionCloseAndInterim(t *testing.T) {
	var conns atomic.Int64
	url := rawEngine(t, func(c net.Conn, br *bufio.Reader) {
		conns.Add(1)
		if readRequest(br) == nil {
			_, _ = io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil close")
		}
	})
	tr := NewHTTPTransport(HTTPTransportOptions{})
	t.Cleanup(tr.CloseIdleConnections)
	for i := 0; i < 2; i++ {
		resp, b := forwardAll(t, tr, context.Background(), selection.Engine{Name: "e", URL: url}, upReq(`{}`))
		if resp.Status != 200 || b != "until close" {
			t.Fatalf("request %d: %d %q", i, resp.Status, b)
		}
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (Connection: close is not reused)", n)
	}
}

// FuzzResponseParse feeds arbitrary bytes to the response parser and body
// reader, as an engine (or anything at its address) could send them: no
// panic, and a parsed response's framing is consistent.
func FuzzResponseParse(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-T: 1\r\n\r\n"))
	f.Add([]byte("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 204 No Content\r\n\r\n"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nbody"))
	f.Add([]byte("HTTP/1.1 503 x\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n"))
	f.Add([]byte("HTTP/1.1 200 OK\r\ncontent-TYPE: text/event-stream\r\nx-request-ID: a\r\nX-Switchyard-Engine: e\r\nx-a-b-c: 1\r\nx-a-b-c: 2\r\nContent-Length: 0\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		br := bufio.NewReaderSize(bytes.NewReader(data), 4096)
		head, err := readResponseHead(br)
		if err != nil {
			return
		}
		if head.status < 200 || head.status > 999 {
			t.Fatalf("parsed status %d", head.status)
		}
		if head.chunked && head.contentLength >= 0 {
			t.Fatalf("chunked with a Content-Length %d", head.contentLength)
		}
		if head.header.Get("Transfer-Encoding") != "" {
			t.Fatal("Transfer-Encoding left in the header")
		}
		for k := range head.header {
			if want := textproto.CanonicalMIMEHeaderKey(k); k != want {
				t.Fatalf("header key %q, canonical %q", k, want)
			}
		}
		b := &upstreamBody{c: &upstreamConn{br: br}, left: head.contentLength, done: head.noBody}
		if head.chunked {
			b.chunks = httputil.NewChunkedReader(br)
		}
		n, _ := io.Copy(io.Discard, b)
		if head.contentLength >= 0 && n > head.contentLength {
			t.Fatalf("read %d body bytes past Content-Length %d", n, head.contentLength)
		}
	})
}

func TestUpstreamIdleTimeoutAndBasePath(t *testing.T) {
	var mu sync.Mutex
	var paths []string
	cs := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		fmt.Fprint(w, "{}")
	})
	tr := NewHTTPTransport(HTTPTransportOptions{IdleConnTimeout: time.Minute})
	t.Cleanup(tr.CloseIdleConnections)
	now := time.Now()
	tr.now = func() time.Time { return now }
	e := selection.Engine{Name: "e", URL: cs.srv.URL + "/base/"}
	forwardAll(t, tr, context.Background(), e, upReq(`{}`))
	now = now.Add(30 * time.Second)
	forwardAll(t, tr, context.Background(), e, upReq(`{}`))
	if n := cs.conns.Load(); n != 1 {
		t.Fatalf("a connection idle 30 s of a 1 min timeout was not reused: %d connections", n)
	}
	now = now.Add(61 * time.Second)
	forwardAll(t, tr, context.Background(), e, upReq(`{}`))
	if n := cs.conns.Load(); n != 2 {
		t.Fatalf("a connection idle past the timeout was reused: %d connections, want 2", n)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range paths {
		if p != "/base/v1/chat/completions" {
			t.Fatalf("engine got path %q, want the base URL's path prefix", p)
		}
	}
	for _, bad := range []string{"https://h", "http://u:p@h", "http://h?q=1", "http://"} {
		if u, err := url.Parse(bad); err == nil {
			if _, err := newUpstreamPool(u); err == nil {
				t.Errorf("newUpstreamPool(%q) accepted it", bad)
			}
		}
	}
	u, _ := url.Parse("http://[::1]/x")
	if p, err := newUpstreamPool(u); err != nil || p.addr != "[::1]:80" || p.prefix != "/x" {
		t.Fatalf("newUpstreamPool(%q) = %+v, %v", u, p, err)
	}
}
