package router_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/natsfront"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/router/upstream"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/testenv"
)

// linesWith counts the lines of log output that contain substr.
func linesWith(log, substr string) int {
	n := 0
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, substr) {
			n++
		}
	}
	return n
}

// publishOnce publishes one signal of each engine.
func publishOnce(nc *nats.Conn, names streams.Names, engines ...fakeSignal) {
	p := &signalPublisher{engines: map[string]fakeSignal{}}
	for _, e := range engines {
		p.set(e)
	}
	p.publishAll(nc, names)
}

// TestSignalsPoison sends the router's signal subscription thousands of
// one-byte messages on distinct subjects and a signal its handling panics
// on: the router stays up, counts each by reason, writes a bounded number
// of log lines, and still takes the valid signals after them.
func TestSignalsPoison(t *testing.T) {
	env := testenv.StartNATS(t)
	reg := prometheus.NewRegistry()
	var logs testenv.Buffer
	sigs, err := control.NewSignals(control.SignalOptions{
		Conn: env.Dial(t, "router"), Names: env.Names, Registry: reg, Logger: zerolog.New(&logs),
		// A callback that panics on one engine: a bug reached by one input.
		OnSignal: func(sig *messages.EngineSignal) {
			if sig.Engine == "boom" {
				panic("callback bug on " + sig.Engine)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sigs.Run(ctx) }()
	defer func() { cancel(); <-done }()
	pub := env.Dial(t, "publisher")
	// The subscription is live once a valid signal gets through.
	publishOnce(pub, env.Names, fakeSignal{model: "m", engine: "e0", capacity: 10, health: 1})
	testenv.WaitFor(t, 5*time.Second, "subscription live", func() bool {
		publishOnce(pub, env.Names, fakeSignal{model: "m", engine: "e0", capacity: 10, health: 1})
		_, ok := sigs.Engine("m", "e0")
		return ok
	})

	const flood = 3000
	for i := range flood {
		if err := pub.Publish(fmt.Sprintf("sy.signal.m.e%d", i+1), []byte{0xc1}); err != nil {
			t.Fatal(err)
		}
	}
	publishOnce(pub, env.Names, fakeSignal{model: "m", engine: "boom", capacity: 10, health: 1})
	publishOnce(pub, env.Names, fakeSignal{model: "m", engine: "e1", capacity: 10, health: 1})
	if err := pub.Flush(); err != nil {
		t.Fatal(err)
	}
	rejected := "switchyard_router_signals_rejected_total"
	testenv.WaitFor(t, 10*time.Second, "flood and panic counted", func() bool {
		return testenv.MetricSum(t, reg, rejected, map[string]string{"reason": "decode"}) == flood &&
			testenv.MetricSum(t, reg, rejected, map[string]string{"reason": "panic"}) == 1
	})
	testenv.WaitFor(t, 5*time.Second, "the valid signal after the poison taken", func() bool {
		_, ok := sigs.Engine("m", "e1")
		return ok
	})
	if n := testenv.MetricSum(t, reg, "switchyard_router_handler_panics_total", map[string]string{"handler": "signals"}); n != 1 {
		t.Errorf("%v panics counted, want 1", n)
	}
	if n := linesWith(logs.String(), "rejected an engine signal"); n == 0 || n > 20 {
		t.Errorf("%d log lines for %d bad signals on distinct subjects, want 1..20", n, flood)
	}
	if n := linesWith(logs.String(), "handler panicked"); n != 1 {
		t.Errorf("%d panic log lines, want 1", n)
	}
	if linesWith(logs.String(), "sy.signal.m.boom") == 0 {
		t.Error("the panic's log line does not name its subject")
	}
	select {
	case err := <-done:
		t.Fatalf("signals stopped: %v", err)
	default:
	}
}

// TestSnapshotStorePoison writes undecodable values and a snapshot whose
// installation panics to sy_weights: the store keeps watching, counts
// them, and installs the valid snapshot after them.
func TestSnapshotStorePoison(t *testing.T) {
	env := testenv.StartNATS(t)
	reg := prometheus.NewRegistry()
	st, err := control.NewSnapshotStore(control.StoreOptions{Conn: env.Conn, Cluster: "A", Registry: reg, Logger: zerolog.Nop(),
		// A handler bug reached by one value.
		OnValue: func(key string, _ []byte) {
			if strings.HasPrefix(key, "boom.") {
				panic("handler bug on " + key)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = st.Run(ctx) }()
	defer func() { cancel(); <-done }()
	kv, err := env.JS.KeyValue(ctx, env.Names.WeightsBucket)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range [][]byte{{0xc1}, []byte("\x81\xa1v"), {0xdd, 0x7f, 0xff, 0xff}} {
		if _, err := kv.Put(ctx, fmt.Sprintf("m%d.A", i), v); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	putSnapshot(t, env.JS, env.Names, snapshot("boom", "A", 1, now, map[string]float64{"e1": 1}))
	putSnapshot(t, env.JS, env.Names, snapshot("m", "A", 4, now, map[string]float64{"e1": 1}))
	waitInstalled(t, st, "m", 4, 10*time.Second)
	if n := testenv.MetricSum(t, reg, "switchyard_router_snapshots_rejected_total", map[string]string{"reason": "decode"}); n != 3 {
		t.Errorf("%v undecodable snapshots counted, want 3", n)
	}
	if n := testenv.MetricSum(t, reg, "switchyard_router_handler_panics_total", map[string]string{"handler": "weights"}); n != 1 {
		t.Errorf("%v panics counted, want 1", n)
	}
	if n := testenv.MetricSum(t, reg, "switchyard_router_snapshots_rejected_total", map[string]string{"reason": "panic"}); n != 1 {
		t.Errorf("%v snapshots rejected for a panic, want 1", n)
	}
	if _, _, ok := st.Table("boom"); ok {
		t.Error("the snapshot the handler panicked on was installed")
	}
	if !st.Watching() {
		t.Error("the store stopped watching")
	}
}

// TestServiceServesThroughPoison floods a running router with bad signals
// on distinct subjects and bad weight values: it keeps serving every
// request from its snapshot and counts the flood.
func TestServiceServesThroughPoison(t *testing.T) {
	env := testenv.StartNATS(t)
	e1 := newHTTPEngine(t, "e1")
	publishSignals(t, env.Dial(t, "engines"), env.Names, 100*time.Millisecond,
		fakeSignal{model: "m", engine: "e1", capacity: 100, health: 1, url: e1.srv.URL})
	svc := runService(t, router.ServiceOptions{Conn: env.Dial(t, "router"), Cluster: "A", Router: "r1"})
	putSnapshot(t, env.JS, env.Names, snapshot("m", "A", 3, time.Now(), map[string]float64{"e1": 1}))
	waitInstalled(t, svc.Store(), "m", 3, 5*time.Second)

	pub := env.Dial(t, "hostile")
	const flood = 2000
	for i := range flood {
		if err := pub.Publish(fmt.Sprintf("sy.signal.m.x%d", i), []byte{0xdd, 0x7f, 0xff, 0xff}); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	kv, err := env.JS.KeyValue(ctx, env.Names.WeightsBucket)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if _, err := kv.Put(ctx, fmt.Sprintf("p%d.A", i), []byte{0xc1}); err != nil {
			t.Fatal(err)
		}
	}
	reg := svc.Handler().Metrics()
	testenv.WaitFor(t, 10*time.Second, "flood counted", func() bool {
		return testenv.MetricSum(t, reg, "switchyard_router_signals_rejected_total", nil) >= flood &&
			testenv.MetricSum(t, reg, "switchyard_router_snapshots_rejected_total", map[string]string{"reason": "decode"}) == 50
	})
	client := &http.Client{Timeout: 10 * time.Second}
	for i := range 20 {
		status, eng, body := postChat(t, client, svc.Addr(), chatJSON("m", false, "hi"), "")
		if status != 200 || eng != "e1" {
			t.Fatalf("request %d after the flood: status %d engine %q body %s", i, status, eng, body)
		}
	}
	if _, info, _ := svc.Store().Table("m"); info.Generation != 3 || info.Mode != control.ModeSnapshot {
		t.Fatalf("table info %+v after the flood, want generation 3 in snapshot mode", info)
	}
}

// panickyObserver is an Observer with a bug reached by one model's requests.
type panickyObserver struct{}

func (panickyObserver) Request(model string) {
	if model == "boom" {
		panic("observer bug on " + model)
	}
}
func (panickyObserver) Outcome(string, string, control.Outcome) {}

// TestNATSFrontRecoversPanic: a request whose handling panics gets a final
// 500 over NATS, the panic is counted, and the front serves the next
// requests.
func TestNATSFrontRecoversPanic(t *testing.T) {
	env := testenv.StartNATS(t)
	engineConn := env.Dial(t, "engine")
	sub, err := engineConn.Subscribe("sy.infer.m.e1", func(m *nats.Msg) {
		r := nats.NewMsg(m.Reply)
		r.Header.Set(messages.HeaderStatus, "200")
		r.Header.Set(messages.HeaderLast, "true")
		r.Data = []byte(`{"object":"chat.completion"}`)
		_ = engineConn.PublishMsg(r)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	nc := env.Dial(t, "router")
	tables := router.NewStaticTables()
	for _, model := range []string{"m", "boom"} {
		tb, err := selection.NewTable([]selection.Engine{{Name: "e1", Subject: "sy.infer.m.e1", Weight: 1}}, selection.TableOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tables.Set(model, tb, control.Info{Generation: 1, Mode: control.ModeSnapshot, Created: time.Now()})
	}
	tr, err := upstream.NewNATSTransport(upstream.NATSTransportOptions{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	h, err := router.NewHandler(router.Options{Tables: tables, Cluster: "A", Transport: tr, Observer: panickyObserver{}})
	if err != nil {
		t.Fatal(err)
	}
	front, err := natsfront.New(natsfront.Options{Conn: nc, Cluster: "A", Pipeline: h, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	client := runNATSFront(t, env, front, "A")
	for i := range 3 {
		r, err := client.Request("sy.req.A.boom", []byte(chatJSON("boom", false, "x")), 10*time.Second)
		if err != nil {
			t.Fatalf("request %d on the panicking model: %v", i, err)
		}
		if st := r.Header.Get(messages.HeaderStatus); st != "500" || r.Header.Get(messages.HeaderLast) != "true" {
			t.Fatalf("request %d on the panicking model: status %q last %q body %s", i, st, r.Header.Get(messages.HeaderLast), r.Data)
		}
		r, err = client.Request("sy.req.A.m", []byte(chatJSON("m", false, "x")), 10*time.Second)
		if err != nil || r.Header.Get(messages.HeaderStatus) != "200" {
			t.Fatalf("request %d after a panic: %v %v", i, err, r)
		}
	}
	if n := testenv.MetricSum(t, h.Metrics(), "switchyard_router_handler_panics_total", map[string]string{"handler": "nats_front"}); n != 3 {
		t.Fatalf("%v panics counted, want 3", n)
	}
}
