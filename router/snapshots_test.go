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
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/testenv"
)

func TestSnapshotInstallIgnoresOlderGenerations(t *testing.T) {
	env := testenv.StartNATS(t)
	st, err := control.NewSnapshotStore(control.StoreOptions{Conn: env.Conn, Cluster: "A"})
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
	if !ok || info.Generation != 6 || info.Mode != control.ModeSnapshot {
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
	if !rd.Ready || rd.Mode != control.ModeSnapshot || rd.Models["m"].Generation != 3 {
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

	var tbl *selection.Table
	testenv.WaitFor(t, 5*time.Second, "local-policy table with e1 and e2", func() bool {
		t, info, ok := svc.Store().Table("m")
		if !ok || info.Mode != control.ModeLocalPolicy || t.Slots() == 0 {
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
	if !rd.Ready || rd.Mode != control.ModeLocalPolicy || rd.Models["m"].Mode != control.ModeLocalPolicy ||
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
		return info.Mode == control.ModeLocalPolicy
	})
	rd := readiness(t, svc.Addr())
	mr := rd.Models["m"]
	if rd.Mode != control.ModeLocalPolicy || mr.Mode != control.ModeLocalPolicy || mr.Generation != 4 ||
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
	if mr := rd.Models["m"]; mr.Mode != control.ModeSnapshot || mr.Generation != 1 || *mr.SnapshotAgeSeconds <= age0 {
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

// slotSnapshot returns a snapshot of weights carrying the slot table that
// AssignSlots computes from prev (which may be empty).
func slotSnapshot(t *testing.T, gen uint64, weights map[string]float64, prevEngines []string, prev []uint16) (messages.WeightSnapshot, []string, []uint16) {
	t.Helper()
	snap := snapshot("m", "A", gen, time.Now(), weights)
	var names []string
	for e, w := range weights {
		if w > 0 {
			names = append(names, e)
		}
	}
	ws := make([]float64, len(names))
	for i, e := range names {
		ws[i] = weights[e]
	}
	idx := selection.AssignSlots(prev, prevEngines, names, ws, max(selection.SlotCount(len(names)), len(prev)))
	if idx == nil {
		t.Fatal("AssignSlots returned nil")
	}
	snap.SlotEngines, snap.Slots = names, selection.EncodeSlots(idx)
	if err := snap.Validate(time.Now()); err != nil {
		t.Fatalf("snapshot with slots invalid: %v", err)
	}
	return snap, names, idx
}

// TestSnapshotSlotsIdenticalAcrossRouters: two routers that install the same
// snapshot pick the same engine for every key, whatever they installed
// before, and the slot table is the snapshot's.
func TestSnapshotSlotsIdenticalAcrossRouters(t *testing.T) {
	env := testenv.StartNATS(t)
	newStore := func() *control.SnapshotStore {
		st, err := control.NewSnapshotStore(control.StoreOptions{Conn: env.Conn, Cluster: "A"})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	a, b := newStore(), newStore()
	w1 := map[string]float64{"e1": 0.4, "e2": 0.3, "e3": 0.2, "e4": 0.1}
	s1, names1, idx1 := slotSnapshot(t, 2, w1, nil, nil)
	w2 := map[string]float64{"e1": 0.2, "e2": 0.35, "e3": 0.1, "e5": 0.25} // several weights at once, e4 gone, e5 new
	s2, names2, idx2 := slotSnapshot(t, 3, w2, names1, idx1)
	// Router a saw both snapshots and, before them, an older one without slots;
	// router b only the newest.
	old := snapshot("m", "A", 1, time.Now(), map[string]float64{"e1": 0.9, "e9": 0.1})
	for _, s := range []messages.WeightSnapshot{old, s1, s2} {
		if ok, err := a.Install(&s); !ok {
			t.Fatalf("router a: generation %d not installed: %v", s.Generation, err)
		}
	}
	if ok, err := b.Install(&s2); !ok {
		t.Fatalf("router b: %v", err)
	}
	ta, _, _ := a.Table("m")
	tb, _, _ := b.Table("m")
	fromSlots := func(names []string, w map[string]float64, idx []uint16) *selection.Table {
		es := make([]selection.Engine, len(names))
		for i, e := range names {
			es[i] = selection.Engine{Name: e, Weight: w[e]}
		}
		tbl, err := selection.NewTableFromSlots(es, idx, selection.TableOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tbl
	}
	want, prevTable := fromSlots(names2, w2, idx2), fromSlots(names1, w1, idx1)
	moved := 0
	const keys = 100_000
	for k := 0; k < keys; k++ {
		key := selection.HashString(fmt.Sprintf("conversation-%d", k))
		i, _ := ta.Pick(key, nil)
		j, _ := tb.Pick(key, nil)
		l, _ := want.Pick(key, nil)
		if ta.Engine(i).Name != tb.Engine(j).Name || tb.Engine(j).Name != want.Engine(l).Name {
			t.Fatalf("key %d: router a picks %s, router b %s, the snapshot's slots %s",
				k, ta.Engine(i).Name, tb.Engine(j).Name, want.Engine(l).Name)
		}
		p, _ := prevTable.Pick(key, nil)
		if prevTable.Engine(p).Name != want.Engine(l).Name {
			moved++
		}
	}
	// δ, the total-variation distance of the normalised weights (w2 sheds 10%).
	delta := 0.0
	for _, e := range []string{"e1", "e2", "e3", "e4", "e5"} {
		delta += math.Abs(w1[e] - w2[e]/0.9)
	}
	delta /= 2
	frac := float64(moved) / keys
	t.Logf("%.4f of keys moved between generations 2 and 3, δ = %.4f", frac, delta)
	if frac > 1.2*delta+0.01 {
		t.Errorf("%.4f of keys moved between generations 2 and 3, δ = %.4f", frac, delta)
	}
	if sa, _ := a.Snapshot("m"); len(sa.Slots) != len(s2.Slots) {
		t.Fatalf("stored snapshot lost its slots")
	}

	// A slot table that does not fit the weights (a slot owned by an engine
	// of weight zero) is replaced by one computed from the weights.
	bad := s2
	bad.Generation = 4
	bad.Weights = map[string]float64{"e1": 0.2, "e2": 0.35, "e3": 0.1, "e5": 0.25}
	bad.Weights[names2[0]] = 0
	sum := 0.0
	for _, w := range bad.Weights {
		sum += w
	}
	bad.ShedFraction = 1 - sum
	if ok, err := b.Install(&bad); !ok {
		t.Fatalf("snapshot with an unusable slot table not installed: %v", err)
	}
	tb, info, _ := b.Table("m")
	if info.Generation != 4 || tb.Slots() == 0 {
		t.Fatalf("generation %d, %d slots", info.Generation, tb.Slots())
	}
	if i, ok := tb.Index(names2[0]); !ok || tb.Share(i) != 0 {
		t.Fatalf("zero-weight engine %s owns slots", names2[0])
	}
}
