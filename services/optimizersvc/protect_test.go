package optimizersvc_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/aggregator"
	"github.com/switchyard-dev/switchyard/services/optimizersvc"
	"github.com/switchyard-dev/switchyard/testenv"
)

// signalLoop publishes signals for the case study's engines every 100 ms and
// a report from router B-1 every 200 ms; failing names the engines whose
// requests all fail in the reports.
type signalLoop struct {
	failing atomic.Value // string: engine name or ""
	seq     uint64
}

func (l *signalLoop) run(ctx context.Context, t *testing.T, env *testenv.NATS) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	caps := map[string]float64{"engine-a": 100, "engine-b": 100, "engine-c": 80}
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		l.seq++
		now := time.Now().UnixMilli()
		for e, c := range caps {
			data, err := messages.Encode(&messages.EngineSignal{Model: model, Engine: e, Time: now, Seq: l.seq,
				TTFTMs: 300, TBTMs: 5, OutputTokens: 100, LoadRPS: c / 2, CapacityRPS: c, Replicas: 1, Health: 1})
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := env.JS.Publish(ctx, "sy.signal."+model+"."+e, data); err != nil && ctx.Err() == nil {
				t.Error(err)
			}
		}
		if i%2 == 1 {
			eo := map[string]messages.EngineOutcome{}
			bad, _ := l.failing.Load().(string)
			for e := range caps {
				if e == bad {
					eo[e] = messages.EngineOutcome{Sent: 20, Errors: map[string]int64{"5xx": 20}}
				} else {
					eo[e] = messages.EngineOutcome{Sent: 20, Succeeded: 20, TTFTMs: 320, LatencyMs: 820}
				}
			}
			l.publishReport(ctx, t, env, eo)
		}
	}
}

func (l *signalLoop) publishReport(ctx context.Context, t *testing.T, env *testenv.NATS, eo map[string]messages.EngineOutcome) {
	data, err := messages.Encode(&messages.RouterReport{Model: model, Cluster: "B", Router: "B-1", Time: time.Now().UnixMilli(),
		Seq: l.seq, IntervalS: 0.2, Requests: 24, Engines: eo})
	if err != nil {
		t.Error(err)
		return
	}
	if _, err := env.JS.Publish(ctx, "sy.report."+model+".B.B-1", data); err != nil && ctx.Err() == nil {
		t.Error(err)
	}
}

// TestPenaltyAndOperator runs the aggregator and the optimizer: an engine
// whose reports show every request failing gets weight 0 within 2 s of the
// first such report, its penalty is published, and an operator's drain and
// restore take an engine out and bring it back.
func TestPenaltyAndOperator(t *testing.T) {
	env := testenv.StartNATS(t)
	agg, err := aggregator.New(aggregator.Options{Conn: env.Dial(t, "aggregator"), Logger: zerolog.Nop(), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Add(2)
	go func() { defer wg.Done(); _ = agg.Run(ctx) }()
	loop := &signalLoop{}
	loop.failing.Store("")
	go func() { defer wg.Done(); loop.run(ctx, t, env) }()
	dem := kv(t, env.JS, env.Names.DemandBucket)
	putDemand(t, dem, "A", 90)
	putDemand(t, dem, "C", 40)
	rec := record(t, env)
	start(t, env, optimizersvc.Options{Instance: "opt-1", Clusters: []string{"A", "B", "C"}, PreferConfiguredNetwork: true,
		Registerer: prometheus.NewRegistry()})

	weight := func(cluster, engine string) float64 {
		u, ok := rec.latest(model + "." + cluster)
		if !ok {
			return -1
		}
		return u.snap.Weights[engine]
	}
	testenv.WaitFor(t, 10*time.Second, "engine-b serving cluster B", func() bool { return weight("B", "engine-b") > 0.3 })

	// Onset: every request to engine-b fails from now on.
	onset := time.Now()
	loop.failing.Store("engine-b")
	testenv.WaitFor(t, 5*time.Second, "engine-b's weight about zero", func() bool {
		u, ok := rec.latest(model + ".B")
		return ok && u.at.After(onset) && u.snap.Weights["engine-b"] < 0.01
	})
	u, _ := rec.latest(model + ".B")
	took := u.at.Sub(onset)
	t.Logf("engine-b's weight fell to %.4f %s after the onset (reports every 200 ms)", u.snap.Weights["engine-b"], took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("weight fell %s after the onset, want < 2s", took)
	}
	eng := kv(t, env.JS, env.Names.EnginesBucket)
	testenv.WaitFor(t, 3*time.Second, "penalty record published", func() bool {
		e, err := eng.Get(context.Background(), "penalty."+model+".engine-b")
		if err != nil {
			return false
		}
		var p messages.Penalty
		if err := messages.DecodeInto(e.Value(), &p); err != nil {
			t.Fatal(err)
		}
		return p.Phase == messages.PhasePenalised && p.Multiplier == 0 && p.Strikes == 1 && p.Reason != ""
	})

	// The engine behaves again: after its 5 s penalty its weight comes back.
	loop.failing.Store("")
	testenv.WaitFor(t, 10*time.Second, "engine-b back in slow start", func() bool { return weight("B", "engine-b") > 0.05 })

	// An operator drains engine-c: weight 0 everywhere; restore brings it back.
	// Taken before the write: a fast optimizer may answer it before the
	// next statement runs.
	drained := time.Now()
	put(t, eng, "operator.engine-c", &messages.Operator{Engine: "engine-c", Action: messages.ActionDrain, Reason: "test", Time: time.Now().UnixMilli()})
	testenv.WaitFor(t, 10*time.Second, "engine-c drained", func() bool {
		u, ok := rec.latest(model + ".C")
		return ok && u.at.After(drained) && weight("C", "engine-c") == 0 && weight("B", "engine-c") == 0 && weight("A", "engine-c") == 0
	})
	if err := eng.Delete(context.Background(), "operator.engine-c"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "engine-c restored", func() bool { return weight("C", "engine-c") > 0.5 })
	rec.checkRising(t)
}
