package loadgen_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/switchyard-dev/switchyard/services/enginesim"
	"github.com/switchyard-dev/switchyard/services/loadgen"
	"github.com/switchyard-dev/switchyard/workload"
)

// TestRunAgainstEngine sends a short Poisson workload to a simulated engine
// over real HTTP and checks the summary adds up.
func TestRunAgainstEngine(t *testing.T) {
	eng, err := enginesim.New(enginesim.Options{Name: "e1", Model: "llama", OutputTokens: 8, BaseTBTMs: 2, MaxBatch: 64, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	reqs := workload.Poisson(workload.PoissonOptions{Rate: 100, Duration: 2 * time.Second, PromptTokens: 300, OutputTokens: 8, Sessions: 20, Seed: 7})
	var progress bytes.Buffer
	s, err := loadgen.Run(context.Background(), loadgen.Options{URL: eng.URL(), Model: "llama", Requests: reqs, StreamFraction: 0.5, Seed: 1, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	if s.Sent != len(reqs) || s.OK != s.Sent || s.Errors != 0 {
		var out bytes.Buffer
		loadgen.WriteSummary(&out, s)
		t.Fatalf("sent %d of %d, ok %d:\n%s", s.Sent, len(reqs), s.OK, out.String())
	}
	if s.EngineShare["e1"] != 1 {
		t.Fatalf("engine share %v, want all on e1", s.EngineShare)
	}
	if s.TTFTP50 <= 0 || s.TTFTP50 > s.E2EP50 || s.E2EP99 < s.E2EP50 {
		t.Fatalf("percentiles: ttft p50 %s, e2e p50 %s p99 %s", s.TTFTP50, s.E2EP50, s.E2EP99)
	}
	if !strings.Contains(progress.String(), "sent") {
		t.Fatalf("no progress line: %q", progress.String())
	}
}

func TestRunRejectsBadOptions(t *testing.T) {
	for _, o := range []loadgen.Options{{Model: "m"}, {URL: "http://127.0.0.1:1"}, {URL: "http://127.0.0.1:1", Model: "m", StreamFraction: 2}} {
		if _, err := loadgen.Run(context.Background(), o); err == nil {
			t.Errorf("options %+v accepted", o)
		}
	}
}

func TestErrorsAreCounted(t *testing.T) {
	reqs := workload.Poisson(workload.PoissonOptions{Rate: 50, Duration: 200 * time.Millisecond, PromptTokens: 10, OutputTokens: 1, Seed: 1})
	s, err := loadgen.Run(context.Background(), loadgen.Options{URL: "http://127.0.0.1:1", Model: "m", Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	if s.Errors != len(reqs) || len(s.ErrorSamples) == 0 {
		t.Fatalf("errors %d of %d, samples %v", s.Errors, len(reqs), s.ErrorSamples)
	}
}
