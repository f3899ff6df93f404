package router_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestKeylessRequestsAvoidLoadedEngine: two engines of equal weight, one
// of which signals a full batch and a long queue. Requests without an
// affinity key, through either front, take the lighter of two weighted
// candidates (PickTwo with the engines' signalled load), so the full engine
// gets far fewer than the half its weight alone would give it.
func TestKeylessRequestsAvoidLoadedEngine(t *testing.T) {
	for _, front := range []string{"http", "nats"} {
		t.Run(front, func(t *testing.T) {
			env := testenv.StartNATS(t)
			idle, full := newHTTPEngine(t, "idle"), newHTTPEngine(t, "full")
			publishSignals(t, env.Dial(t, "engines"), env.Names, 100*time.Millisecond,
				fakeSignal{model: "m", engine: "idle", capacity: 10, health: 1, url: idle.srv.URL, maxRunning: 8},
				fakeSignal{model: "m", engine: "full", capacity: 10, health: 1, url: full.srv.URL,
					running: 8, queue: 400, maxRunning: 8})
			svc := runService(t, router.ServiceOptions{Conn: env.Dial(t, "router"), Cluster: "A", Router: "r1"})
			putSnapshot(t, env.JS, env.Names, snapshot("m", "A", 1, time.Now(), map[string]float64{"idle": 0.5, "full": 0.5}))
			waitInstalled(t, svc.Store(), "m", 1, 5*time.Second)
			testenv.WaitFor(t, 5*time.Second, "both engines' load signals seen", func() bool {
				v, ok := svc.Signals().Engine("m", "full")
				_, ok2 := svc.Signals().Endpoints("m", "idle")
				return ok && ok2 && v.Signal.Queue == 400
			})
			const n = 200
			client := &http.Client{}
			nc := env.Dial(t, "client")
			for i := 0; i < n; i++ {
				// An empty prompt, no session, no user: no affinity key.
				body := chatJSON("m", false, "")
				if front == "http" {
					if status, _, resp := postChat(t, client, svc.Addr(), body, ""); status != 200 {
						t.Fatalf("request %d: status %d body %s", i, status, resp)
					}
				} else if msgs := natsRequest(t, nc, "sy.req.A.m", body, nil); msgs[0].Header.Get(messages.HeaderStatus) != "200" {
					t.Fatalf("request %d: headers %v body %q", i, msgs[0].Header, msgs[0].Data)
				}
			}
			gotIdle, gotFull := idle.requests.Load(), full.requests.Load()
			if gotIdle+gotFull != n {
				t.Fatalf("engines got %d + %d requests, want %d in all", gotIdle, gotFull, n)
			}
			// By weight alone each would get about 100 (binomial sd 7); the
			// full engine, at load 51 batches against the idle one's at most
			// 25 (all n requests sent within one signal period, over 8
			// slots), loses every comparison.
			if gotFull > n/10 {
				t.Fatalf("the full engine got %d of %d keyless requests (idle %d), want at most %d", gotFull, n, gotIdle, n/10)
			}
		})
	}
}

// TestKeyedConversationStaysAcrossSnapshot: conversations (session ids)
// stay on the engine this router first sent them to when a new snapshot
// changes the weights slightly, even those whose slot in the new table
// names another engine (PickRecent).
func TestKeyedConversationStaysAcrossSnapshot(t *testing.T) {
	env := testenv.StartNATS(t)
	e1, e2, e3 := newHTTPEngine(t, "e1"), newHTTPEngine(t, "e2"), newHTTPEngine(t, "e3")
	publishSignals(t, env.Dial(t, "engines"), env.Names, 100*time.Millisecond,
		fakeSignal{model: "m", engine: "e1", capacity: 10, health: 1, url: e1.srv.URL, maxRunning: 64},
		fakeSignal{model: "m", engine: "e2", capacity: 10, health: 1, url: e2.srv.URL, maxRunning: 64},
		fakeSignal{model: "m", engine: "e3", capacity: 10, health: 1, url: e3.srv.URL, maxRunning: 64})
	svc := runService(t, router.ServiceOptions{Conn: env.Dial(t, "router"), Cluster: "A", Router: "r1"})
	putSnapshot(t, env.JS, env.Names, snapshot("m", "A", 1, time.Now(), map[string]float64{"e1": 0.34, "e2": 0.33, "e3": 0.33}))
	waitInstalled(t, svc.Store(), "m", 1, 5*time.Second)
	testenv.WaitFor(t, 5*time.Second, "signals seen", func() bool {
		_, ok1 := svc.Signals().Endpoints("m", "e1")
		_, ok2 := svc.Signals().Endpoints("m", "e2")
		_, ok3 := svc.Signals().Endpoints("m", "e3")
		return ok1 && ok2 && ok3
	})
	const n = 300
	client := &http.Client{}
	first := make([]string, n)
	for i := range first {
		status, eng, body := postChat(t, client, svc.Addr(), chatJSON("m", false, "turn 1"), fmt.Sprintf("conv-%d", i))
		if status != 200 || eng == "" {
			t.Fatalf("conversation %d turn 1: status %d engine %q body %s", i, status, eng, body)
		}
		first[i] = eng
	}
	old, _, _ := svc.Store().Table("m")
	putSnapshot(t, env.JS, env.Names, snapshot("m", "A", 2, time.Now(), map[string]float64{"e1": 0.30, "e2": 0.35, "e3": 0.35}))
	waitInstalled(t, svc.Store(), "m", 2, 5*time.Second)
	cur, _, _ := svc.Store().Table("m")
	moved := 0 // conversations whose primary engine the new table changes
	for i := range first {
		key, _ := protocol.AffinityKey(fmt.Sprintf("conv-%d", i), nil)
		a, _ := old.Primary(key)
		b, _ := cur.Primary(key)
		if old.Engine(a).Name != cur.Engine(b).Name {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("the new snapshot moves no conversation's primary engine; the test shows nothing")
	}
	for i := range first {
		status, eng, body := postChat(t, client, svc.Addr(), chatJSON("m", false, "turn 2"), fmt.Sprintf("conv-%d", i))
		if status != 200 || eng != first[i] {
			t.Fatalf("conversation %d turn 2: status %d engine %q, want %q (its turn 1 engine; %d of %d primaries moved); body %s",
				i, status, eng, first[i], moved, n, body)
		}
	}
	t.Logf("%d of %d conversations kept their engine though the new table's primary moved", moved, n)
}
