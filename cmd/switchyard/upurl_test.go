package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/services/enginesim"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestUpEnginesByURL runs `switchyard up --stack FILE` on a stack file of
// engines by URL (two engine simulators in vLLM mode on free 127.0.0.1
// ports, with no NATS of their own): up prints them as served by the
// agent, runs no simulator, and the router it prints answers requests.
func TestUpEnginesByURL(t *testing.T) {
	engines := testenv.StartVLLMEngines(t, 2, enginesim.Options{Model: "llama", MaxBatch: 8, BaseTBTMs: 2, TBTGrowthMs: 0.1,
		PrefillMsPerToken: 0.01, OutputTokens: 4, PromptTokens: 16})
	file := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(file, []byte(testenv.URLStackFile("llama", engines)), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"up", "--stack", file, "--nats-port", fmt.Sprint(freePort(t)), "--data-dir", t.TempDir(),
			"--metrics-addr", "", "--signal-interval", "100ms", "--log-level", "warn"}, strings.NewReader(""), &stdout, &stderr)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("up did not stop within 15s of Ctrl-C")
		}
		if t.Failed() {
			t.Logf("up's stdout:\n%s\nup's stderr:\n%s", stdout.String(), stderr.String())
		}
	})
	routerRE := regexp.MustCompile(`router A\s+(http://127\.0\.0\.1:\d+)`)
	var router string
	testenv.WaitFor(t, 10*time.Second, "up prints its router", func() bool {
		if m := routerRE.FindStringSubmatch(stdout.String()); m != nil {
			router = m[1]
		}
		return router != ""
	})
	if out := stdout.String(); !strings.Contains(out, "signals from its vllm metrics by the agent") || strings.Contains(out, "req/s, NATS ") {
		t.Fatalf("up's engines: want both served by the agent and no simulator:\n%s", out)
	}
	testenv.WaitFor(t, 15*time.Second, "the router answers 200", func() bool { return testenv.ChatStatus(router, "llama") == 200 })
	for i := range 10 {
		if code := testenv.ChatStatus(router, "llama"); code != 200 {
			t.Fatalf("request %d through up's router: status %d", i, code)
		}
	}
}
