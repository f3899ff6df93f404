package optimizersvc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/optimizersvc"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestPoisonAtStart starts the optimizer service, twice, on state buckets
// that already hold values which do not decode, are of the wrong kind or
// version, are stored under another key, or make its handler panic: each
// start skips and counts them and writes snapshots for the valid engines.
func TestPoisonAtStart(t *testing.T) {
	env := testenv.StartNATS(t)
	caseStudy(t, env)
	ctx := context.Background()
	eng := kv(t, env.JS, env.Names.EnginesBucket)
	dem := kv(t, env.JS, env.Names.DemandBucket)
	misfiled := &messages.EngineState{Model: model, Engine: "engine-c", Status: messages.StatusUp, Time: time.Now().UnixMilli(),
		CapacityRPS: 1000, Replicas: 1, Health: 1, Signals: 1}
	put(t, eng, model+".engine-z", misfiled) // engine-c's state under another engine's key
	put(t, eng, model+".boom", misfiled)     // the handler panics on this key
	wrongKind := &messages.DemandState{Model: model, Cluster: "A", Time: time.Now().UnixMilli(), Reports: 1}
	put(t, eng, model+".engine-y", wrongKind) // a demand state in the engines bucket
	put(t, dem, "rtt.A.boom", &messages.RTTState{Cluster: "A", Engine: "boom", Time: time.Now().UnixMilli(), Samples: 1})
	raw := map[string][]byte{
		model + ".poison":   []byte("\x83\xa1v\x01\xa1k\xacengine_state\xa2tx"), // truncated
		model + ".engine-v": []byte("\x82\xa1v\x09\xa1k\xacengine_state"),       // schema version 9
		model + ".engine-w": {0xc1},                                             // never valid msgpack
	}
	for key, v := range raw {
		if _, err := eng.Put(ctx, key, v); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := dem.Put(ctx, model+".D", []byte{0xc1}); err != nil {
		t.Fatal(err)
	}
	boom := func(_, key string, _ []byte) {
		if strings.Contains(key, "boom") {
			panic("handler bug on " + key)
		}
	}
	for run := range 2 { // a restart meets the same values
		reg := prometheus.NewRegistry()
		r := record(t, env)
		in := start(t, env, optimizersvc.Options{Instance: "opt-1", Registerer: reg, OnValue: boom})
		waitSnapshots(t, r, "A", "B", "C")
		bad := "switchyard_optimizer_bad_values_total"
		testenv.WaitFor(t, 5*time.Second, "every poison value counted", func() bool {
			return testenv.MetricSum(t, reg, bad, nil) == 8
		})
		for reason, want := range map[string]float64{"decode": 3, "version": 1, "kind": 1, "invalid": 1, "panic": 2} {
			if n := testenv.MetricSum(t, reg, bad, map[string]string{"reason": reason}); n != want {
				t.Errorf("run %d: %v values counted with reason %s, want %v", run, n, reason, want)
			}
		}
		if n := testenv.MetricSum(t, reg, "switchyard_optimizer_handler_panics_total", nil); n != 2 {
			t.Errorf("run %d: %v panics counted, want 2", run, n)
		}
		for _, c := range []string{"A", "B", "C"} {
			u, _ := r.latest(model + "." + c)
			for e := range u.snap.Weights {
				if e != "engine-a" && e != "engine-b" && e != "engine-c" {
					t.Errorf("run %d: snapshot %s names engine %q", run, c, e)
				}
			}
			if u.snap.Writer != "opt-1" {
				t.Errorf("run %d: snapshot %s written by %q", run, c, u.snap.Writer)
			}
		}
		// A restart finds the previous run's snapshots in the bucket before
		// it has solved: wait for its own solution.
		testenv.WaitFor(t, 10*time.Second, "a solution over the three valid engines", func() bool {
			sol := in.svc.LastSolution(model)
			return sol != nil && len(sol.Engines) == 3
		})
		in.stop(t)
	}
}
