package optimizersvc_test

import (
	"context"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/optimizersvc"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestDeletedBuckets: the weights bucket deleted under a running optimizer
// comes back and holds snapshots again, with generations above the old
// ones; the engines bucket deleted comes back with the operator's drain
// record written back, and while the aggregator has not rewritten the
// engine states yet the snapshots keep planning for the engines (no shed
// because the control plane lost its state).
func TestDeletedBuckets(t *testing.T) {
	env := testenv.StartNATS(t)
	caseStudy(t, env)
	op := &messages.Operator{Engine: "engine-c", Action: messages.ActionDrain, Reason: "maintenance", Time: time.Now().UnixMilli()}
	put(t, kv(t, env.JS, env.Names.EnginesBucket), "operator.engine-c", op)
	start(t, env, optimizersvc.Options{Instance: "opt-1", MaxInterval: 200 * time.Millisecond, Heartbeat: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	snapshot := func() (*messages.WeightSnapshot, bool) {
		b, err := env.JS.KeyValue(ctx, env.Names.WeightsBucket)
		if err != nil {
			return nil, false
		}
		e, err := b.Get(ctx, model+".B")
		if err != nil {
			return nil, false
		}
		var s messages.WeightSnapshot
		if err := messages.DecodeInto(e.Value(), &s); err != nil {
			t.Fatal(err)
		}
		return &s, true
	}
	var before *messages.WeightSnapshot
	testenv.WaitFor(t, 5*time.Second, "a snapshot for B", func() bool {
		var ok bool
		before, ok = snapshot()
		return ok
	})
	if w := before.Weights["engine-c"]; w != 0 {
		t.Fatalf("drained engine-c has weight %v", w)
	}

	if err := env.JS.DeleteStream(ctx, streams.BucketStream(env.Names.WeightsBucket)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var after *messages.WeightSnapshot
	testenv.WaitFor(t, 5*time.Second, "a snapshot in the re-created weights bucket", func() bool {
		var ok bool
		after, ok = snapshot()
		return ok
	})
	t.Logf("weights bucket deleted: a snapshot again after %s", time.Since(start).Round(10*time.Millisecond))
	if after.Generation <= before.Generation {
		t.Fatalf("snapshot generation %d in the re-created bucket, not above the %d routers hold", after.Generation, before.Generation)
	}

	if err := env.JS.DeleteStream(ctx, streams.BucketStream(env.Names.EnginesBucket)); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	testenv.WaitFor(t, 5*time.Second, "the drain record written back", func() bool {
		b, err := env.JS.KeyValue(ctx, env.Names.EnginesBucket)
		if err != nil {
			return false
		}
		e, err := b.Get(ctx, "operator.engine-c")
		return err == nil && len(e.Value()) > 0
	})
	t.Logf("engines bucket deleted: the drain record back after %s", time.Since(start).Round(10*time.Millisecond))
	// The aggregator has written back only engine-a's state so far: for the
	// carry grace the snapshots go on planning engine-b too (it is not
	// shed), engine-c still drained.
	putEngine(t, kv(t, env.JS, env.Names.EnginesBucket), "engine-a", 100, 1)
	until := time.Now().Add(3 * time.Second)
	for time.Now().Before(until) {
		s, ok := snapshot()
		if !ok {
			t.Fatal("snapshot gone")
		}
		if s.ShedFraction > before.ShedFraction+0.01 || s.Weights["engine-b"] < before.Weights["engine-b"]/2 {
			t.Fatalf("after the engines bucket was deleted: weights %v shed %v; before %v shed %v", s.Weights, s.ShedFraction, before.Weights, before.ShedFraction)
		}
		if s.Weights["engine-c"] != 0 {
			t.Fatalf("engine-c got weight %v: the drain was lost", s.Weights["engine-c"])
		}
		time.Sleep(100 * time.Millisecond)
	}
}
