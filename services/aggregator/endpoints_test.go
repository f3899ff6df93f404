package aggregator_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/auth/endpoints"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/aggregator"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestAggregatorEndpointPolicy: with an endpoint policy, a signal that
// advertises a URL the policy refuses (another address for a pinned
// engine, or any URL of a model without a rule) is not folded in:
// sy_engines never holds the refused URL, the engine keeps the endpoint it
// was allowed last, and the refusals are counted by reason.
func TestAggregatorEndpointPolicy(t *testing.T) {
	env := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const own, attacker = "http://127.0.0.1:18001", "http://10.66.6.6:8000"
	pol, err := endpoints.New(endpoints.File{Models: []endpoints.Rules{{Model: "llama",
		Engines: []endpoints.EngineRule{{Name: "engine-a", URLs: []string{own}}}}}}, endpoints.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	agg, err := aggregator.New(aggregator.Options{Conn: env.Dial(t, "aggregator"), WriteInterval: 20 * time.Millisecond,
		Endpoints: pol, Logger: zerolog.Nop(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := env.JS.KeyValue(ctx, env.Names.EnginesBucket)
	if err != nil {
		t.Fatal(err)
	}
	// Every value written under the engine's key, from the first on.
	w, err := kv.Watch(ctx, "llama.engine-a")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	var mu sync.Mutex
	var seen []string
	go func() {
		for e := range w.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var s messages.EngineState
			if err := messages.DecodeInto(e.Value(), &s); err != nil {
				t.Errorf("state does not decode: %v", err)
				continue
			}
			u, _ := endpoints.Of(s.Transports)
			mu.Lock()
			seen = append(seen, u)
			mu.Unlock()
		}
	}()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agg.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("aggregator: %v", err)
		}
	}()

	var seq uint64
	signal := func(model, engine, url string) {
		t.Helper()
		seq++
		data, err := messages.Encode(&messages.EngineSignal{Model: model, Engine: engine, Time: time.Now().UnixMilli(), Seq: seq,
			TTFTMs: 100, TBTMs: 20, CapacityRPS: 100, Replicas: 1, Health: 1,
			Transports: []messages.Transport{{Kind: messages.TransportHTTP, Address: url}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.JS.Publish(ctx, fmt.Sprintf("sy.signal.%s.%s", model, engine), data); err != nil {
			t.Fatal(err)
		}
	}
	signal("llama", "engine-a", own)
	testenv.WaitFor(t, 5*time.Second, "engine-a in sy_engines", func() bool {
		_, ok := engineState(t, kv, "llama.engine-a")
		return ok
	})
	for range 3 {
		signal("llama", "engine-a", attacker)
	}
	signal("mistral", "rogue", attacker)
	signal("llama", "engine-a", own)
	testenv.WaitFor(t, 5*time.Second, "3 refused URLs and 1 refused model counted, and engine-a's last allowed signal folded in", func() bool {
		s, ok := engineState(t, kv, "llama.engine-a")
		return ok && s.LastSeq == seq &&
			testenv.MetricSum(t, reg, "switchyard_aggregator_endpoints_refused_total", map[string]string{"reason": endpoints.ReasonURL}) == 3 &&
			testenv.MetricSum(t, reg, "switchyard_aggregator_endpoints_refused_total", map[string]string{"reason": endpoints.ReasonModel}) == 1
	})
	s, _ := engineState(t, kv, "llama.engine-a")
	if s.Signals != 2 {
		t.Errorf("engine-a's state folded in %d signals, want the 2 the policy allows", s.Signals)
	}
	if _, ok := engineState(t, kv, "mistral.rogue"); ok {
		t.Error("sy_engines holds the state of an engine whose model has no rule")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) == 0 {
		t.Fatal("the watch saw no write of engine-a's state")
	}
	for i, u := range seen {
		if u != own {
			t.Errorf("write %d of engine-a's state advertises %q, want only its own %q", i, u, own)
		}
	}
}
