package router_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/natsfront"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/router/upstream"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestNATSFrontConcurrencyLimit: with MaxConcurrent requests in progress,
// the next one gets a fast 429 (router_overloaded) while those in progress
// finish normally; once they have, a burst of concurrent requests larger
// than the idle worker pool is served in full.
func TestNATSFrontConcurrencyLimit(t *testing.T) {
	env := testenv.StartNATS(t)
	engine := env.Dial(t, "engine")
	var mu sync.Mutex
	var held []string // reply subjects of requests the engine holds
	hold := true
	answer := func(reply string) {
		r := nats.NewMsg(reply)
		r.Header.Set(messages.HeaderStatus, "200")
		r.Header.Set(messages.HeaderLast, "true")
		r.Data = []byte(`{"object":"chat.completion"}`)
		_ = engine.PublishMsg(r)
	}
	sub, err := engine.Subscribe("sy.infer.m.e1", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		if hold {
			held = append(held, m.Reply)
			return
		}
		answer(m.Reply)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := engine.Flush(); err != nil {
		t.Fatal(err)
	}

	nc := env.Dial(t, "router")
	tables := router.NewStaticTables()
	tb, err := selection.NewTable([]selection.Engine{{Name: "e1", Subject: "sy.infer.m.e1", Weight: 1}}, selection.TableOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tables.Set("m", tb, control.Info{Generation: 1, Mode: control.ModeSnapshot, Created: time.Now()})
	tr, err := upstream.NewNATSTransport(upstream.NATSTransportOptions{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	h, err := router.NewHandler(router.Options{Tables: tables, Cluster: "A", Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	const limit = 2
	front, err := natsfront.New(natsfront.Options{Conn: nc, Cluster: "A", Pipeline: h, MaxConcurrent: limit})
	if err != nil {
		t.Fatal(err)
	}
	client := runNATSFront(t, env, front, "A")

	// request sends a non-streamed request (one reply) from any goroutine.
	request := func(subject string) string {
		r, err := client.Request(subject, []byte(chatJSON("m", false, "x")), 10*time.Second)
		if err != nil {
			return err.Error()
		}
		return r.Header.Get(messages.HeaderStatus)
	}
	results := make(chan string, limit)
	for range limit {
		go func() { results <- request("sy.req.A.m") }()
	}
	testenv.WaitFor(t, 5*time.Second, "the engine holds the first requests", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(held) == limit
	})
	start := time.Now()
	msgs := natsRequest(t, client, "sy.req.A.m", chatJSON("m", false, "x"), nil)
	var body struct {
		Error struct{ Code string }
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the request over the limit was answered after %v", d)
	}
	if len(msgs) != 1 || msgs[0].Header.Get(messages.HeaderStatus) != "429" || msgs[0].Header.Get("Retry-After") != "1" ||
		json.Unmarshal(msgs[0].Data, &body) != nil || body.Error.Code != "router_overloaded" {
		t.Fatalf("over the limit: %d messages, headers %v, body %q", len(msgs), msgs[0].Header, msgs[0].Data)
	}
	mu.Lock()
	hold = false
	for _, r := range held {
		answer(r)
	}
	mu.Unlock()
	for range limit {
		if s := <-results; s != "200" {
			t.Fatalf("held request: %s", s)
		}
	}

	// A burst beyond the idle pool, within the limit: every request served.
	front2, err := natsfront.New(natsfront.Options{Conn: nc, Cluster: "B", Pipeline: h, MaxConcurrent: 1000})
	if err != nil {
		t.Fatal(err)
	}
	runNATSFront(t, env, front2, "B")
	const burst = 200
	var wg sync.WaitGroup
	statuses := make(chan string, burst)
	for range burst {
		wg.Go(func() { statuses <- request("sy.req.B.m") })
	}
	wg.Wait()
	close(statuses)
	n := 0
	for s := range statuses {
		if s != "200" {
			t.Fatalf("burst: status %s", s)
		}
		n++
	}
	if n != burst {
		t.Fatalf("burst: %d answers, want %d", n, burst)
	}
}

// runNATSFront runs front, of cluster, until the test ends and returns a
// client connection once the front answers on sy.req.<cluster>.m (a request
// without a body gets a 400 reply, which no report counts).
func runNATSFront(t *testing.T, env *testenv.NATS, front *natsfront.Front, cluster string) *nats.Conn {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = front.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	client := env.Dial(t, "client")
	testenv.WaitFor(t, 5*time.Second, "the front of "+cluster+" subscribed", func() bool {
		_, err := client.Request("sy.req."+cluster+".m", nil, 100*time.Millisecond)
		return err == nil
	})
	return client
}
