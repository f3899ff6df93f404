package aggregator_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/aggregator"
	"github.com/switchyard-dev/switchyard/testenv"
)

// panicOn is a BeforeFold hook that panics on every message whose subject
// or key names the engine, router or key "boom": a handler bug provoked by
// one input.
func panicOn(subject string, _ []byte) {
	if strings.Contains(subject, "boom") {
		panic("handler bug on " + subject)
	}
}

func runAggregator(t *testing.T, env *testenv.NATS, reg *prometheus.Registry) (stop func()) {
	t.Helper()
	agg, err := aggregator.New(aggregator.Options{
		Conn: env.Dial(t, "aggregator"), StaleAfter: 2 * time.Second, DownAfter: 6 * time.Second,
		WriteInterval: 50 * time.Millisecond, Logger: zerolog.Nop(), Registerer: reg, BeforeFold: panicOn,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agg.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return func() {
		select {
		case err := <-done:
			t.Fatalf("aggregator stopped by itself: %v", err)
		default:
		}
	}
}

func signalBytes(t *testing.T, engine string, seq uint64) []byte {
	t.Helper()
	data, err := messages.Encode(&messages.EngineSignal{Model: "llama", Engine: engine, Time: time.Now().UnixMilli(), Seq: seq,
		TTFTMs: 50, TBTMs: 10, Queue: 1, Running: 4, KVUse: 0.3, CapacityRPS: 100, LoadRPS: 50, Replicas: 1, Health: 1})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func reportBytes(t *testing.T, router string, seq uint64) []byte {
	t.Helper()
	data, err := messages.Encode(&messages.RouterReport{Model: "llama", Cluster: "east", Router: router, Time: time.Now().UnixMilli(),
		Seq: seq, IntervalS: 1, Requests: 10})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestPoisonMessages publishes undecodable messages and messages its
// handlers panic on, among valid ones, to both streams, and checks that the
// aggregator stays up, counts each by reason, settles them so that nothing
// stays pending or is redelivered, and folds in the valid messages after
// them.
func TestPoisonMessages(t *testing.T) {
	env := testenv.StartNATS(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	alive := runAggregator(t, env, reg)

	pub := func(subject string, data []byte) {
		t.Helper()
		if _, err := env.JS.Publish(ctx, subject, data); err != nil {
			t.Fatalf("publish on %s: %v", subject, err)
		}
	}
	const rounds = 3
	for i := range uint64(rounds) {
		pub("sy.signal.llama.engine-a", []byte{0xc1}) // never valid msgpack
		pub("sy.signal.llama.boom", signalBytes(t, "boom", i+1))
		pub("sy.signal.llama.engine-a", signalBytes(t, "engine-a", i+1))
		pub("sy.report.llama.east.r1", []byte("\x81\xa1v"))
		pub("sy.report.llama.east.boom", reportBytes(t, "boom", i+1))
		pub("sy.report.llama.east.r1", reportBytes(t, "r1", i+1))
	}
	kv, err := env.JS.KeyValue(ctx, env.Names.EnginesBucket)
	if err != nil {
		t.Fatal(err)
	}
	demand, err := env.JS.KeyValue(ctx, env.Names.DemandBucket)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "valid signals after the poison folded in", func() bool {
		s, ok := engineState(t, kv, "llama.engine-a")
		return ok && s.Signals == rounds
	})
	testenv.WaitFor(t, 10*time.Second, "valid reports after the poison folded in", func() bool {
		e, err := demand.Get(ctx, "llama.east")
		if err != nil {
			return false
		}
		var d messages.DemandState
		return messages.DecodeInto(e.Value(), &d) == nil && d.Reports == rounds
	})
	panics := "switchyard_aggregator_handler_panics_total"
	bad := "switchyard_aggregator_bad_messages_total"
	for _, stream := range []string{"signals", "reports"} {
		if n := testenv.MetricSum(t, reg, panics, map[string]string{"handler": stream}); n != rounds {
			t.Errorf("%s: %v panics counted, want %d", stream, n, rounds)
		}
		if n := testenv.MetricSum(t, reg, bad, map[string]string{"stream": stream, "reason": "panic"}); n != rounds {
			t.Errorf("%s: %v bad messages with reason panic, want %d", stream, n, rounds)
		}
		if n := testenv.MetricSum(t, reg, bad, map[string]string{"stream": stream, "reason": "decode"}); n != rounds {
			t.Errorf("%s: %v bad messages with reason decode, want %d", stream, n, rounds)
		}
	}
	if _, ok := engineState(t, kv, "llama.boom"); ok {
		t.Error("the signal the handler panicked on reached sy_engines")
	}
	// Settled: nothing pending, nothing redelivered, everything delivered once.
	for _, c := range []struct{ stream, durable string }{
		{env.Names.SignalStream, "sy-aggregator-signals"},
		{env.Names.ReportStream, "sy-aggregator-reports"},
	} {
		testenv.WaitFor(t, 5*time.Second, c.durable+" settled", func() bool {
			cons, err := env.JS.Consumer(ctx, c.stream, c.durable)
			if err != nil {
				return false
			}
			info, err := cons.Info(ctx)
			if err != nil {
				return false
			}
			if info.NumRedelivered != 0 {
				t.Fatalf("%s: %d messages redelivered", c.durable, info.NumRedelivered)
			}
			return info.NumAckPending == 0 && info.NumPending == 0 && info.AckFloor.Stream == 3*rounds
		})
	}
	// Still up and folding.
	pub("sy.signal.llama.engine-a", signalBytes(t, "engine-a", rounds+1))
	testenv.WaitFor(t, 5*time.Second, "a signal after the checks folded in", func() bool {
		s, ok := engineState(t, kv, "llama.engine-a")
		return ok && s.Signals == rounds+1
	})
	alive()
}

// TestPoisonStateAtStart starts the aggregator on buckets holding values
// that do not decode, that are stored under another key, and that its load
// panics on: it starts, counts and skips them, and keeps the valid state.
func TestPoisonStateAtStart(t *testing.T) {
	env := testenv.StartNATS(t)
	ctx := context.Background()
	kv, err := env.JS.KeyValue(ctx, env.Names.EnginesBucket)
	if err != nil {
		t.Fatal(err)
	}
	good := &messages.EngineState{Model: "llama", Engine: "engine-a", Time: time.Now().UnixMilli(),
		LastSignal: time.Now().UnixMilli(), LastSeq: 7, Signals: 7, Status: messages.StatusUp, CapacityRPS: 100, Replicas: 1, Health: 1}
	goodBytes, err := messages.Encode(good)
	if err != nil {
		t.Fatal(err)
	}
	for key, val := range map[string][]byte{
		"llama.poison":   []byte("\x83\xa1v\x01\xa1k\xacengine_state\xa2tx"), // truncated
		"llama.misfiled": goodBytes,                                          // engine-a's state under another key
		"llama.boom":     goodBytes,                                          // the load panics on it
		"llama.engine-a": goodBytes,
	} {
		if _, err := kv.Put(ctx, key, val); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	alive := runAggregator(t, env, reg)
	bucket := env.Names.EnginesBucket
	testenv.WaitFor(t, 10*time.Second, "three poison values counted", func() bool {
		return testenv.MetricSum(t, reg, "switchyard_aggregator_bad_messages_total", map[string]string{"stream": bucket}) == 3
	})
	for _, reason := range []string{"decode", "invalid", "panic"} {
		if n := testenv.MetricSum(t, reg, "switchyard_aggregator_bad_messages_total", map[string]string{"stream": bucket, "reason": reason}); n != 1 {
			t.Errorf("reason %s: %v values counted, want 1", reason, n)
		}
	}
	// The valid state was loaded: the next signal continues its count.
	if _, err := env.JS.Publish(ctx, "sy.signal.llama.engine-a", signalBytes(t, "engine-a", 8)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "engine-a continued from its stored state", func() bool {
		s, ok := engineState(t, kv, "llama.engine-a")
		return ok && s.Signals == 8
	})
	alive()
}

// TestPoisonFloodOfSubjects is the shape that flooded the log: thousands
// of one-byte messages on distinct subjects. The aggregator counts each,
// writes at most the global cap of log lines, and settles them all (more
// than it holds for termination between two writes).
func TestPoisonFloodOfSubjects(t *testing.T) {
	env := testenv.StartNATS(t)
	reg := prometheus.NewRegistry()
	var logs testenv.Buffer
	agg, err := aggregator.New(aggregator.Options{
		Conn: env.Dial(t, "aggregator"), WriteInterval: 200 * time.Millisecond, Logger: zerolog.New(&logs), Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agg.Run(ctx) }()
	defer func() { cancel(); <-done }()

	const flood = 3000
	for i := range flood {
		if _, err := env.JS.PublishAsync(fmt.Sprintf("sy.signal.llama.x%d", i), []byte{0xc1}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-env.JS.PublishAsyncComplete():
	case <-time.After(10 * time.Second):
		t.Fatal("flood not stored in 10s")
	}
	testenv.WaitFor(t, 15*time.Second, "flood counted", func() bool {
		return testenv.MetricSum(t, reg, "switchyard_aggregator_bad_messages_total", map[string]string{"stream": "signals"}) == flood
	})
	testenv.WaitFor(t, 5*time.Second, "flood settled", func() bool {
		cons, err := env.JS.Consumer(ctx, env.Names.SignalStream, "sy-aggregator-signals")
		if err != nil {
			return false
		}
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumRedelivered == 0 && info.AckFloor.Stream == flood
	})
	if n := strings.Count(logs.String(), "bad message skipped"); n == 0 || n > 20 {
		t.Errorf("%d log lines for %d bad messages on distinct subjects, want 1..20", n, flood)
	}
	select {
	case err := <-done:
		t.Fatalf("aggregator stopped: %v", err)
	default:
	}
}
