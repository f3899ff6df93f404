package optimizersvc_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/optimizersvc"
	"github.com/switchyard-dev/switchyard/testenv"
)

// forgedSnapshot encodes a weight snapshot of generation gen the way a
// careless or hostile writer could, without validating it.
func forgedSnapshot(t *testing.T, cluster string, gen uint64) []byte {
	t.Helper()
	data, err := msgpack.Marshal(&messages.WeightSnapshot{Version: messages.SchemaVersion, Kind: messages.KindWeights,
		Model: model, Cluster: cluster, Generation: gen, Time: time.Now().UnixMilli(),
		Weights: map[string]float64{"engine-a": 0}, ShedFraction: 1, Writer: "forger"})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestRecoversFromUnfollowableGeneration: a weights key holding a generation
// nobody can follow (2^64-1, the one a hostile probe wrote; 2^63; one far
// above the clock's ceiling) is overwritten by the service with a generation
// routers accept, whether the value was there before the service started (a
// restart on a poisoned bucket) or written while it runs, and the next
// snapshots follow it.
func TestRecoversFromUnfollowableGeneration(t *testing.T) {
	env := testenv.StartNATS(t)
	caseStudy(t, env)
	weights := kv(t, env.JS, env.Names.WeightsBucket)
	ctx := context.Background()
	// Poisoned before the service starts.
	if _, err := weights.Put(ctx, model+".A", forgedSnapshot(t, "A", math.MaxUint64)); err != nil {
		t.Fatal(err)
	}
	if _, err := weights.Put(ctx, model+".C", forgedSnapshot(t, "C", messages.GenerationCeiling(time.Now())+1e9)); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	start(t, env, optimizersvc.Options{Instance: "opt-1", Registerer: reg, MinInterval: 20 * time.Millisecond,
		MaxInterval: 200 * time.Millisecond, Heartbeat: time.Second})

	// followed waits until key holds a valid snapshot of opt-1 and returns it.
	followed := func(key, what string) messages.WeightSnapshot {
		t.Helper()
		var snap messages.WeightSnapshot
		testenv.WaitFor(t, 5*time.Second, what, func() bool {
			e, err := weights.Get(ctx, key)
			if err != nil {
				return false
			}
			snap = messages.WeightSnapshot{}
			return messages.DecodeInto(e.Value(), &snap) == nil && snap.Writer == "opt-1"
		})
		return snap
	}
	checkGen := func(snap messages.WeightSnapshot, key string) {
		t.Helper()
		if ceiling := messages.GenerationCeiling(time.Now()); snap.Generation == 0 || snap.Generation > ceiling {
			t.Fatalf("%s: generation %d, want 1..%d", key, snap.Generation, ceiling)
		}
		if want := uint64(snap.Time - messages.EpochMs); snap.Generation != want {
			t.Errorf("%s: generation %d, want the clock's %d", key, snap.Generation, want)
		}
	}
	for _, c := range []string{"A", "C"} {
		checkGen(followed(model+"."+c, "the service overwrites the poisoned key "+c+" at start"), c)
	}
	b := followed(model+".B", "a snapshot of B")

	// Poisoned while the service runs: it notices on its next write of the
	// key (the heartbeat at the latest) and overwrites it.
	for i, gen := range []uint64{math.MaxUint64, 1 << 63} {
		if _, err := weights.Put(ctx, model+".B", forgedSnapshot(t, "B", gen)); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 5*time.Second, "the service overwrites B's forged generation", func() bool {
			e, err := weights.Get(ctx, model+".B")
			var snap messages.WeightSnapshot
			if err != nil || messages.DecodeInto(e.Value(), &snap) != nil || snap.Writer != "opt-1" {
				return false
			}
			if snap.Generation <= b.Generation {
				t.Fatalf("round %d: B at generation %d after %d", i, snap.Generation, b.Generation)
			}
			b = snap
			return true
		})
		checkGen(b, "B")
	}
	// And it keeps following its own generations.
	next := b
	testenv.WaitFor(t, 5*time.Second, "the heartbeat rewrite of B", func() bool {
		e, err := weights.Get(ctx, model+".B")
		next = messages.WeightSnapshot{}
		return err == nil && messages.DecodeInto(e.Value(), &next) == nil && next.Generation > b.Generation
	})
	checkGen(next, "B")
	if n := testenv.MetricSum(t, reg, "switchyard_optimizer_weights_overwritten_total", nil); n < 4 {
		t.Errorf("switchyard_optimizer_weights_overwritten_total = %v, want >= 4", n)
	}
	if n := testenv.MetricSum(t, reg, "switchyard_optimizer_bad_values_total", nil); n < 4 {
		t.Errorf("switchyard_optimizer_bad_values_total = %v, want >= 4", n)
	}
}
