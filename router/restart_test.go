package router_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/testenv"
)

// gatheredSum sums the values of the metric family name in reg whose
// labels include match.
func gatheredSum(t *testing.T, reg prometheus.Gatherer, name string, match map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range match {
				if labels[k] != v {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// TestRestartOnStoredSnapshot is a router starting where an earlier run
// left a fresh snapshot in sy_weights: it names two engines that come back
// (with new addresses, which only their signals carry, and whose first
// signals come 300 ms after the router starts) and one that is gone for
// good. Requests sent from the router's first moment wait until the
// engines were heard from, then all succeed on the engines that came back;
// the gone engine is never forwarded to, and nothing counts against any
// engine: no ejection, no failed outcome in the reports, no retry.
func TestRestartOnStoredSnapshot(t *testing.T) {
	env := testenv.StartNATS(t)
	e1, e2 := newHTTPEngine(t, "e1"), newHTTPEngine(t, "e2")
	putSnapshot(t, env.JS, env.Names, snapshot("m", "A", 41, time.Now(), map[string]float64{"e1": 0.4, "e2": 0.3, "gone": 0.3}))

	reports := make(chan *nats.Msg, 1024)
	sub, err := env.Dial(t, "observer").ChanSubscribe("sy.report.>", reports)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	reg := prometheus.NewRegistry()
	svc := runService(t, router.ServiceOptions{Conn: env.Dial(t, "router"), Cluster: "A", Router: "A-1",
		ReportInterval: 200 * time.Millisecond, Registry: reg})
	started := time.Now()
	go func() {
		time.Sleep(300 * time.Millisecond)
		publishSignals(t, env.Dial(t, "engines"), env.Names, 100*time.Millisecond,
			fakeSignal{model: "m", engine: "e1", capacity: 50, health: 1, url: e1.srv.URL},
			fakeSignal{model: "m", engine: "e2", capacity: 50, health: 1, url: e2.srv.URL})
	}()

	client := &http.Client{Timeout: 10 * time.Second}
	const n = 60
	type res struct {
		status int
		engine string
		body   string
		at     time.Duration
	}
	results := make([]res, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * 10 * time.Millisecond) // 0..600 ms after the start
			status, eng, body := postChat(t, client, svc.Addr(), chatJSON("m", i%2 == 0, "hello"), fmt.Sprintf("s%d", i))
			results[i] = res{status, eng, body, time.Since(started)}
		}()
	}
	wg.Wait()
	for i, r := range results {
		if r.status != http.StatusOK || (r.engine != "e1" && r.engine != "e2") {
			t.Errorf("request %d (answered %v after start): status %d engine %q: %s", i, r.at.Round(time.Millisecond), r.status, r.engine, r.body)
		}
	}
	if got := e1.requests.Load() + e2.requests.Load(); got != n {
		t.Errorf("engines served %d of %d", got, n)
	}
	if e1.requests.Load() == 0 || e2.requests.Load() == 0 {
		t.Errorf("e1 served %d, e2 %d: both planned engines should have their share", e1.requests.Load(), e2.requests.Load())
	}
	for _, name := range []string{"e1", "e2", "gone"} {
		if svc.Handler().Live("m").Engine(name).Ejected() {
			t.Errorf("%s ejected", name)
		}
	}
	for _, m := range []string{"switchyard_router_retries_total", "switchyard_router_engine_ejected"} {
		if v := gatheredSum(t, reg, m, nil); v != 0 {
			t.Errorf("%s = %v, want 0", m, v)
		}
	}
	if v := gatheredSum(t, reg, "switchyard_router_engine_requests_total", map[string]string{"engine": "gone"}); v != 0 {
		t.Errorf("%v requests forwarded to the gone engine", v)
	}
	if v := gatheredSum(t, reg, "switchyard_router_startup_waits_total", nil); v == 0 {
		t.Errorf("no request waited for the engines' signals, though the first ones came before them")
	}

	// The reports carry the demand and successes, and no failure of any
	// engine: wait for one that covers the end of the load.
	sent := map[string]int64{}
	deadline := time.After(5 * time.Second)
	for total := int64(0); total < n; {
		select {
		case m := <-reports:
			msg, err := messages.DecodeAt(m.Data, time.Now())
			if err != nil {
				t.Fatalf("report: %v", err)
			}
			rep, ok := msg.(*messages.RouterReport)
			if !ok {
				t.Fatalf("report of type %T", msg)
			}
			for name, o := range rep.Engines {
				if len(o.Errors) > 0 || o.Timeouts > 0 {
					t.Errorf("report %d names %s with failures: %+v", rep.Seq, name, o)
				}
				sent[name] += o.Sent
				total += o.Sent
			}
		case <-deadline:
			t.Fatalf("reports counted %v of %d requests within 5 s", sent, n)
		}
	}
	if sent["gone"] != 0 {
		t.Errorf("reports count %d requests sent to the gone engine", sent["gone"])
	}
	if rd := readiness(t, svc.Addr()); !rd.Ready || rd.Starting {
		t.Errorf("readiness after start-up: %+v", rd)
	}
}

// TestFreshStartWaitsForSignals: with nothing stored, a request sent before
// any engine signalled waits for the signals (the model is unknown until
// then) and is routed by the local policy, rather than answered 404.
func TestFreshStartWaitsForSignals(t *testing.T) {
	env := testenv.StartNATS(t)
	e1 := newHTTPEngine(t, "e1")
	svc := runService(t, router.ServiceOptions{Conn: env.Dial(t, "router"), Cluster: "A", Router: "A-1"})
	if rd := readiness(t, svc.Addr()); rd.Ready {
		t.Fatalf("readiness before any signal: %+v", rd)
	}
	go func() {
		time.Sleep(200 * time.Millisecond)
		publishSignals(t, env.Dial(t, "engines"), env.Names, 100*time.Millisecond,
			fakeSignal{model: "m", engine: "e1", capacity: 50, health: 1, url: e1.srv.URL})
	}()
	client := &http.Client{Timeout: 10 * time.Second}
	if status, eng, body := postChat(t, client, svc.Addr(), chatJSON("m", false, "hi"), ""); status != http.StatusOK || eng != "e1" {
		t.Fatalf("status %d engine %q: %s", status, eng, body)
	}
	select {
	case <-svc.Settled():
	default:
		t.Fatal("a request was routed before the router settled")
	}
}

// TestRestartEveryPlannedEngineGone: the stored snapshot, fresh, plans only
// for engines that are gone; the engine that is here is in no table of the
// optimizer's yet. The router routes by the local policy over the live
// signals instead of answering 503 until the optimizer plans anew, and goes
// back to the snapshot once one of its engines has an address.
func TestRestartEveryPlannedEngineGone(t *testing.T) {
	env := testenv.StartNATS(t)
	e1, back := newHTTPEngine(t, "e1"), newHTTPEngine(t, "gone2")
	putSnapshot(t, env.JS, env.Names, snapshot("m", "A", 9, time.Now(), map[string]float64{"gone1": 0.5, "gone2": 0.5}))
	pub := publishSignals(t, env.Dial(t, "engines"), env.Names, 100*time.Millisecond,
		fakeSignal{model: "m", engine: "e1", capacity: 50, health: 1, url: e1.srv.URL})
	svc := runService(t, router.ServiceOptions{Conn: env.Dial(t, "router"), Cluster: "A", Router: "A-1"})
	client := &http.Client{Timeout: 10 * time.Second}
	for i := range 20 {
		if status, eng, body := postChat(t, client, svc.Addr(), chatJSON("m", false, "hi"), fmt.Sprintf("s%d", i)); status != http.StatusOK || eng != "e1" {
			t.Fatalf("request %d: status %d engine %q: %s", i, status, eng, body)
		}
	}
	if rd := readiness(t, svc.Addr()); !rd.Ready || rd.Models["m"].Mode != control.ModeLocalPolicy {
		t.Fatalf("readiness %+v, want ready by the local policy", rd)
	}
	pub.set(fakeSignal{model: "m", engine: "gone2", capacity: 50, health: 1, url: back.srv.URL})
	waitInstalled(t, svc.Store(), "m", 9, 5*time.Second)
	for i := range 10 {
		if status, eng, body := postChat(t, client, svc.Addr(), chatJSON("m", false, "hi"), fmt.Sprintf("t%d", i)); status != http.StatusOK || eng != "gone2" {
			t.Fatalf("by the snapshot again, request %d: status %d engine %q: %s", i, status, eng, body)
		}
	}
}

// TestStartWithoutWeightsBucket: a router that cannot watch the weights
// bucket (deleted here) does not hold its first requests for all of
// DownAfter: once the engines were heard from it routes by the local
// policy, as it always did without snapshots.
func TestStartWithoutWeightsBucket(t *testing.T) {
	env := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := env.JS.DeleteKeyValue(ctx, env.Names.WeightsBucket); err != nil {
		t.Fatal(err)
	}
	e1 := newHTTPEngine(t, "e1")
	publishSignals(t, env.Dial(t, "engines"), env.Names, 100*time.Millisecond,
		fakeSignal{model: "m", engine: "e1", capacity: 50, health: 1, url: e1.srv.URL})
	const downAfter = 10 * time.Second
	start := time.Now()
	svc := runService(t, router.ServiceOptions{Conn: env.Dial(t, "router"), Cluster: "A", Router: "A-1", DownAfter: downAfter})
	client := &http.Client{Timeout: 20 * time.Second}
	if status, eng, body := postChat(t, client, svc.Addr(), chatJSON("m", false, "hi"), ""); status != http.StatusOK || eng != "e1" {
		t.Fatalf("status %d engine %q: %s", status, eng, body)
	}
	if took := time.Since(start); took > downAfter/2 {
		t.Fatalf("first request answered %v after the start, want well within DownAfter (%v)", took, downAfter)
	}
}
