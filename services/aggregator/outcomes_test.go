package aggregator_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/testenv"
)

func publish(t *testing.T, js jetstream.JetStream, subject string, m messages.Message) {
	t.Helper()
	data, err := messages.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(context.Background(), subject, data); err != nil {
		t.Fatal(err)
	}
}

// TestAggregatorOutcomes folds router reports' per-engine outcomes into the
// engine's state, and leaves penalty and operator records in sy_engines alone.
func TestAggregatorOutcomes(t *testing.T) {
	env := testenv.StartNATS(t)
	ctx := context.Background()
	kv, err := env.JS.KeyValue(ctx, env.Names.EnginesBucket)
	if err != nil {
		t.Fatal(err)
	}
	// Records of other kinds in the bucket before the aggregator starts.
	now := time.Now().UnixMilli()
	for key, m := range map[string]messages.Message{
		"penalty.llama.engine-a": &messages.Penalty{Model: "llama", Engine: "engine-a", Time: now, Phase: messages.PhasePenalised,
			Reason: messages.ReasonErrorRate, Since: now, Until: now + 5000, RecoverUntil: now + 15000, Strikes: 1},
		"operator.engine-b": &messages.Operator{Engine: "engine-b", Action: messages.ActionDrain, Time: now},
	} {
		data, err := messages.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, key, data); err != nil {
			t.Fatal(err)
		}
	}
	stop := startAggregator(t, env, prometheus.NewRegistry())
	defer func() { stop() }()

	for i, e := range []string{"engine-a", "engine-b"} {
		publish(t, env.JS, "sy.signal.llama."+e, &messages.EngineSignal{Model: "llama", Engine: e, Time: time.Now().UnixMilli(),
			Seq: uint64(i + 1), TTFTMs: 100, TBTMs: 10, CapacityRPS: 100, Replicas: 1, Health: 1})
	}
	testenv.WaitFor(t, 10*time.Second, "engine states written", func() bool {
		_, a := engineState(t, kv, "llama.engine-a")
		_, b := engineState(t, kv, "llama.engine-b")
		return a && b
	})
	report := func(seq uint64, router string, eo map[string]messages.EngineOutcome) {
		publish(t, env.JS, "sy.report.llama.A."+router, &messages.RouterReport{Model: "llama", Cluster: "A", Router: router,
			Time: time.Now().UnixMilli(), Seq: seq, IntervalS: 1, Requests: 100, Engines: eo})
	}
	// Healthy, then engine-a fails every request in two reports (two routers);
	// engine-b keeps succeeding with a few 429s and client errors (which do
	// not count) and an
	// engine that never signalled is ignored.
	report(1, "r1", map[string]messages.EngineOutcome{
		"engine-a": {Sent: 50, Succeeded: 50, TTFTMs: 120},
		"engine-b": {Sent: 50, Succeeded: 50, TTFTMs: 80},
	})
	report(2, "r1", map[string]messages.EngineOutcome{
		"engine-a": {Sent: 50, Errors: map[string]int64{"5xx": 40, "connect": 5}, Timeouts: 5},
		"engine-b": {Sent: 80, Succeeded: 45, Errors: map[string]int64{"429": 5, messages.ErrorClassClient: 30}, TTFTMs: 80},
		"ghost":    {Sent: 5, Succeeded: 5},
	})
	report(1, "r2", map[string]messages.EngineOutcome{
		"engine-a": {Sent: 50, Errors: map[string]int64{"5xx": 50}},
	})
	testenv.WaitFor(t, 10*time.Second, "outcomes folded into engine-a's state", func() bool {
		s, ok := engineState(t, kv, "llama.engine-a")
		return ok && s.Outcomes != nil && s.Outcomes.Reports == 3
	})
	a, _ := engineState(t, kv, "llama.engine-a")
	o := a.Outcomes
	if o.FailedIntervals != 2 {
		t.Errorf("engine-a failed intervals %d, want 2", o.FailedIntervals)
	}
	// Sums: sent 150, failed 95 (+5 timeouts) with a little decay of the first report.
	if o.ErrorRate.Fast < 0.6 || o.ErrorRate.Fast > 0.7 || o.ErrorRate.Slow < 0.6 || o.ErrorRate.Slow > 0.66 {
		t.Errorf("engine-a error rate %+v, want about 95/150", o.ErrorRate)
	}
	if o.TimeoutRate.Slow < 0.03 || o.TimeoutRate.Slow > 0.04 {
		t.Errorf("engine-a timeout rate %+v, want about 5/150", o.TimeoutRate)
	}
	if math.Abs(o.TTFTMs.Fast-120) > 1e-6 || o.LastSent == 0 {
		t.Errorf("engine-a TTFT %+v last sent %d, want 120 ms kept while nothing succeeds", o.TTFTMs, o.LastSent)
	}
	testenv.WaitFor(t, 10*time.Second, "outcomes folded into engine-b's state", func() bool {
		s, ok := engineState(t, kv, "llama.engine-b")
		return ok && s.Outcomes != nil && s.Outcomes.Reports == 2
	})
	b, _ := engineState(t, kv, "llama.engine-b")
	if b.Outcomes.ErrorRate.Slow != 0 || b.Outcomes.FailedIntervals != 0 || math.Abs(b.Outcomes.TTFTMs.Slow-80) > 1e-6 {
		t.Errorf("engine-b outcomes %+v, want no errors (429s and client errors do not count) and TTFT 80", b.Outcomes)
	}
	if _, ok := engineState(t, kv, "llama.ghost"); ok {
		t.Errorf("a report created a state for an engine that never signalled")
	}
	// A success resets the failure streak.
	report(3, "r1", map[string]messages.EngineOutcome{"engine-a": {Sent: 10, Succeeded: 1, Errors: map[string]int64{"5xx": 9}, TTFTMs: 150}})
	testenv.WaitFor(t, 10*time.Second, "failure streak reset", func() bool {
		s, ok := engineState(t, kv, "llama.engine-a")
		return ok && s.Outcomes != nil && s.Outcomes.Reports == 4 && s.Outcomes.FailedIntervals == 0
	})
	// The other records are untouched.
	for _, key := range []string{"penalty.llama.engine-a", "operator.engine-b"} {
		e, err := kv.Get(ctx, key)
		if err != nil || e.Revision() > 2 {
			t.Errorf("%s: %v (revision %v), want untouched", key, err, e)
		}
	}
	stop()
	// A restart reloads the windows (and skips the other kinds quietly).
	stop = startAggregator(t, env, prometheus.NewRegistry())
	report(4, "r1", map[string]messages.EngineOutcome{"engine-a": {Sent: 10, Succeeded: 10, TTFTMs: 150}})
	testenv.WaitFor(t, 10*time.Second, "outcomes continued after restart", func() bool {
		s, ok := engineState(t, kv, "llama.engine-a")
		return ok && s.Outcomes != nil && s.Outcomes.Reports == 5 && s.Outcomes.ErrorRate.Slow > 0.4
	})
}
