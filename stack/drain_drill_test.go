package stack_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/loadgen"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/testenv"
	"github.com/switchyard-dev/switchyard/workload"
)

// TestDrainDrillShedsNothingWhileCapacityIdles runs the README's drain
// drill on the case-study stack under its demand (A 90, B 120, C 40 req/s
// on engines of 100, 100 and 80): engine-c is drained, which leaves 200
// req/s of capacity for 250 of demand, so a fifth must be shed. Over the
// measured window, a cluster may shed only while every engine it can use
// (the case study's network reaches every engine from every cluster) runs
// at its planned utilisation: a cluster shedding more than 5% of its
// demand while an engine the snapshots plan capacity on runs more than 10
// points below its planned utilisation, with batch slots free and nothing
// queued, is capacity left idle. And the clusters shed in proportion to
// their demand, within 10 points of each other.
//
// Its figures are real-time ones: skipped under -race, like the
// reliability scenarios.
func TestDrainDrillShedsNothingWhileCapacityIdles(t *testing.T) {
	relSkipUnderRace(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := startCaseStudy(t, ctx)
	f := s.File()
	js, err := jetstream.New(s.Conn())
	if err != nil {
		t.Fatal(err)
	}
	names := streams.DefaultNames()
	engines, err := js.KeyValue(ctx, names.EnginesBucket)
	if err != nil {
		t.Fatal(err)
	}
	demand, err := js.KeyValue(ctx, names.DemandBucket)
	if err != nil {
		t.Fatal(err)
	}
	const warm, settle, window = 10 * time.Second, 15 * time.Second, 15 * time.Second
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i, r := range s.Routers() {
		c := f.Clusters[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := workload.Poisson(workload.PoissonOptions{Rate: c.DemandRPS, Duration: warm + settle + window + 5*time.Second,
				PromptTokens: f.Sim.PromptTokens, OutputTokens: f.Sim.OutputTokens, Sessions: 2000, Seed: uint64(i) + 7})
			_, _ = loadgen.Run(ctx, loadgen.Options{URL: "http://" + r.Addr(), Model: f.Model, Requests: reqs, StreamFraction: 0.3, Seed: 3})
		}()
	}
	time.Sleep(warm)
	key, err := streams.OperatorKey("engine-c")
	if err != nil {
		t.Fatal(err)
	}
	op, err := messages.Encode(&messages.Operator{Engine: "engine-c", Action: messages.ActionDrain, By: "drill", Time: time.Now().UnixMilli()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := engines.Put(ctx, key, op); err != nil {
		t.Fatal(err)
	}
	time.Sleep(settle)

	// Sums over the window, sampled every second: each cluster's demand and
	// shed (sy_demand, fast windows), each engine's load and effective
	// capacity (sy_engines) and planned utilisation (the snapshots').
	type acc struct{ a, b float64 }
	shed, load, planned, busy := map[string]*acc{}, map[string]*acc{}, map[string]*acc{}, map[string]*acc{}
	add := func(m map[string]*acc, k string, a, b float64) {
		if m[k] == nil {
			m[k] = &acc{}
		}
		m[k].a += a
		m[k].b += b
	}
	for end := time.Now().Add(window); time.Now().Before(end); time.Sleep(time.Second) {
		for _, c := range f.Clusters {
			var d messages.DemandState
			if readValue(ctx, demand, f.Model+"."+c.Name, &d) {
				add(shed, c.Name, d.ShedRPS.Fast, d.RPS.Fast)
			}
		}
		var util map[string]float64
		for _, snap := range snapshots(s, f.Model) {
			if snap.Utilisation != nil {
				util = snap.Utilisation
			}
		}
		for _, e := range f.Engines {
			var st messages.EngineState
			if readValue(ctx, engines, f.Model+"."+e.Name, &st) && util != nil {
				add(load, e.Name, st.LoadRPS.Fast, st.CapacityRPS*st.Health)
				add(planned, e.Name, util[e.Name], 1)
				add(busy, e.Name, st.Running.Fast, st.Queue.Fast)
			}
		}
	}
	maxBatch := map[string]int{}
	for _, e := range s.Engines() {
		maxBatch[e.Name()] = e.Options().MaxBatch
	}
	var report []string
	for _, e := range f.Engines {
		if l, p := load[e.Name], planned[e.Name]; l != nil && p != nil && l.b > 0 {
			report = append(report, fmt.Sprintf("%s at %.0f%% of capacity, planned %.0f%%, %.0f running and %.0f queued",
				e.Name, 100*l.a/l.b, 100*p.a/p.b, busy[e.Name].a/p.b, busy[e.Name].b/p.b))
		}
	}
	for _, c := range f.Clusters {
		if sh := shed[c.Name]; sh != nil && sh.b > 0 {
			report = append(report, fmt.Sprintf("cluster %s shed %.1f%%", c.Name, 100*sh.a/sh.b))
		}
	}
	for i, r := range s.Routers() {
		reg := r.Handler().Metrics()
		report = append(report, fmt.Sprintf("router %s shed %.0f by snapshot, %.0f by admission", f.Clusters[i].Name,
			testenv.MetricSum(t, reg, "switchyard_router_shed_total", map[string]string{"reason": "snapshot"}),
			testenv.MetricSum(t, reg, "switchyard_router_shed_total", map[string]string{"reason": "admission"})))
	}
	t.Logf("drain drill, %s after the drain: %s", settle+window, strings.Join(report, "; "))
	// Shed in proportion to demand (every cluster reaches every engine,
	// and all the demand is standard): the clusters' shed shares within 10
	// points of each other, not one region's traffic shed for the others.
	lo, hi := 1.0, 0.0
	for _, c := range f.Clusters {
		if sh := shed[c.Name]; sh != nil && sh.b > 0 {
			lo, hi = min(lo, sh.a/sh.b), max(hi, sh.a/sh.b)
		}
	}
	if hi > 0.05 && hi-lo > 0.1 {
		t.Errorf("clusters shed from %.1f%% to %.1f%% of their demand: want them within 10 points (in proportion to demand)", 100*lo, 100*hi)
	}
	for _, c := range f.Clusters {
		sh := shed[c.Name]
		if sh == nil || sh.b == 0 || sh.a/sh.b <= 0.05 {
			continue
		}
		for _, e := range f.Engines {
			l, p := load[e.Name], planned[e.Name]
			if l == nil || p == nil || l.b == 0 || p.a/p.b == 0 {
				continue // drained, or not planned: no capacity to use
			}
			// Idle capacity: below its planned utilisation with batch slots
			// free and nothing queued. An engine whose batch is full serves
			// all it can, whatever its nominal capacity says (a simulated
			// engine on a loaded machine is slower than its nominal speed).
			running, queued := busy[e.Name].a/p.b, busy[e.Name].b/p.b
			free := queued < 1 && running < 0.9*float64(maxBatch[e.Name])
			if u, pu := l.a/l.b, p.a/p.b; u < pu-0.1 && free {
				t.Errorf("cluster %s shed %.1f%% of its demand while %s, which it can use, ran at %.0f%% of its capacity, planned %.0f%%, with %.0f of %d batch slots running",
					c.Name, 100*sh.a/sh.b, e.Name, 100*u, 100*pu, running, maxBatch[e.Name])
			}
		}
	}
}

// readValue decodes the value of key in kv into m, and reports whether
// there was a valid one.
func readValue(ctx context.Context, kv jetstream.KeyValue, key string, m messages.Message) bool {
	e, err := kv.Get(ctx, key)
	if err != nil {
		return false
	}
	return messages.DecodeInto(e.Value(), m) == nil
}
