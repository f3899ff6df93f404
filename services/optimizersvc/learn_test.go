package optimizersvc_test

import (
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/optimizersvc"
	"github.com/switchyard-dev/switchyard/testenv"
)

// putRegionEngine writes an up engine state of a region, as the aggregator
// writes one from an engine's first signals.
func putRegionEngine(t *testing.T, env *testenv.NATS, engine, region string, capacity float64) {
	t.Helper()
	st := &messages.EngineState{Model: model, Engine: engine, Region: region, Status: messages.StatusUp, Time: time.Now().UnixMilli(),
		TTFTMs: messages.Window{Fast: 300, Slow: 300}, TBTMs: messages.Window{Fast: 5, Slow: 5},
		OutputTokens: messages.Window{Fast: 100, Slow: 100}, LoadRPS: messages.Window{Fast: capacity / 2, Slow: capacity / 2},
		CapacityRPS: capacity, Replicas: 1, Health: 1, Signals: 1}
	put(t, kv(t, env.JS, env.Names.EnginesBucket), model+"."+engine, st)
}

// TestLearnsEnginesFromSignals: engines the network table does not name —
// one of the cluster's region, one of another — are planned once their
// states arrive, without a restart, the near one ahead (the latencies
// themselves: TestRegionNetworkLatency). With NoRegionDefault the unnamed
// engines are not planned.
func TestLearnsEnginesFromSignals(t *testing.T) {
	env := testenv.StartNATS(t)
	putDemand(t, kv(t, env.JS, env.Names.DemandBucket), "A", 150)
	putRegionEngine(t, env, "known", "r1", 100)
	r := record(t, env)
	start(t, env, optimizersvc.Options{Instance: "opt-learn", Clusters: []string{"A"}, ClusterRegions: map[string]string{"A": "r1"},
		NetworkMs: map[string]map[string]float64{"A": {"known": 2}}, MaxInterval: 200 * time.Millisecond})
	testenv.WaitFor(t, 10*time.Second, "a snapshot of A planning engine known", func() bool {
		u, ok := r.latest(model + ".A")
		return ok && u.snap.Weights["known"] > 0
	})
	// 150 req/s against 100 of capacity: A sheds until more engines come.
	if u, _ := r.latest(model + ".A"); !(u.snap.ShedFraction > 0.2) {
		t.Fatalf("one engine of 100 req/s for 150 req/s: shed %v, want about a third", u.snap.ShedFraction)
	}
	putRegionEngine(t, env, "near", "r1", 100)
	putRegionEngine(t, env, "far", "r2", 100)
	testenv.WaitFor(t, 10*time.Second, "engines near and far planned, A's demand served", func() bool {
		u, ok := r.latest(model + ".A")
		return ok && u.snap.Weights["near"] > 0 && u.snap.ShedFraction < 1e-6
	})
	// The region defaults rank the engine of the cluster's region ahead.
	if u, _ := r.latest(model + ".A"); !(u.snap.Weights["near"] > u.snap.Weights["far"]) {
		t.Errorf("weights %v: want engine near (region r1, as cluster A) ahead of far (r2)", u.snap.Weights)
	}
}

func TestNoRegionDefaultLeavesUnnamedEnginesOut(t *testing.T) {
	env := testenv.StartNATS(t)
	putDemand(t, kv(t, env.JS, env.Names.DemandBucket), "A", 50)
	putRegionEngine(t, env, "known", "r1", 100)
	putRegionEngine(t, env, "near", "r1", 100)
	r := record(t, env)
	start(t, env, optimizersvc.Options{Instance: "opt-noregion", Clusters: []string{"A"}, ClusterRegions: map[string]string{"A": "r1"},
		NetworkMs: map[string]map[string]float64{"A": {"known": 2}}, NoRegionDefault: true, MaxInterval: 200 * time.Millisecond})
	testenv.WaitFor(t, 10*time.Second, "a snapshot of A", func() bool {
		u, ok := r.latest(model + ".A")
		return ok && u.snap.Weights["known"] > 0
	})
	if u, _ := r.latest(model + ".A"); u.snap.Weights["near"] != 0 {
		t.Fatalf("NoRegionDefault: engine near (no configured or measured latency) has weight %v, want none", u.snap.Weights["near"])
	}
}
