package router_test

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/services/engine"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/testenv"
)

func TestHeadersMatchEngineSDK(t *testing.T) {
	if router.HeaderLast != engine.HeaderLast || router.HeaderStatus != engine.HeaderStatus {
		t.Fatalf("router headers %q/%q differ from the engine SDK's %q/%q",
			router.HeaderLast, router.HeaderStatus, engine.HeaderLast, engine.HeaderStatus)
	}
}

func TestSnapshotInstallIgnoresOlderGenerations(t *testing.T) {
	env := testenv.StartNATS(t)
	st, err := router.NewSnapshotStore(router.StoreOptions{Conn: env.Conn, Cluster: "A"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	w := map[string]float64{"e1": 0.5, "e2": 0.5}
	install := func(gen uint64, cluster string) bool {
		s := snapshot("m", cluster, gen, now, w)
		ok, _ := st.Install(&s)
		return ok
	}
	if !install(5, "A") {
		t.Fatal("generation 5 not installed into an empty store")
	}
	for _, gen := range []uint64{5, 4, 1} {
		if install(gen, "A") {
			t.Fatalf("generation %d installed over 5", gen)
		}
	}
	if install(9, "B") {
		t.Fatal("a snapshot of another cluster was installed")
	}
	if !install(6, "A") {
		t.Fatal("generation 6 not installed over 5")
	}
	_, info, ok := st.Table("m")
	if !ok || info.Generation != 6 || info.Mode != router.ModeSnapshot {
		t.Fatalf("table info %+v ok=%v, want generation 6 in snapshot mode", info, ok)
	}

	// Through the bucket: an older generation written later is ignored, an
	// undecodable value is never installed.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = st.Run(ctx) }()
	defer func() { cancel(); <-done }()
	putSnapshot(t, env.JS, env.Names, snapshot("m", "A", 8, now, w))
	waitInstalled(t, st, "m", 8, 5*time.Second)
	putSnapshot(t, env.JS, env.Names, snapshot("m", "A", 7, now, w))
	kv, err := env.JS.KeyValue(ctx, env.Names.WeightsBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "m.A", []byte("not msgpack")); err != nil {
		t.Fatal(err)
	}
	putSnapshot(t, env.JS, env.Names, snapshot("other", "A", 1, now, w)) // a marker: processed after the above
	waitInstalled(t, st, "other", 1, 5*time.Second)
	if _, info, _ := st.Table("m"); info.Generation != 8 {
		t.Fatalf("generation %d installed, want 8 kept", info.Generation)
	}
	if s, ok := st.Snapshot("m"); !ok || s.Generation != 8 {
		t.Fatalf("Snapshot = %d, %v", s.Generation, ok)
	}
}

func TestSnapshotFromBucketRoutesTraffic(t *testing.T) {
	env := testenv.StartNATS(t)
	e1, e2 := newHTTPEngine(t, "e1"), newHTTPEngine(t, "e2")
	publishSignals(t, env.Dial(t, "engines"), env.Names, 100*time.Millisecond,
		fakeSignal{model: "m", engine: "e1", capacity: 10, health: 1, url: e1.srv.URL},
		fakeSignal{model: "m", engine: "e2", capacity: 10, health: 1, url: e2.srv.URL})
	svc := runService(t, router.ServiceOptions{Conn: env.Dial(t, "router"), Cluster: "A", Router: "r1"})

	putSnapshot(t, env.JS, env.Names, snapshot("m", "A", 3, time.Now(), map[string]float64{"e2": 1}))
	waitInstalled(t, svc.Store(), "m", 3, 5*time.Second)
	testenv.WaitFor(t, 5*time.Second, "signals seen", func() bool {
		_, ok := svc.Signals().Endpoints("m", "e2")
		return ok
	})
	client := &http.Client{}
	for i := 0; i < 20; i++ {
		status, eng, body := postChat(t, client, svc.Addr(), chatJSON("m", false, "hi"), "")
		if status != 200 || eng != "e2" {
			t.Fatalf("request %d: status %d engine %q body %s", i, status, eng, body)
		}
	}
	if e1.requests.Load() != 0 || e2.requests.Load() != 20 {
		t.Fatalf("engine requests e1=%d e2=%d, want 0 and 20", e1.requests.Load(), e2.requests.Load())
	}
	rd := readiness(t, svc.Addr())
	if !rd.Ready || rd.Mode != router.ModeSnapshot || rd.Models["m"].Generation != 3 {
		t.Fatalf("readiness %+v", rd)
	}
}

func TestLocalPolicyWithoutSnapshot(t *testing.T) {
	env := testenv.StartNATS(t)
	e1, e2, e3 := newHTTPEngine(t, "e1"), newHTTPEngine(t, "e2"), newHTTPEngine(t, "e3")
	pub := publishSignals(t, env.Dial(t, "engines"), env.Names, 100*time.Millisecond,
		fakeSignal{model: "m", engine: "e1", capacity: 30, health: 1, url: e1.srv.URL},
		fakeSignal{model: "m", engine: "e2", capacity: 10, health: 1, url: e2.srv.URL},
		fakeSignal{model: "m", engine: "e3", capacity: 50, health: 0, url: e3.srv.URL}) // down
	svc := runService(t, router.ServiceOptions{Conn: env.Dial(t, "router"), Cluster: "A", Router: "r1"})

	var tbl *router.Table
	testenv.WaitFor(t, 5*time.Second, "local-policy table with e1 and e2", func() bool {
		t, info, ok := svc.Store().Table("m")
		if !ok || info.Mode != router.ModeLocalPolicy || t.Slots() == 0 {
			return false
		}
		tbl = t
		return tbl.Len() == 3
	})
	want := map[string]float64{"e1": 0.75, "e2": 0.25, "e3": 0}
	for name, w := range want {
		i, ok := tbl.Index(name)
		if !ok || math.Abs(tbl.Engine(i).Weight-w) > 0.01 {
			t.Fatalf("local weight of %s = %v, want %v", name, tbl.Engine(i).Weight, w)
		}
	}
	rd := readiness(t, svc.Addr())
	if !rd.Ready || rd.Mode != router.ModeLocalPolicy || rd.Models["m"].Mode != router.ModeLocalPolicy ||
		rd.Models["m"].Generation != 0 || rd.Models["m"].SnapshotAgeSeconds != nil {
		t.Fatalf("readiness %+v", rd)
	}
	client := &http.Client{}
	for i := 0; i < 40; i++ {
		if status, eng, body := postChat(t, client, svc.Addr(), chatJSON("m", false, ""), ""); status != 200 || eng == "e3" {
			t.Fatalf("request %d: status %d engine %q body %s", i, status, eng, body)
		}
	}
	if e3.requests.Load() != 0 || e1.requests.Load() <= e2.requests.Load() {
		t.Fatalf("engine requests e1=%d e2=%d e3=%d", e1.requests.Load(), e2.requests.Load(), e3.requests.Load())
	}
	// e1 going down shifts everything to e2 at once.
	pub.set(fakeSignal{model: "m", engine: "e1", capacity: 30, health: 0, url: e1.srv.URL})
	testenv.WaitFor(t, 5*time.Second, "e1 marked down", func() bool {
		v, ok := svc.Signals().Engine("m", "e1")
		return ok && v.Down
	})
	before := e1.requests.Load()
	for i := 0; i < 10; i++ {
		if status, eng, _ := postChat(t, client, svc.Addr(), chatJSON("m", false, ""), ""); status != 200 || eng != "e2" {
			t.Fatalf("after e1 down: status %d engine %q", status, eng)
		}
	}
	if e1.requests.Load() != before {
		t.Fatal("a down engine received requests")
	}
}

func TestLocalPolicyWhenSnapshotStale(t *testing.T) {
	env := testenv.StartNATS(t)
	e1, e2 := newHTTPEngine(t, "e1"), newHTTPEngine(t, "e2")
	publishSignals(t, env.Dial(t, "engines"), env.Names, 100*time.Millisecond,
		fakeSignal{model: "m", engine: "e1", capacity: 10, health: 1, url: e1.srv.URL},
		fakeSignal{model: "m", engine: "e2", capacity: 10, health: 1, url: e2.srv.URL})
	svc := runService(t, router.ServiceOptions{Conn: env.Dial(t, "router"), Cluster: "A", Router: "r1",
		StaleAfter: time.Second})

	// A fresh snapshot sending everything to e1 goes stale after a second.
	putSnapshot(t, env.JS, env.Names, snapshot("m", "A", 4, time.Now(), map[string]float64{"e1": 1}))
	waitInstalled(t, svc.Store(), "m", 4, 5*time.Second)
	testenv.WaitFor(t, 5*time.Second, "stale snapshot → local policy", func() bool {
		_, info, _ := svc.Store().Table("m")
		return info.Mode == router.ModeLocalPolicy
	})
	rd := readiness(t, svc.Addr())
	mr := rd.Models["m"]
	if rd.Mode != router.ModeLocalPolicy || mr.Mode != router.ModeLocalPolicy || mr.Generation != 4 ||
		mr.SnapshotAgeSeconds == nil || *mr.SnapshotAgeSeconds < 1 {
		t.Fatalf("readiness %+v (model %+v)", rd, mr)
	}
	client := &http.Client{}
	seen := map[string]int{}
	for i := 0; i < 40; i++ {
		status, eng, _ := postChat(t, client, svc.Addr(), chatJSON("m", false, ""), "")
		if status != 200 {
			t.Fatalf("status %d", status)
		}
		seen[eng]++
	}
	if seen["e2"] == 0 {
		t.Fatalf("local policy sent nothing to e2: %v", seen)
	}
	// The metric says so too.
	resp, err := http.Get("http://" + svc.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(b), `switchyard_router_local_policy{model="m"} 1`) {
		t.Fatalf("metrics lack local_policy 1:\n%s", b)
	}
	// A fresh snapshot brings snapshot mode back.
	putSnapshot(t, env.JS, env.Names, snapshot("m", "A", 5, time.Now(), map[string]float64{"e1": 1}))
	waitInstalled(t, svc.Store(), "m", 5, 5*time.Second)
}

func TestNATSOutageKeepsServingAndWatchResumes(t *testing.T) {
	env := testenv.StartNATS(t)
	e1, e2 := newHTTPEngine(t, "e1"), newHTTPEngine(t, "e2")
	publishSignals(t, env.Dial(t, "engines"), env.Names, 100*time.Millisecond,
		fakeSignal{model: "m", engine: "e1", capacity: 10, health: 1, url: e1.srv.URL},
		fakeSignal{model: "m", engine: "e2", capacity: 10, health: 1, url: e2.srv.URL})
	svc := runService(t, router.ServiceOptions{Conn: env.Dial(t, "router"), Cluster: "A", Router: "r1",
		DownAfter: 500 * time.Millisecond})
	putSnapshot(t, env.JS, env.Names, snapshot("m", "A", 1, time.Now(), map[string]float64{"e1": 0.5, "e2": 0.5}))
	waitInstalled(t, svc.Store(), "m", 1, 5*time.Second)
	testenv.WaitFor(t, 5*time.Second, "signals seen", func() bool {
		_, ok1 := svc.Signals().Endpoints("m", "e1")
		_, ok2 := svc.Signals().Endpoints("m", "e2")
		return ok1 && ok2
	})
	age0 := *readiness(t, svc.Addr()).Models["m"].SnapshotAgeSeconds

	env.StopServer()
	client := &http.Client{}
	deadline := time.Now().Add(2 * time.Second) // well past DownAfter
	n := 0
	for time.Now().Before(deadline) || n < 100 {
		status, eng, body := postChat(t, client, svc.Addr(), chatJSON("m", n%2 == 0, fmt.Sprintf("hello %d", n)), "")
		if status != 200 || eng == "" {
			t.Fatalf("request %d with NATS down: status %d engine %q body %s", n, status, eng, body)
		}
		n++
	}
	if e1.requests.Load() == 0 || e2.requests.Load() == 0 {
		t.Fatalf("with NATS down traffic left an engine: e1=%d e2=%d", e1.requests.Load(), e2.requests.Load())
	}
	rd := readiness(t, svc.Addr())
	if mr := rd.Models["m"]; mr.Mode != router.ModeSnapshot || mr.Generation != 1 || *mr.SnapshotAgeSeconds <= age0 {
		t.Fatalf("with NATS down: readiness %+v, age was %v", mr, age0)
	}
	t.Logf("%d requests answered with NATS down", n)

	env.StartServer(t)
	testenv.WaitFor(t, 10*time.Second, "clients reconnected", func() bool {
		return env.Conn.IsConnected()
	})
	// The bucket may take a moment to come back after a restart.
	testenv.WaitFor(t, 10*time.Second, "snapshot written after the restart", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		kv, err := env.JS.KeyValue(ctx, env.Names.WeightsBucket)
		if err != nil {
			return false
		}
		s := snapshot("m", "A", 2, time.Now(), map[string]float64{"e2": 1})
		data, _ := messages.Encode(&s)
		key, _ := streams.WeightsKey("m", "A")
		_, err = kv.Put(ctx, key, data)
		return err == nil
	})
	waitInstalled(t, svc.Store(), "m", 2, 15*time.Second)
	for i := 0; i < 5; i++ {
		if status, eng, _ := postChat(t, client, svc.Addr(), chatJSON("m", false, "x"), ""); status != 200 || eng != "e2" {
			t.Fatalf("after generation 2: status %d engine %q", status, eng)
		}
	}
}
