package router

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// pingPongEngine is a raw HTTP/1.1 engine on loopback whose streamed
// answers send their next SSE event only once the client took the
// previous one (a receive on next), so that every event crosses the router
// on its own: each event costs the router a wake-up, a read from the engine
// and a write to the client, as tokens paced by a real engine do.
type pingPongEngine struct {
	ln     net.Listener
	events int
	next   chan struct{}
}

func newPingPongEngine(tb testing.TB, events int) *pingPongEngine {
	tb.Helper()
	e := &pingPongEngine{events: events, next: make(chan struct{}, 1)}
	e.ln = serveLoopback(tb, e.serve)
	return e
}

func (e *pingPongEngine) url() string { return "http://" + e.ln.Addr().String() }

// serveLoopback listens on a random port of 127.0.0.1 and serves every
// connection accepted there in its own goroutine, until the test ends.
func serveLoopback(tb testing.TB, serve func(net.Conn)) net.Listener {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("listen: %v", err)
	}
	tb.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	return ln
}

func (e *pingPongEngine) serve(c net.Conn) {
	defer c.Close()
	br, bw := bufio.NewReader(c), bufio.NewWriter(c)
	for {
		r, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(bw, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		for i := 0; i < e.events; i++ {
			ev := fmt.Sprintf("data: {\"i\":%d,\"choices\":[{\"delta\":{\"content\":\"tok\"}}]}\n\n", i)
			fmt.Fprintf(bw, "%x\r\n%s\r\n", len(ev), ev)
			if bw.Flush() != nil {
				return
			}
			<-e.next
		}
		_, _ = io.WriteString(bw, "0\r\n\r\n")
		if bw.Flush() != nil {
			return
		}
	}
}

// BenchmarkStreamRelay measures a streamed event's trip through the router
// front of each server kind, one event at a time: the engine sends it, the
// router relays and flushes it, the client reads it (ns/event; whole
// streams of 200 events run, so ns/op is not per event).
// Client, engine and router share the process, so compare the kinds with
// each other within one run (e.g. -count 5), not with other machines.
func BenchmarkStreamRelay(b *testing.B) {
	const events = 200
	for _, kind := range serverKinds() {
		b.Run(string(kind), func(b *testing.B) {
			e := newPingPongEngine(b, events)
			url := serveOneEngine(b, kind, e.url())
			client := testClient(b)
			stream := func() int {
				resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatStreamBody))
				if err != nil {
					b.Fatalf("POST: %v", err)
				}
				defer resp.Body.Close()
				br := bufio.NewReader(resp.Body)
				n := 0
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return n
					}
					if strings.HasPrefix(line, "data: ") {
						n++
						e.next <- struct{}{}
					}
				}
			}
			stream() // warm the connections
			b.ResetTimer()
			done := 0
			for done < b.N {
				if n := stream(); n != events {
					b.Fatalf("%s: relayed %d events, want %d", kind, n, events)
				}
				done += events
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(done), "ns/event")
		})
	}
}
