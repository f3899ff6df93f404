package router_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/live"
	"github.com/switchyard-dev/switchyard/testenv"
)

func (p *signalPublisher) drop(model, engine string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.engines, model+"."+engine)
}

// TestSilentEngineServesOnOwnSuccesses: an engine whose signals stop is
// silent, not down. While this router's requests to it succeed it keeps its
// share of traffic; left without requests for longer than
// live.SilentServe it is skipped; signalling again, it is back.
func TestSilentEngineServesOnOwnSuccesses(t *testing.T) {
	env := testenv.StartNATS(t)
	e1, e2 := newHTTPEngine(t, "e1"), newHTTPEngine(t, "e2")
	sig2 := fakeSignal{model: "m", engine: "e2", capacity: 10, health: 1, url: e2.srv.URL}
	pub := publishSignals(t, env.Dial(t, "engines"), env.Names, 100*time.Millisecond,
		fakeSignal{model: "m", engine: "e1", capacity: 10, health: 1, url: e1.srv.URL}, sig2)
	svc := runService(t, router.ServiceOptions{Conn: env.Dial(t, "router"), Cluster: "A", Router: "r1",
		DownAfter: 500 * time.Millisecond, StaleAfter: time.Minute})
	putSnapshot(t, env.JS, env.Names, snapshot("m", "A", 1, time.Now(), map[string]float64{"e1": 0.5, "e2": 0.5}))
	waitInstalled(t, svc.Store(), "m", 1, 5*time.Second)
	testenv.WaitFor(t, 5*time.Second, "both engines' signals", func() bool {
		_, ok1 := svc.Signals().Engine("m", "e1")
		_, ok2 := svc.Signals().Engine("m", "e2")
		return ok1 && ok2
	})
	client := &http.Client{}
	send := func(n int) {
		t.Helper()
		for i := range n {
			if status, eng, body := postChat(t, client, svc.Addr(), chatJSON("m", false, ""), ""); status != 200 {
				t.Fatalf("request %d: status %d from %q: %s", i, status, eng, body)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	send(20)

	// e2's signals stop while traffic flows: it goes silent and keeps serving.
	pub.drop("m", "e2")
	for deadline := time.Now().Add(5 * time.Second); ; {
		if v, _ := svc.Signals().Engine("m", "e2"); v.Silent {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("e2 not silent 5 s after its signals stopped")
		}
		send(1)
	}
	if v, _ := svc.Signals().Engine("m", "e2"); v.Down {
		t.Fatal("a silent engine is marked down")
	}
	before := e2.requests.Load()
	send(100) // about 2 s, four times the signal down-after
	if got := e2.requests.Load() - before; got < 20 {
		t.Fatalf("silent e2 served %d of 100 requests while its answers succeeded, want about half", got)
	}

	// Without requests for longer than SilentServe, nothing vouches for it.
	time.Sleep(live.SilentServe + 500*time.Millisecond)
	before = e2.requests.Load()
	send(30)
	if got := e2.requests.Load() - before; got != 0 {
		t.Fatalf("e2, silent and without a success for %s, served %d requests", live.SilentServe, got)
	}

	// Signalling again, it is back.
	pub.set(sig2)
	testenv.WaitFor(t, 5*time.Second, "e2 signalling again", func() bool {
		v, _ := svc.Signals().Engine("m", "e2")
		return !v.Silent
	})
	before = e2.requests.Load()
	send(40)
	if got := e2.requests.Load() - before; got < 8 {
		t.Fatalf("e2 signalling again served %d of 40 requests", got)
	}
}
