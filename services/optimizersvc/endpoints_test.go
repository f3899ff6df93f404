package optimizersvc_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-dev/switchyard/auth/endpoints"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/optimizersvc"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestEndpointPolicy: an engine whose state goes on advertising an address
// the endpoint policy refuses is left out of the plan (and counted); once
// its state advertises its own address again, it is planned.
func TestEndpointPolicy(t *testing.T) {
	env := testenv.StartNATS(t)
	eng := kv(t, env.JS, env.Names.EnginesBucket)
	at := func(engine, url string) {
		t.Helper()
		st := &messages.EngineState{Model: model, Engine: engine, Status: messages.StatusUp, Time: time.Now().UnixMilli(),
			TTFTMs: messages.Window{Fast: 300, Slow: 300}, TBTMs: messages.Window{Fast: 5, Slow: 5},
			OutputTokens: messages.Window{Fast: 100, Slow: 100}, LoadRPS: messages.Window{Fast: 50, Slow: 50},
			CapacityRPS: 100, Replicas: 1, Health: 1, Signals: 1,
			Transports: []messages.Transport{{Kind: messages.TransportHTTP, Address: url}}}
		put(t, eng, model+"."+engine, st)
	}
	at("engine-a", "http://127.0.0.1:8001")
	at("engine-b", "http://203.0.113.9:8000") // an attacker's address
	putDemand(t, kv(t, env.JS, env.Names.DemandBucket), "A", 50)
	pol, err := endpoints.New(endpoints.File{Models: []endpoints.Rules{{Model: model, Engines: []endpoints.EngineRule{
		{Name: "engine-a", URLs: []string{"http://127.0.0.1:8001"}}, {Name: "engine-b", URLs: []string{"http://127.0.0.1:8002"}}}}}},
		endpoints.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	r := record(t, env)
	start(t, env, optimizersvc.Options{Instance: "opt-1", Clusters: []string{"A"}, Registerer: reg, Endpoints: pol})
	waitSnapshots(t, r, "A")
	// After the grace period (a few signal intervals) engine-b is left out.
	testenv.WaitFor(t, 10*time.Second, "engine-b left out of the plan", func() bool {
		u, _ := r.latest(model + ".A")
		return u.snap.Weights["engine-b"] == 0 && u.snap.Weights["engine-a"] > 0
	})
	if n := testenv.MetricSum(t, reg, "switchyard_optimizer_engines_refused", nil); n != 1 {
		t.Errorf("engines refused: %v, want 1", n)
	}
	at("engine-b", "http://127.0.0.1:8002/")
	testenv.WaitFor(t, 5*time.Second, "engine-b planned at its own address", func() bool {
		u, _ := r.latest(model + ".A")
		return u.snap.Weights["engine-b"] > 0
	})
	testenv.WaitFor(t, 5*time.Second, "no engine refused", func() bool {
		return testenv.MetricSum(t, reg, "switchyard_optimizer_engines_refused", nil) == 0
	})
}
