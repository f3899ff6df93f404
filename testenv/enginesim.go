package testenv

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/services/enginesim"
)

// StartEngine starts a simulated engine with o (on a free 127.0.0.1 port
// unless o says otherwise) and closes it when the test ends.
func StartEngine(tb testing.TB, o enginesim.Options) *enginesim.Engine {
	tb.Helper()
	e, err := enginesim.New(o)
	if err != nil {
		tb.Fatalf("testenv: engine %s: %v", o.Name, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.Start(ctx); err != nil {
		tb.Fatalf("testenv: start engine %s: %v", o.Name, err)
	}
	tb.Cleanup(func() { _ = e.Close() })
	return e
}

// StartVLLMEngines starts n simulated engines in vLLM mode with no NATS of
// their own — vLLM's metrics names, its /health — each on a free 127.0.0.1
// port, as an operator's engines a stack reaches by URL. Each runs base
// (its model and step costs) named v1, v2, … with seeds 1, 2, …, and is
// closed when the test ends.
func StartVLLMEngines(tb testing.TB, n int, base enginesim.Options) []*enginesim.Engine {
	tb.Helper()
	var out []*enginesim.Engine
	for i := range n {
		o := base
		o.Name, o.Seed, o.MetricsFormat = fmt.Sprintf("v%d", i+1), uint64(i+1), enginesim.MetricsVLLM
		out = append(out, StartEngine(tb, o))
	}
	return out
}

// URLStackFile is a stack file of one cluster A (region r1, its router on
// a free 127.0.0.1 port) and the engines by URL, each serving model with
// vLLM's metrics, 8 running requests and 40 req/s of capacity.
func URLStackFile(model string, engines []*enginesim.Engine) string {
	var b strings.Builder
	fmt.Fprintf(&b, "model: %s\nclusters:\n  - {name: A, region: r1, router: \"127.0.0.1:0\"}\nengines:\n", model)
	for _, e := range engines {
		fmt.Fprintf(&b, "  - {name: %s, region: r1, url: %q, metrics: vllm, max_running: 8, capacity_rps: 40}\n", e.Name(), e.URL())
	}
	return b.String()
}
