package stack_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/enginesim"
	"github.com/switchyard-dev/switchyard/services/loadgen"
	"github.com/switchyard-dev/switchyard/stack"
	"github.com/switchyard-dev/switchyard/testenv"
	"github.com/switchyard-dev/switchyard/workload"
)

// TestCaseStudyEndToEnd runs the whole case-study stack — embedded NATS,
// aggregator, optimizer service, one router per frontend cluster and three
// simulated engines — sends each cluster's demand through its router over real
// HTTP, and checks that each router spreads its requests over the engines as
// its installed snapshot says, within 5 percentage points.
func TestCaseStudyEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := startCaseStudy(t, ctx)
	f := s.File()

	streamedBeforeLast(t, ctx, "http://"+s.Routers()[0].Addr(), f.Model)
	disconnectCancelsEngine(t, ctx, "http://"+s.Routers()[1].Addr(), f.Model, s.Engines())

	// Each cluster's demand through its router: a warm-up so that demand and
	// weights settle, then the measured run.
	run := func(d time.Duration, seed uint64) []*loadgen.Summary {
		out := make([]*loadgen.Summary, len(s.Routers()))
		var wg sync.WaitGroup
		for i, r := range s.Routers() {
			c := f.Clusters[i]
			wg.Add(1)
			go func() {
				defer wg.Done()
				reqs := workload.Poisson(workload.PoissonOptions{Rate: c.DemandRPS, Duration: d, PromptTokens: 64, OutputTokens: 8, Sessions: 20000, Seed: seed + uint64(i)})
				sum, err := loadgen.Run(ctx, loadgen.Options{URL: "http://" + r.Addr(), Model: f.Model, Requests: reqs, StreamFraction: 0.3, Seed: seed})
				if err != nil {
					t.Error(err)
					return
				}
				out[i] = sum
			}()
		}
		wg.Wait()
		return out
	}
	run(4*time.Second, 100)
	// While the measured run goes, sample every router's installed weights:
	// the optimizer may refine them as traffic flows, so the shares are
	// compared with their time average.
	sampled := make([]map[string]float64, len(s.Routers()))
	for i := range sampled {
		sampled[i] = map[string]float64{}
	}
	samples := 0
	sctx, stopSampling := context.WithCancel(ctx)
	sampling := make(chan struct{})
	go func() {
		defer close(sampling)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
			for i, snap := range snapshots(s, f.Model) {
				for e, w := range snap.Weights {
					sampled[i][e] += w / (1 - snap.ShedFraction)
				}
			}
			samples++
		}
	}()
	before := snapshots(s, f.Model)
	// 20 s: ~2,400 of cluster B's requests, so that the binomial noise of
	// its smaller shares (sd ~0.9 points at 0.23) leaves room in the 5-point
	// bound for the planned-relative picks, which run cluster B's engine-c
	// share ~2-3 points under its weight (10 s: ~3.8 under -race).
	sums := run(20*time.Second, 200)
	stopSampling()
	<-sampling
	after := snapshots(s, f.Model)
	total := 0
	for i, sum := range sums {
		c := f.Clusters[i]
		total += sum.Sent
		// Every request is answered; a few may be shed while the optimizer's
		// first estimates settle, none may fail.
		if sum.Errors > 0 || sum.OK+sum.Shed != sum.Sent || float64(sum.Shed) > 0.01*float64(sum.Sent) {
			t.Fatalf("cluster %s: %d sent, %d ok, %d shed, %d errors (%v): want every request answered, at most 1%% shed", c.Name, sum.Sent, sum.OK, sum.Shed, sum.Errors, sum.ErrorSamples)
		}
		mean := map[string]float64{}
		for e, w := range sampled[i] {
			mean[e] = w / float64(samples)
		}
		if ok, why := sharesMatch(sum, mean); !ok {
			t.Errorf("cluster %s: shares %s do not match the installed weights (time average over generations %d→%d): %s",
				c.Name, fmtShares(sum.EngineShare), before[i].Generation, after[i].Generation, why)
		}
		t.Logf("cluster %s: %d requests, shares %s, mean installed weights %s (generation %d→%d)", c.Name, sum.Sent, fmtShares(sum.EngineShare), fmtShares(mean), before[i].Generation, after[i].Generation)
	}
	if total < 2000 {
		t.Fatalf("only %d requests measured, want at least 2000", total)
	}
	// The case study: B's overflow goes to engine-c, not to the nearly full engine-a.
	b := after[1].Weights
	if b["engine-c"] < 0.15 || b["engine-a"] > b["engine-c"] {
		t.Errorf("cluster B's weights %v: want its overflow (at least 20 of 120 req/s) on engine-c rather than engine-a", b)
	}
}

func snapshots(s *stack.Stack, model string) []messages.WeightSnapshot {
	out := make([]messages.WeightSnapshot, len(s.Routers()))
	for i, r := range s.Routers() {
		out[i], _ = r.Store().Snapshot(model)
	}
	return out
}

func sharesMatch(sum *loadgen.Summary, weights map[string]float64) (bool, string) {
	for _, e := range []string{"engine-a", "engine-b", "engine-c"} {
		if got, want := sum.EngineShare[e], weights[e]; math.Abs(got-want) > 0.05 {
			return false, fmt.Sprintf("%s got %.3f, weight %.3f", e, got, want)
		}
	}
	return true, ""
}

func fmtShares(m map[string]float64) string {
	var b strings.Builder
	for _, e := range []string{"engine-a", "engine-b", "engine-c"} {
		fmt.Fprintf(&b, "%s=%.3f ", e, m[e])
	}
	return strings.TrimSpace(b.String())
}

// streamedBeforeLast checks that a streamed response's first event reaches the
// client well before its last: the router relays, it does not buffer.
func streamedBeforeLast(t *testing.T, ctx context.Context, url, model string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":32,"messages":[{"role":"user","content":"tell me a story"}]}`, model)
	start := time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: status %d", resp.StatusCode)
	}
	var first, last time.Duration
	events := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if !bytes.HasPrefix(sc.Bytes(), []byte("data:")) {
			continue
		}
		if events == 0 {
			first = time.Since(start)
		}
		last = time.Since(start)
		events++
	}
	if events < 10 || first > last/3 {
		t.Fatalf("stream: %d events, first after %s, last after %s: want the first well before the last", events, first, last)
	}
	t.Logf("stream: %d events, first after %s, last after %s", events, first, last)
}

// disconnectCancelsEngine starts a long streamed request, reads its first
// event, hangs up, and checks that the engine stops working on it.
func disconnectCancelsEngine(t *testing.T, ctx context.Context, url, model string, engines []*enginesim.Engine) {
	t.Helper()
	rctx, hangUp := context.WithCancel(ctx)
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":3000,"messages":[{"role":"user","content":"a very long answer please"}]}`, model)
	req, _ := http.NewRequestWithContext(rctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	name := resp.Header.Get("x-switchyard-engine")
	var eng *enginesim.Engine
	for _, e := range engines {
		if e.Name() == name {
			eng = e
		}
	}
	if eng == nil {
		t.Fatalf("response names engine %q, not one of the stack's", name)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if eng.Stats().Running == 0 {
		t.Fatalf("%s is not running the request", name)
	}
	hangUp()
	resp.Body.Close()
	testenv.WaitFor(t, 3*time.Second, "the engine drops the request after the client hangs up", func() bool {
		return eng.Stats().Running == 0
	})
}

// startCaseStudy starts the built-in stack as `switchyard up` runs it, on a
// temporary data dir, a random NATS port and random router ports, closed
// with the test, and waits until every router holds a snapshot.
func startCaseStudy(t *testing.T, ctx context.Context) *stack.Stack {
	t.Helper()
	s, err := stack.Start(ctx, stack.Options{DataDir: t.TempDir(), NATSPort: -1, RouterAddr: "127.0.0.1:0", Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	waitSnapshots(t, s, s.File().Model)
	return s
}

// waitSnapshots waits until every router of s holds a snapshot of model.
func waitSnapshots(t *testing.T, s *stack.Stack, model string) {
	t.Helper()
	testenv.WaitFor(t, 15*time.Second, "every router holds a snapshot", func() bool {
		for _, r := range s.Routers() {
			if _, ok := r.Store().Snapshot(model); !ok {
				return false
			}
		}
		return true
	})
}

// waitWeighted waits until every router's snapshot of model gives each of
// engines a positive weight.
func waitWeighted(t *testing.T, s *stack.Stack, model string, engines ...string) {
	t.Helper()
	testenv.WaitFor(t, 15*time.Second, fmt.Sprintf("every router's snapshot weights %v", engines), func() bool {
		for _, r := range s.Routers() {
			snap, ok := r.Store().Snapshot(model)
			if !ok {
				return false
			}
			for _, e := range engines {
				if !(snap.Weights[e] > 0) {
					return false
				}
			}
		}
		return true
	})
}
