package aggregator_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/aggregator"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/testenv"
)

func runAggregatorOpts(t *testing.T, env *testenv.NATS, opts aggregator.Options) {
	t.Helper()
	opts.Conn, opts.Logger = env.Dial(t, "aggregator"), zerolog.Nop()
	agg, err := aggregator.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = agg.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// TestAggregatorSurvivesDeletedLayout: each of its streams and buckets
// deleted while the aggregator runs comes back, signals and reports flow
// into the buckets again, and an engine that kept signalling is never marked
// down for the silence the deletion caused.
func TestAggregatorSurvivesDeletedLayout(t *testing.T) {
	env := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	runAggregatorOpts(t, env, aggregator.Options{WriteInterval: 50 * time.Millisecond}) // default stale-after 2 s, down-after 6 s
	eng := &fakeEngine{name: "engine-a", ttft: 100, tbt: 20}
	go eng.run(ctx, t, env.JS, 100*time.Millisecond)
	reports := env.Dial(t, "router")
	var seq uint64
	go func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for ctx.Err() == nil {
			<-tick.C
			seq++
			data, err := messages.Encode(&messages.RouterReport{Model: "llama", Cluster: "A", Router: "r1", Time: time.Now().UnixMilli(),
				Seq: seq, IntervalS: 0.2, Requests: 4, RTTMs: map[string]float64{"engine-a": 2}})
			if err == nil {
				_ = reports.Publish("sy.report.llama.A.r1", data)
			}
		}
	}()
	var engines, demand jetstream.KeyValue
	open := func() {
		testenv.WaitFor(t, 5*time.Second, "the buckets open", func() bool {
			var err1, err2 error
			engines, err1 = env.JS.KeyValue(ctx, env.Names.EnginesBucket)
			demand, err2 = env.JS.KeyValue(ctx, env.Names.DemandBucket)
			return err1 == nil && err2 == nil
		})
	}
	open()
	signals := func() uint64 {
		s, ok := engineState(t, engines, "llama.engine-a")
		if !ok {
			return 0
		}
		if s.Status == messages.StatusDown {
			t.Fatalf("engine-a marked down (%+v) while it kept signalling", s)
		}
		return s.Signals
	}
	reportsIn := func() uint64 {
		e, err := demand.Get(ctx, "llama.A")
		if err != nil {
			return 0
		}
		var d messages.DemandState
		if err := messages.DecodeInto(e.Value(), &d); err != nil {
			t.Fatal(err)
		}
		return d.Reports
	}
	testenv.WaitFor(t, 5*time.Second, "state written", func() bool { return signals() > 0 && reportsIn() > 0 })
	for _, name := range []string{env.Names.SignalStream, env.Names.ReportStream,
		streams.BucketStream(env.Names.EnginesBucket), streams.BucketStream(env.Names.DemandBucket)} {
		beforeSig, beforeRep := signals(), reportsIn()
		if err := env.JS.DeleteStream(ctx, name); err != nil {
			t.Fatalf("delete %s: %v", name, err)
		}
		start := time.Now()
		open()
		// Within 5 s (under the down-after of 6 s), state moves again.
		testenv.WaitFor(t, 5*time.Second, "signals and reports flow again after deleting "+name, func() bool {
			s, r := signals(), reportsIn()
			if name == streams.BucketStream(env.Names.EnginesBucket) || name == streams.BucketStream(env.Names.DemandBucket) {
				return s > 0 && r > 0 // a re-created bucket starts empty; the aggregator writes it again
			}
			return s > beforeSig+5 && r > beforeRep+5
		})
		// The RTT state is written again by the same flush as the demand or
		// by the next: a re-created bucket is written whole once the
		// aggregator learns of its re-creation, which may come a flush after
		// a report made the demand dirty anyway.
		testenv.WaitFor(t, 5*time.Second, "RTT state written again after deleting "+name, func() bool {
			_, err := demand.Get(ctx, "rtt.A.engine-a")
			return err == nil
		})
		t.Logf("%s deleted: state moving again after %s", name, time.Since(start).Round(10*time.Millisecond))
	}
	// The durable consumer alone deleted: re-created, and signals flow again.
	beforeSig := signals()
	if err := env.JS.DeleteConsumer(ctx, env.Names.SignalStream, "sy-aggregator-signals"); err != nil {
		t.Fatalf("delete the signal consumer: %v", err)
	}
	testenv.WaitFor(t, 5*time.Second, "signals flow again after deleting the consumer", func() bool { return signals() > beforeSig+5 })
	if _, err := env.JS.Consumer(ctx, env.Names.SignalStream, "sy-aggregator-signals"); err != nil {
		t.Fatalf("consumer after re-creation: %v", err)
	}
	// Every engine sample stayed up through all of it: watch a little longer.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		signals()
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAggregatorForgetsSilentState: the state of engines that stopped
// signalling, of clusters whose routers stopped reporting and of RTT pairs no
// longer measured leaves the buckets after ForgetAfter; a live engine's
// state, operator records and penalty records stay.
func TestAggregatorForgetsSilentState(t *testing.T) {
	env := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	kv, err := env.JS.KeyValue(ctx, env.Names.EnginesBucket)
	if err != nil {
		t.Fatal(err)
	}
	demand, err := env.JS.KeyValue(ctx, env.Names.DemandBucket)
	if err != nil {
		t.Fatal(err)
	}
	// A key an older aggregator wrote without a TTL, an hour ago.
	old, err := messages.Encode(&messages.EngineState{Model: "llama", Engine: "legacy", Status: messages.StatusDown,
		Time: time.Now().Add(-time.Hour).UnixMilli(), LastSignal: time.Now().Add(-time.Hour).UnixMilli(), Signals: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "llama.legacy", old); err != nil {
		t.Fatal(err)
	}
	op, err := messages.Encode(&messages.Operator{Engine: "engine-a", Action: messages.ActionDrain, Reason: "test", Time: time.Now().UnixMilli()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "operator.engine-a", op); err != nil {
		t.Fatal(err)
	}
	runAggregatorOpts(t, env, aggregator.Options{StaleAfter: 200 * time.Millisecond, DownAfter: 500 * time.Millisecond,
		ForgetAfter: 3 * time.Second, WriteInterval: 50 * time.Millisecond})

	live := &fakeEngine{name: "engine-a", ttft: 100, tbt: 20}
	go live.run(ctx, t, env.JS, 100*time.Millisecond)
	const invented = 200
	for i := range invented {
		data, err := messages.Encode(&messages.EngineSignal{Model: "llama", Engine: fmt.Sprintf("invented-%d", i), Time: time.Now().UnixMilli(),
			Seq: 1, CapacityRPS: 10, Replicas: 1, Health: 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.JS.Publish(ctx, fmt.Sprintf("sy.signal.llama.invented-%d", i), data); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := messages.Encode(&messages.RouterReport{Model: "llama", Cluster: "gone", Router: "r9", Time: time.Now().UnixMilli(),
		Seq: 1, IntervalS: 1, Requests: 5, RTTMs: map[string]float64{"invented-0": 3}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.JS.Publish(ctx, "sy.report.llama.gone.r9", rep); err != nil {
		t.Fatal(err)
	}
	count := func(kv jetstream.KeyValue) int {
		keys, err := kv.ListKeys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for range keys.Keys() {
			n++
		}
		return n
	}
	testenv.WaitFor(t, 5*time.Second, "the invented engines' state written", func() bool { return count(kv) >= invented+2 })
	testenv.WaitFor(t, 5*time.Second, "the report's demand and RTT written", func() bool { return count(demand) == 2 })
	start := time.Now()
	testenv.WaitFor(t, 10*time.Second, "silent state gone", func() bool { return count(kv) == 2 && count(demand) == 0 })
	t.Logf("silent state gone %s after it was written (forget-after 3s)", time.Since(start).Round(10*time.Millisecond))
	if _, err := kv.Get(ctx, "llama.legacy"); err == nil {
		t.Error("the legacy key written without a TTL is still there")
	}
	for _, key := range []string{"llama.engine-a", "operator.engine-a"} {
		if _, err := kv.Get(ctx, key); err != nil {
			t.Errorf("%s: %v, want it kept", key, err)
		}
	}
	if s, ok := engineState(t, kv, "llama.engine-a"); !ok || s.Status != messages.StatusUp {
		t.Errorf("live engine state %+v, want up", s)
	}
}

// TestAggregatorWritesAfterLostAcks: writes whose acknowledgements never
// come (a stream deleted while they are queued in the server drops them
// unanswered; here the engines bucket's stream is set to acknowledge
// nothing for a while) must not stop the aggregator: once the stream
// acknowledges again, the engine's state is written again.
func TestAggregatorWritesAfterLostAcks(t *testing.T) {
	env := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runAggregatorOpts(t, env, aggregator.Options{WriteInterval: 20 * time.Millisecond})
	eng := &fakeEngine{name: "engine-a", ttft: 100, tbt: 20}
	go eng.run(ctx, t, env.JS, 20*time.Millisecond)
	kv, err := env.JS.KeyValue(ctx, env.Names.EnginesBucket)
	if err != nil {
		t.Fatal(err)
	}
	revision := func() uint64 {
		e, err := kv.Get(ctx, "llama.engine-a")
		if err != nil {
			return 0
		}
		return e.Revision()
	}
	testenv.WaitFor(t, 5*time.Second, "engine-a's state written", func() bool { return revision() > 0 })
	setNoAck := func(noAck bool) {
		t.Helper()
		st, err := env.JS.Stream(ctx, streams.BucketStream(env.Names.EnginesBucket))
		if err != nil {
			t.Fatal(err)
		}
		cfg := st.CachedInfo().Config
		cfg.NoAck = noAck
		if _, err := env.JS.UpdateStream(ctx, cfg); err != nil {
			t.Fatalf("engines bucket with NoAck %v: %v", noAck, err)
		}
	}
	setNoAck(true)
	unacked := revision()
	// A write is stored and goes unanswered.
	testenv.WaitFor(t, 5*time.Second, "a write stored without an acknowledgement", func() bool { return revision() > unacked })
	setNoAck(false)
	acked := revision()
	start := time.Now()
	testenv.WaitFor(t, 3*aggregator.WriteAckTimeout, "engine-a's state written again once writes are acknowledged", func() bool { return revision() > acked+5 })
	t.Logf("writes acknowledged again after %s", time.Since(start).Round(10*time.Millisecond))
}
