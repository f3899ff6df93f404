package router

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"strconv"
	"testing"
)

// wholeEngine is a raw HTTP/1.1 engine on loopback that answers every
// request at once with a fixed whole JSON answer, as bench/proxy's trivial
// engine does; it parses only what it must, so that an in-process benchmark
// measures the router rather than the engine.
type wholeEngine struct{ ln net.Listener }

const wholeAnswer = `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}`

func newWholeEngine(tb testing.TB) *wholeEngine {
	tb.Helper()
	e := &wholeEngine{}
	e.ln = serveLoopback(tb, e.serve)
	return e
}

func (e *wholeEngine) url() string { return "http://" + e.ln.Addr().String() }

func (e *wholeEngine) serve(c net.Conn) {
	defer c.Close()
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Switchyard-Engine: e\r\nContent-Length: " +
		strconv.Itoa(len(wholeAnswer)) + "\r\n\r\n" + wholeAnswer)
	br := bufio.NewReader(c)
	for {
		n, err := readRawHead(br)
		if err != nil {
			return
		}
		if _, err := br.Discard(n); err != nil {
			return
		}
		if _, err := c.Write(resp); err != nil {
			return
		}
	}
}

// readRawHead reads an HTTP/1.1 message head from br and returns its
// Content-Length (0 without one).
func readRawHead(br *bufio.Reader) (int, error) {
	n := 0
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		if len(line) <= 2 {
			return n, nil
		}
		if k, v, ok := bytes.Cut(line, []byte(":")); ok && bytes.EqualFold(k, []byte("Content-Length")) {
			if n, err = strconv.Atoi(string(bytes.TrimSpace(v))); err != nil {
				return 0, err
			}
		}
	}
}

// BenchmarkProxyWhole measures one whole (non-streamed) request's trip
// through the router front of each server kind: a raw keep-alive client
// sends it, the router parses, routes and forwards it to a raw engine on
// loopback and relays the engine's answer (ns/op per request, allocs/op
// nearly all the router's, as client and engine allocate next to nothing).
// Client, engine and router share the process, so compare builds or kinds
// within one run (e.g. -count 5), not with other machines.
func BenchmarkProxyWhole(b *testing.B) {
	for _, kind := range serverKinds() {
		b.Run(string(kind), func(b *testing.B) {
			e := newWholeEngine(b)
			url := serveOneEngine(b, kind, e.url())
			c, err := net.Dial("tcp", url[len("http://"):])
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			req := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: " +
				strconv.Itoa(len(chatBody)) + "\r\n\r\n" + chatBody)
			br := bufio.NewReader(c)
			var body [512]byte
			one := func() {
				if _, err := c.Write(req); err != nil {
					b.Fatalf("write: %v", err)
				}
				n, err := readRawHead(br)
				if err != nil {
					b.Fatalf("read answer head: %v", err)
				}
				if n != len(wholeAnswer) {
					b.Fatalf("answer of %d bytes, want %d", n, len(wholeAnswer))
				}
				if _, err := io.ReadFull(br, body[:n]); err != nil {
					b.Fatalf("read answer body: %v", err)
				}
				if string(body[:n]) != wholeAnswer {
					b.Fatalf("answer %q, want %q", body[:n], wholeAnswer)
				}
			}
			one() // warm the connections
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				one()
			}
		})
	}
}
