package aggregator_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/aggregator"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/testenv"
)

// fakeEngine publishes signals with a constant TTFT and TBT, counting the
// publishes JetStream acknowledged.
type fakeEngine struct {
	name      string
	ttft, tbt float64
	acked     atomic.Int64
	seq       uint64
}

func (f *fakeEngine) run(ctx context.Context, t *testing.T, js jetstream.JetStream, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		f.seq++
		data, err := messages.Encode(&messages.EngineSignal{Model: "llama", Engine: f.name, Time: time.Now().UnixMilli(), Seq: f.seq,
			TTFTMs: f.ttft, TBTMs: f.tbt, Queue: 1, Running: 4, KVUse: 0.3, CapacityRPS: 100, LoadRPS: 50, Replicas: 1, Health: 1})
		if err != nil {
			t.Error(err)
			return
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err = js.Publish(pctx, "sy.signal.llama."+f.name, data, jetstream.WithMsgID(fmt.Sprintf("%s-%d", f.name, f.seq)))
		cancel()
		if err == nil {
			f.acked.Add(1)
		}
	}
}

func engineState(t *testing.T, kv jetstream.KeyValue, key string) (*messages.EngineState, bool) {
	e, err := kv.Get(context.Background(), key)
	if err != nil {
		return nil, false
	}
	var s messages.EngineState
	if err := messages.DecodeInto(e.Value(), &s); err != nil {
		t.Fatalf("state %s does not decode: %v", key, err)
	}
	return &s, true
}

func startAggregator(t *testing.T, env *testenv.NATS, reg *prometheus.Registry) (stop func()) {
	t.Helper()
	agg, err := aggregator.New(aggregator.Options{
		Conn: env.Dial(t, "aggregator"), StaleAfter: 300 * time.Millisecond, DownAfter: 800 * time.Millisecond,
		WriteInterval: 50 * time.Millisecond, Logger: zerolog.Nop(), Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agg.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("aggregator: %v", err)
		}
	}
}

func TestAggregatorSignalPath(t *testing.T) {
	env := testenv.StartNATS(t)
	ctx := context.Background()
	kv, err := env.JS.KeyValue(ctx, env.Names.EnginesBucket)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	stopAgg := startAggregator(t, env, reg)

	engines := []*fakeEngine{{name: "engine-a", ttft: 100, tbt: 20}, {name: "engine-b", ttft: 200, tbt: 30}, {name: "engine-c", ttft: 300, tbt: 40}}
	var wg sync.WaitGroup
	cancels := make([]context.CancelFunc, len(engines))
	for i, e := range engines {
		ectx, cancel := context.WithCancel(ctx)
		cancels[i] = cancel
		wg.Add(1)
		go func() { defer wg.Done(); e.run(ectx, t, env.JS, 20*time.Millisecond) }()
	}
	defer func() {
		for _, c := range cancels {
			c()
		}
		wg.Wait()
	}()

	// Every engine's state holds EWMA values within 5% of what it measured.
	testenv.WaitFor(t, 5*time.Second, "three engines in sy_engines with EWMAs within 5%", func() bool {
		for _, e := range engines {
			s, ok := engineState(t, kv, "llama."+e.name)
			if !ok || s.Status != messages.StatusUp || s.Signals < 5 {
				return false
			}
			for _, w := range []struct{ got, want float64 }{{s.TTFTMs.Fast, e.ttft}, {s.TTFTMs.Slow, e.ttft}, {s.TBTMs.Fast, e.tbt}} {
				if math.Abs(w.got-w.want) > 0.05*w.want {
					return false
				}
			}
		}
		return true
	})

	// Bad messages are counted and skipped; the good ones keep flowing.
	raw := func(m map[string]any) []byte {
		b, err := msgpack.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	good := func() map[string]any {
		return map[string]any{"v": 1, "k": "signal", "m": "llama", "e": "engine-a", "t": time.Now().UnixMilli(), "n": 1,
			"ttft": 1.0, "tbt": 1.0, "q": 0, "run": 0, "kv": 0.0, "cap": 1.0, "rps": 0.0, "rep": 1, "h": 1.0}
	}
	nan := good()
	nan["ttft"] = math.NaN()
	v9 := good()
	v9["v"] = 9
	dotted := good()
	dotted["e"] = "engine.x"
	oversize := good()
	oversize["r"] = strings.Repeat("x", messages.MaxMessageSize+1)
	bad := []struct {
		subject string
		data    []byte
	}{
		{"sy.signal.llama.engine-a", []byte("garbage \x00\xff")},
		{"sy.signal.llama.engine-a", raw(nan)},
		{"sy.signal.llama.engine-a", raw(v9)},
		{"sy.signal.llama.engine-a", raw(oversize)},
		{"sy.signal.llama.engine.x", raw(dotted)},
	}
	for _, b := range bad {
		if _, err := env.JS.Publish(ctx, b.subject, b.data); err != nil {
			t.Fatalf("publish bad message on %s: %v", b.subject, err)
		}
	}
	badTotal := func() float64 {
		mfs, _ := reg.Gather()
		total := 0.0
		for _, mf := range mfs {
			if mf.GetName() == "switchyard_aggregator_bad_messages_total" {
				for _, m := range mf.GetMetric() {
					total += m.GetCounter().GetValue()
				}
			}
		}
		return total
	}
	testenv.WaitFor(t, 5*time.Second, "five bad messages counted", func() bool { return badTotal() == 5 })
	for _, reason := range []string{"decode", "invalid", "version", "too_large"} {
		if n := badByReason(t, reg, reason); n < 1 {
			t.Errorf("no bad message counted with reason %q", reason)
		}
	}
	before, _ := engineState(t, kv, "llama.engine-a")
	testenv.WaitFor(t, 2*time.Second, "good signals still folded in after bad ones", func() bool {
		s, _ := engineState(t, kv, "llama.engine-a")
		return s.Signals > before.Signals+3
	})
	if _, ok := engineState(t, kv, "llama.engine.x"); ok {
		t.Fatal("engine with a dot in its name reached sy_engines")
	}

	// An engine that stops signalling becomes stale, then down, within the bound.
	cancels[2]()
	stopped := time.Now()
	testenv.WaitFor(t, 3*time.Second, "engine-c down", func() bool {
		s, _ := engineState(t, kv, "llama.engine-c")
		return s.Status == messages.StatusDown
	})
	if took := time.Since(stopped); took > 800*time.Millisecond+500*time.Millisecond {
		t.Fatalf("engine-c went down after %s, bound is 800ms + write interval", took)
	}

	// Restart: the aggregator stops while engines keep publishing, starts
	// again, and ends with exactly one fold per acknowledged signal.
	stopAgg()
	time.Sleep(200 * time.Millisecond) // engines publish while the aggregator is away
	stopAgg = startAggregator(t, env, prometheus.NewRegistry())
	defer stopAgg()
	time.Sleep(200 * time.Millisecond)
	for _, c := range cancels[:2] {
		c()
	}
	wg.Wait()
	for _, e := range engines {
		// What the stream holds for the engine: a publish whose ack timed out
		// on a busy machine may still have been stored (and folded in).
		want := storedSignals(t, env, "sy.signal.llama."+e.name)
		if e.name == "engine-a" {
			want -= 4 // the bad messages published on engine-a's subject above
		}
		if acked := uint64(e.acked.Load()); want < acked {
			t.Fatalf("%s: %d signals acknowledged but only %d stored", e.name, acked, want)
		}
		// Polled by hand so that a miss says how many were folded: stuck
		// below want (a lost signal) and slow (a busy machine) differ.
		deadline := time.Now().Add(10 * time.Second)
		for {
			s, _ := engineState(t, kv, "llama."+e.name)
			if s.Signals > want {
				t.Fatalf("%s: %d signals folded, only %d published: double-counted", e.name, s.Signals, want)
			}
			if s.Signals == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d signals folded after 10s, want exactly its %d (acknowledged %d)", e.name, s.Signals, want, e.acked.Load())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func badByReason(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "switchyard_aggregator_bad_messages_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

// storedSignals returns how many messages SY_SIGNALS holds on subject.
func storedSignals(t *testing.T, env *testenv.NATS, subject string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := env.JS.Stream(ctx, env.Names.SignalStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subject]
}

// publishBacklog stores signals first..first+n-1 of engine, one
// millisecond apart, ending a minute ago plus first.
func publishBacklog(t *testing.T, ctx context.Context, env *testenv.NATS, engine string, first, n int) {
	t.Helper()
	subject := "sy.signal.llama." + engine
	stored := storedSignals(t, env, subject)
	base := time.Now().Add(-time.Minute).UnixMilli()
	for i := first; i < first+n; i++ {
		data, err := messages.Encode(&messages.EngineSignal{Model: "llama", Engine: engine, Time: base + int64(i), Seq: uint64(i),
			TTFTMs: 100, TBTMs: 20, Queue: 1, Running: 4, KVUse: 0.3, CapacityRPS: 100, LoadRPS: 50, Replicas: 1, Health: 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.JS.PublishAsync(subject, data); err != nil {
			t.Fatal(err)
		}
		// Wait for the acknowledgements every 1,000 publishes: the client
		// stalls, then fails, with more outstanding.
		if (i-first)%1000 == 999 || i == first+n-1 {
			select {
			case <-env.JS.PublishAsyncComplete():
			case <-ctx.Done():
				t.Fatal("backlog not stored in time")
			}
		}
	}
	if got := storedSignals(t, env, subject) - stored; got != uint64(n) {
		t.Fatalf("the stream stored %d of the %d signals published", got, n)
	}
}

// waitFolded waits up to 10 s for key's state to count want signals, and
// fails at once when it counts more.
func waitFolded(t *testing.T, kv jetstream.KeyValue, key string, want, before uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, _ := engineState(t, kv, key)
		if s.Signals > want {
			t.Fatalf("%s: %d signals folded, %d published: double-counted", key, s.Signals, want)
		}
		if s.Signals == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d signals folded 10 s after the restart, want all %d (the first aggregator had written %d when stopped)", key, s.Signals, want, before)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// backlogSize is how many signals the backlog tests store before an
// aggregator starts: enough that it is still working through them when the
// first state write lands.
const backlogSize = 20000

// startBacklog starts a NATS server holding n signals of engine-z and
// returns it, a context for the test and the engines bucket.
func startBacklog(t *testing.T, n int) (*testenv.NATS, context.Context, jetstream.KeyValue) {
	t.Helper()
	env := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	// The backlog is on one subject, longer than SY_SIGNALS keeps of one
	// subject by default.
	if err := streams.Provision(ctx, env.JS, env.Names, streams.ProvisionOptions{SignalMaxPerSubject: int64(2 * n)}); err != nil {
		t.Fatal(err)
	}
	kv, err := env.JS.KeyValue(ctx, env.Names.EnginesBucket)
	if err != nil {
		t.Fatal(err)
	}
	publishBacklog(t, ctx, env, "engine-z", 1, n)
	return env, ctx, kv
}

// TestRestartMidBacklog: an aggregator stopped while it works through a
// backlog, with messages pulled but not yet folded in, loses none of them:
// its successor folds every signal in exactly once.
func TestRestartMidBacklog(t *testing.T) {
	env, _, kv := startBacklog(t, backlogSize)
	const n = backlogSize
	// Stop the first aggregator as soon as it has written some of the
	// backlog, while the rest is pulled or on its way.
	stop := startAggregator(t, env, prometheus.NewRegistry())
	testenv.WaitFor(t, 10*time.Second, "part of the backlog folded in", func() bool {
		s, ok := engineState(t, kv, "llama.engine-z")
		return ok && s.Signals > 0
	})
	stop()
	first, _ := engineState(t, kv, "llama.engine-z")
	stop = startAggregator(t, env, prometheus.NewRegistry())
	defer stop()
	waitFolded(t, kv, "llama.engine-z", n, first.Signals)
}

// TestCrashMidBacklog: an aggregator that loses its connection (as a crash
// does) while it works through a backlog leaves messages delivered but not
// acknowledged; its successor folds every signal in exactly once anyway,
// and a later clean restart keeps folding.
func TestCrashMidBacklog(t *testing.T) {
	env, ctx, kv := startBacklog(t, backlogSize)
	const n = backlogSize
	nc := env.Dial(t, "doomed aggregator")
	agg, err := aggregator.New(aggregator.Options{Conn: nc, WriteInterval: 50 * time.Millisecond, Logger: zerolog.Nop(),
		Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	actx, crash := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agg.Run(actx) }()
	testenv.WaitFor(t, 10*time.Second, "part of the backlog folded in", func() bool {
		s, ok := engineState(t, kv, "llama.engine-z")
		return ok && s.Signals > 0
	})
	nc.Close() // the crash: nothing more is acknowledged or written
	crash()
	<-done
	first, _ := engineState(t, kv, "llama.engine-z")
	stop := startAggregator(t, env, prometheus.NewRegistry())
	waitFolded(t, kv, "llama.engine-z", n, first.Signals)
	stop()
	stop = startAggregator(t, env, prometheus.NewRegistry())
	defer stop()
	publishBacklog(t, ctx, env, "engine-z", n+1, 10)
	waitFolded(t, kv, "llama.engine-z", n+10, n)
}

// TestRestartCountsSilenceFromStart: engine states an earlier run left in
// sy_engines, last signalled 20 s ago, are not made stale or down by the
// restarted aggregator's first writes, before the engines' first signals of
// this run could arrive: silence counts from the aggregator's start. An
// engine that stays silent still goes stale, then down, on the usual
// bounds from then on, and one that was down stays down.
func TestRestartCountsSilenceFromStart(t *testing.T) {
	env := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	kv, err := env.JS.KeyValue(ctx, env.Names.EnginesBucket)
	if err != nil {
		t.Fatal(err)
	}
	last := time.Now().Add(-20 * time.Second).UnixMilli()
	for _, st := range []messages.EngineState{
		{Model: "llama", Engine: "was-up", Status: messages.StatusUp, Time: last, LastSignal: last, CapacityRPS: 50, Health: 1, Replicas: 1},
		{Model: "llama", Engine: "was-down", Status: messages.StatusDown, Time: last, LastSignal: last, CapacityRPS: 50, Health: 1, Replicas: 1},
	} {
		data, err := messages.Encode(&st)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, "llama."+st.Engine, data); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	stop := startAggregator(t, env, prometheus.NewRegistry()) // stale after 300 ms, down after 800 ms
	defer stop()
	w, err := kv.Watch(ctx, "llama.was-up", jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	firstNotUp := time.Duration(-1)
	for firstNotUp < 0 {
		select {
		case e := <-w.Updates():
			var s messages.EngineState
			if err := messages.DecodeInto(e.Value(), &s); err != nil {
				t.Fatal(err)
			}
			if s.Status != messages.StatusUp {
				firstNotUp = time.Since(start)
			}
		case <-ctx.Done():
			t.Fatal("the silent engine never went stale")
		}
	}
	if firstNotUp < 300*time.Millisecond {
		t.Fatalf("the engine was written %s after the aggregator's start %v: before its stale bound of 300 ms", "not up", firstNotUp)
	}
	testenv.WaitFor(t, 3*time.Second, "the silent engine down", func() bool {
		s, ok := engineState(t, kv, "llama.was-up")
		return ok && s.Status == messages.StatusDown
	})
	if s, ok := engineState(t, kv, "llama.was-down"); !ok || s.Status != messages.StatusDown {
		t.Fatalf("the engine down before the restart: %+v", s)
	}
}
