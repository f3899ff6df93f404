package stack_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/services/loadgen"
	"github.com/switchyard-dev/switchyard/stack"
	"github.com/switchyard-dev/switchyard/workload"
)

// restartFile is the case study's shape (cluster B's demand above engine
// B's capacity, its overflow planned to engine C) at a quarter of its
// capacities with the reliability scenarios' short requests, and demand at
// about 70% of the fleet, so that two shared cores run it without
// shedding for want of CPU. engineB names cluster B's engine.
func restartFile(engineB string) *stack.File {
	return relFile(
		[]stack.Cluster{{Name: "A", Region: "r1", DemandRPS: 15}, {Name: "B", Region: "r2", DemandRPS: 30}, {Name: "C", Region: "r3", DemandRPS: 6}},
		[]stack.Engine{{Name: "engine-a", Region: "r1", CapacityRPS: 25}, {Name: engineB, Region: "r2", CapacityRPS: 25},
			{Name: "engine-c", Region: "r3", CapacityRPS: 20}})
}

// restartUp starts the stack as `switchyard up` does (its signal interval,
// emulated network, default aggregator and optimizer options) on dataDir.
func restartUp(t *testing.T, ctx context.Context, f *stack.File, dataDir string) *stack.Stack {
	t.Helper()
	s, err := stack.Start(ctx, stack.Options{File: f, DataDir: dataDir, NATSPort: -1, RouterAddr: "127.0.0.1:0",
		SignalInterval: 200 * time.Millisecond, EmulateNetwork: true, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// restartLoad sends every cluster's demand through its router for d, as
// `up --load` sends one round (Poisson arrivals, half of them streaming, 200
// sessions), and returns each cluster's summary.
func restartLoad(ctx context.Context, s *stack.Stack, d time.Duration, seed uint64) map[string]*loadgen.Summary {
	f := s.File()
	out := map[string]*loadgen.Summary{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, r := range s.Routers() {
		c := f.Clusters[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := workload.Poisson(workload.PoissonOptions{Rate: c.DemandRPS, Duration: d, PromptTokens: f.Sim.PromptTokens,
				OutputTokens: f.Sim.OutputTokens, Sessions: 200, Seed: seed*1000 + uint64(i)})
			sum, err := loadgen.Run(ctx, loadgen.Options{URL: "http://" + r.Addr(), Model: f.Model, Requests: reqs,
				StreamFraction: 0.5, Seed: seed})
			if err != nil {
				sum = &loadgen.Summary{Errors: len(reqs), ErrorSamples: []string{err.Error()}}
			}
			mu.Lock()
			out[c.Name] = sum
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// restartTotals adds up the clusters' summaries and formats them.
func restartTotals(sums map[string]*loadgen.Summary) (sent, ok, errs, shed int, line string) {
	names := make([]string, 0, len(sums))
	for c := range sums {
		names = append(names, c)
	}
	sort.Strings(names)
	var b strings.Builder
	var samples []string
	for _, c := range names {
		s := sums[c]
		sent, ok, errs, shed = sent+s.Sent, ok+s.OK, errs+s.Errors, shed+s.Shed
		fmt.Fprintf(&b, "%s %d ok %d err %d shed; ", c, s.OK, s.Errors, s.Shed)
		samples = append(samples, s.ErrorSamples...)
	}
	if len(samples) > 0 {
		fmt.Fprintf(&b, "errors: %q", samples)
	}
	return sent, ok, errs, shed, strings.TrimSpace(b.String())
}

// restartPenalties lists the engines with a penalty record in sy_engines.
func restartPenalties(t *testing.T, ctx context.Context, s *stack.Stack) []string {
	t.Helper()
	var out []string
	for _, e := range s.Engines() {
		if p, err := relPenalty(ctx, s, e.Name()); err == nil && p != nil {
			out = append(out, fmt.Sprintf("%s (%s, strikes %d)", e.Name(), p.Reason, p.Strikes))
		}
	}
	return out
}

// TestReliabilityRestart: `up --load` restarted on its own data dir has no
// errors and no shedding in its first 10 s, the same figures as a fresh
// start, measured in one run. The fresh start's load begins, as `up --load`
// does, once every router holds a snapshot; the restart's from the moment
// the stack is up — its routers find the snapshots the first run stored,
// which name the engines by addresses that changed. Then the stack restarts
// once more, after a pause past the aggregator's down bound, with a
// different stack file on the same data dir: cluster B's engine renamed, so
// that the stored snapshots and engine states name an engine that is gone.
// That start has no errors either, and no engine of any run is penalised.
func TestReliabilityRestart(t *testing.T) {
	relSkipUnderRace(t)
	relProcs(t)
	const scenario = "restart on the data dir"
	const window = 10 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()

	// Fresh start.
	s := restartUp(t, ctx, restartFile("engine-b"), dir)
	waitSnapshots(t, s, relModel)
	fresh := restartLoad(ctx, s, window, 1)
	freshPen := restartPenalties(t, ctx, s)
	s.Close()
	fSent, fOK, fErr, fShed, fLine := restartTotals(fresh)
	t.Logf("fresh start, first %v: %d sent, %d ok, %d errors, %d shed (%s); penalised %v", window, fSent, fOK, fErr, fShed, fLine, freshPen)

	// Restart at once: the stored snapshots are fresh and name every engine.
	s = restartUp(t, ctx, restartFile("engine-b"), dir)
	again := restartLoad(ctx, s, window, 2)
	againPen := restartPenalties(t, ctx, s)
	var gens []string
	for _, r := range s.Routers() {
		snap, _ := r.Store().Snapshot(relModel)
		gens = append(gens, fmt.Sprintf("%s g%d", r.Name(), snap.Generation))
	}
	s.Close()
	rSent, rOK, rErr, rShed, rLine := restartTotals(again)
	t.Logf("restart, first %v: %d sent, %d ok, %d errors, %d shed (%s); penalised %v; snapshots at the end %v",
		window, rSent, rOK, rErr, rShed, rLine, againPen, gens)

	// Restart after a pause past the aggregator's default down bound (6 s),
	// with engine-b gone and engine-b2 in its place.
	time.Sleep(7 * time.Second)
	s = restartUp(t, ctx, restartFile("engine-b2"), dir)
	changed := restartLoad(ctx, s, window, 3)
	changedPen := restartPenalties(t, ctx, s)
	served := map[string]int{}
	for _, sum := range changed {
		for e, n := range sum.EngineCount {
			served[e] += n
		}
	}
	s.Close()
	cSent, cOK, cErr, cShed, cLine := restartTotals(changed)
	t.Logf("restart with engine-b replaced by engine-b2, first %v: %d sent, %d ok, %d errors, %d shed (%s); served per engine %v; penalised %v",
		window, cSent, cOK, cErr, cShed, cLine, served, changedPen)

	relFigure(t, scenario, "restart: no errors, no shed in the first 10 s", fmt.Sprintf("%d errors, %d shed of %d (fresh start: %d errors, %d shed of %d)",
		rErr, rShed, rSent, fErr, fShed, fSent), rSent > 300 && rErr == 0 && rShed == 0)
	relFigure(t, scenario, "restart: the fresh start's figures", fmt.Sprintf("%d ok of %d against %d of %d", rOK, rSent, fOK, fSent),
		rErr <= fErr && rShed <= fShed)
	relFigure(t, scenario, "restart with an engine gone: no errors in the first 10 s", fmt.Sprintf("%d errors, %d shed of %d; engine-b served %d",
		cErr, cShed, cSent, served["engine-b"]), cSent > 300 && cErr == 0 && served["engine-b"] == 0)
	relFigure(t, scenario, "no engine penalised", fmt.Sprintf("fresh %v, restart %v, changed stack %v", freshPen, againPen, changedPen),
		len(freshPen)+len(againPen)+len(changedPen) == 0)
}
