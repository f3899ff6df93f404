package router_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestSnapshotFromTheFutureIgnored: through a real bucket, a snapshot whose
// generation no honest writer gives (2^64-1, 2^63, far above the clock's
// ceiling) or whose time is far ahead is counted and not installed; the
// router keeps its snapshot and installs the next honest one, whose
// generation follows the clock (messages.NextGeneration).
func TestSnapshotFromTheFutureIgnored(t *testing.T) {
	env := testenv.StartNATS(t)
	reg := prometheus.NewRegistry()
	st, err := control.NewSnapshotStore(control.StoreOptions{Conn: env.Conn, Cluster: "A", Registry: reg})
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
	honest := func(prev uint64) messages.WeightSnapshot {
		gen, ok := messages.NextGeneration(prev, time.Now())
		if !ok {
			t.Fatalf("no generation after %d", prev)
		}
		return snapshot("m", "A", gen, time.Now(), map[string]float64{"e1": 0.5, "e2": 0.5})
	}
	first := honest(0)
	putSnapshot(t, env.JS, env.Names, first)
	waitInstalled(t, st, "m", first.Generation, 5*time.Second)

	forged := []struct {
		name string
		gen  uint64
		at   time.Time
	}{
		{"generation 2^64-1", math.MaxUint64, time.Now()},
		{"generation 2^63", 1 << 63, time.Now()},
		{"generation a day above the ceiling", messages.GenerationCeiling(time.Now()) + 86_400_000, time.Now()},
		{"time an hour ahead", first.Generation + 1, time.Now().Add(time.Hour)},
	}
	for _, f := range forged {
		snap := snapshot("m", "A", f.gen, f.at, map[string]float64{"e1": 1})
		snap.ShedFraction, snap.Weights = 1, map[string]float64{"e1": 0}
		snap.Version, snap.Kind = messages.SchemaVersion, messages.KindWeights
		data, err := msgpack.Marshal(&snap)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, "m.A", data); err != nil {
			t.Fatal(err)
		}
	}
	putSnapshot(t, env.JS, env.Names, snapshot("other", "A", 1, time.Now(), map[string]float64{"e1": 1})) // a marker: processed after the above
	waitInstalled(t, st, "other", 1, 5*time.Second)
	if _, info, _ := st.Table("m"); info.Generation != first.Generation || info.Mode != control.ModeSnapshot {
		t.Fatalf("after the forged snapshots: generation %d (%s), want %d kept", info.Generation, info.Mode, first.Generation)
	}
	if n := rejected(t, reg, "future"); n != float64(len(forged)) {
		t.Errorf("rejected{reason=future} = %v, want %d", n, len(forged))
	}

	// Install, called directly, applies the same rule.
	direct := snapshot("m", "A", messages.GenerationCeiling(time.Now())+60_000, time.Now(), map[string]float64{"e1": 1})
	if ok, err := st.Install(&direct); ok || err == nil || !strings.Contains(err.Error(), "future") {
		t.Fatalf("Install of generation %d = %v, %v; want refused as from the future", direct.Generation, ok, err)
	}

	// The optimizer's next snapshot, continuing from the installed one, is installed.
	next := honest(first.Generation)
	putSnapshot(t, env.JS, env.Names, next)
	waitInstalled(t, st, "m", next.Generation, 5*time.Second)
}

// rejected returns the snapshots-rejected count of reason in reg.
func rejected(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "switchyard_router_snapshots_rejected_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestSnapshotStaleOnArrivalIgnored: a snapshot already older than
// StaleAfter, though of a higher generation, is not installed over a fresh
// one (it would only switch the model to the local policy); once the
// installed one is stale itself, it is.
func TestSnapshotStaleOnArrivalIgnored(t *testing.T) {
	env := testenv.StartNATS(t)
	reg := prometheus.NewRegistry()
	now := time.Now()
	clock := func() time.Time { return now }
	st, err := control.NewSnapshotStore(control.StoreOptions{Conn: env.Conn, Cluster: "A", Registry: reg, Now: clock, StaleAfter: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w := map[string]float64{"e1": 0.5, "e2": 0.5}
	fresh := snapshot("m", "A", 10, now, w)
	if ok, err := st.Install(&fresh); !ok {
		t.Fatal(err)
	}
	old := snapshot("m", "A", 11, now.Add(-time.Minute), w)
	if ok, err := st.Install(&old); ok || err == nil {
		t.Fatalf("a snapshot a minute old installed over a fresh one: %v", err)
	}
	if _, info, _ := st.Table("m"); info.Generation != 10 || info.Mode != control.ModeSnapshot {
		t.Fatalf("generation %d (%s), want 10 kept in snapshot mode", info.Generation, info.Mode)
	}
	if n := rejected(t, reg, "stale"); n != 1 {
		t.Errorf("rejected{reason=stale} = %v, want 1", n)
	}
	now = now.Add(31 * time.Second) // the installed one is stale now
	if ok, err := st.Install(&old); !ok {
		t.Fatalf("a newer generation not installed over a stale snapshot: %v", err)
	}
}
