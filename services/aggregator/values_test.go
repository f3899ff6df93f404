package aggregator_test

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/testenv"
)

// publishRaw publishes m encoded without validation, as a careless or
// hostile client could.
func publishRaw(t *testing.T, js jetstream.JetStream, subject string, m *messages.RouterReport) {
	t.Helper()
	m.Version, m.Kind = messages.SchemaVersion, messages.KindReport
	data, err := msgpack.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(context.Background(), subject, data); err != nil {
		t.Fatal(err)
	}
}

func demandState(t *testing.T, kv jetstream.KeyValue, key string) (messages.DemandState, bool) {
	t.Helper()
	e, err := kv.Get(context.Background(), key)
	if err != nil {
		return messages.DemandState{}, false
	}
	var d messages.DemandState
	if err := messages.DecodeInto(e.Value(), &d); err != nil {
		t.Fatalf("demand %s does not decode: %v", key, err)
	}
	return d, true
}

// TestForgedReportsKeepRealDemand: a real router reports 20 req/s; forged
// reports under its name (a far-future sequence number and time, a denormal
// interval, an impossible rate, a past date, 1970) and reports of hundreds of
// invented routers neither silence it nor block the writing of its cluster's
// demand: each bad report is counted by reason, and the demand stays the
// real router's.
func TestForgedReportsKeepRealDemand(t *testing.T) {
	env := testenv.StartNATS(t)
	reg := prometheus.NewRegistry()
	defer startAggregator(t, env, reg)()
	kv, err := env.JS.KeyValue(context.Background(), env.Names.DemandBucket)
	if err != nil {
		t.Fatal(err)
	}
	const subject = "sy.report.llama.A.r1"
	// The real router: 2 requests per 100 ms interval, sequence numbers from
	// its start time as control.Reporter numbers them.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var lastSeq uint64
	wg.Add(1)
	go func() {
		defer wg.Done()
		seq := uint64(time.Now().UnixMilli())
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; i < 600; i++ { // bounded: at most a minute
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			seq++
			data, err := messages.Encode(&messages.RouterReport{Model: "llama", Cluster: "A", Router: "r1",
				Time: time.Now().UnixMilli(), Seq: seq, IntervalS: 0.1, Requests: 2})
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := env.JS.Publish(ctx, subject, data); err == nil {
				mu.Lock()
				lastSeq = seq
				mu.Unlock()
			}
		}
	}()
	defer func() { cancel(); wg.Wait() }()
	realDemand := func(what string, after time.Time) {
		t.Helper()
		testenv.WaitFor(t, 10*time.Second, what, func() bool {
			d, ok := demandState(t, kv, "llama.A")
			r := d.Routers["r1"]
			mu.Lock()
			real := lastSeq
			mu.Unlock()
			return ok && math.Abs(d.RPS.Fast-20) < 2 && r.Seq <= real && real-r.Seq < 20 &&
				time.UnixMilli(d.Time).After(after)
		})
	}
	realDemand("the real router's 20 req/s in the demand", time.Now())

	now := time.Now()
	forged := []struct {
		reason string
		rep    messages.RouterReport
	}{
		// Valid, but numbered and dated ahead: folded (1 req/s) and then
		// superseded by the real router's next reports.
		{"", messages.RouterReport{Time: now.Add(59 * time.Second).UnixMilli(), Seq: math.MaxUint64, IntervalS: 1, Requests: 1}},
		{"future", messages.RouterReport{Time: now.Add(time.Hour).UnixMilli(), Seq: math.MaxUint64, IntervalS: 1, Requests: 1}},
		{"invalid", messages.RouterReport{Time: now.UnixMilli(), Seq: math.MaxUint64, IntervalS: 5e-324, Requests: 1}},
		{"invalid", messages.RouterReport{Time: now.UnixMilli(), Seq: math.MaxUint64, IntervalS: 1, Requests: 1 << 40}},
		{"invalid", messages.RouterReport{Time: 1000, Seq: math.MaxUint64, IntervalS: 1, Requests: 1}},
		{"expired", messages.RouterReport{Time: now.Add(-10 * time.Minute).UnixMilli(), Seq: math.MaxUint64, IntervalS: 1, Requests: 1}},
	}
	want := map[string]float64{}
	for _, f := range forged {
		rep := f.rep
		rep.Model, rep.Cluster, rep.Router = "llama", "A", "r1"
		publishRaw(t, env.JS, subject, &rep)
		if f.reason != "" {
			want[f.reason]++
		}
	}
	// The forged reports are folded in order: once the bad ones are
	// counted, the valid forged one has been folded before them.
	testenv.WaitFor(t, 5*time.Second, "the bad reports counted", func() bool {
		for reason, n := range want {
			if badByReason(t, reg, reason) < n {
				return false
			}
		}
		return true
	})
	for reason, n := range want {
		if got := badByReason(t, reg, reason); got != n {
			t.Errorf("bad reports with reason %s: %v, want %v", reason, got, n)
		}
	}
	counted := time.Now()
	realDemand("the real router's 20 req/s again after the forged reports", counted)

	// Invented routers, beyond what a demand state can list: the ones over
	// the limit are refused, and the cluster's demand is still written with
	// the real router in it.
	for i := 0; i < 200; i++ {
		r := fmt.Sprintf("x%03d", i)
		publishRaw(t, env.JS, "sy.report.llama.A."+r, &messages.RouterReport{Model: "llama", Cluster: "A", Router: r,
			Time: time.Now().UnixMilli(), Seq: 1, IntervalS: 1})
	}
	testenv.WaitFor(t, 10*time.Second, "the invented routers over the limit refused", func() bool {
		return badByReason(t, reg, "too_many_routers") >= 40
	})
	written := time.Now()
	testenv.WaitFor(t, 10*time.Second, "the demand written after the invented routers, with the real one", func() bool {
		d, ok := demandState(t, kv, "llama.A")
		_, real := d.Routers["r1"]
		return ok && real && time.UnixMilli(d.Time).After(written) && math.Abs(d.RPS.Fast-20) < 2
	})
}

// TestForgedSignalKeepsRealEngine: a signal under a real engine's name with
// the highest sequence number and a time 59 s ahead does not make the
// engine's next signals look already seen: they keep being folded in and the
// engine stays up. (Both the fold and the write hold the stored time at most
// a second ahead of the clock; this guards the rule for signals.)
func TestForgedSignalKeepsRealEngine(t *testing.T) {
	env := testenv.StartNATS(t)
	reg := prometheus.NewRegistry()
	defer startAggregator(t, env, reg)()
	kv, err := env.JS.KeyValue(context.Background(), env.Names.EnginesBucket)
	if err != nil {
		t.Fatal(err)
	}
	eng := &fakeEngine{name: "engine-a", ttft: 100, tbt: 20, seq: uint64(time.Now().UnixMicro())}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // bounds the engine's publishing
	done := make(chan struct{})
	go func() { defer close(done); eng.run(ctx, t, env.JS, 50*time.Millisecond) }()
	defer func() { cancel(); <-done }()
	testenv.WaitFor(t, 10*time.Second, "the engine up", func() bool {
		st, ok := engineState(t, kv, "llama.engine-a")
		return ok && st.Status == messages.StatusUp && st.Signals > 3
	})
	data, err := messages.Encode(&messages.EngineSignal{Model: "llama", Engine: "engine-a", Time: time.Now().Add(59 * time.Second).UnixMilli(),
		Seq: math.MaxUint64, TTFTMs: 100, TBTMs: 20, CapacityRPS: 100, Replicas: 1, Health: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.JS.Publish(context.Background(), "sy.signal.llama.engine-a", data); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the forged signal folded in", func() bool {
		st, ok := engineState(t, kv, "llama.engine-a")
		return ok && st.LastSeq == math.MaxUint64
	})
	before, _ := engineState(t, kv, "llama.engine-a")
	// DownAfter is 800 ms in these tests: had the real signals been taken
	// for duplicates, the engine would be down by the end of the wait.
	testenv.WaitFor(t, 5*time.Second, "the real signals folded in again", func() bool {
		st, ok := engineState(t, kv, "llama.engine-a")
		return ok && st.LastSeq != math.MaxUint64 && st.Signals > before.Signals+10 && st.Status == messages.StatusUp
	})
	if st, _ := engineState(t, kv, "llama.engine-a"); st.LastSignal > time.Now().Add(2*time.Second).UnixMilli() {
		t.Errorf("stored last signal %s, ahead of the clock", time.UnixMilli(st.LastSignal))
	}
}
