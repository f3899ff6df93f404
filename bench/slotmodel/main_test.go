package main

import (
	"math"
	"testing"

	"github.com/switchyard-dev/switchyard/batching"
	"github.com/switchyard-dev/switchyard/services/enginesim"
)

// TestCapacityMatchesEngineSim: the model's capacity is the engine
// simulator's for the same engine.
func TestCapacityMatchesEngineSim(t *testing.T) {
	for _, tc := range []struct {
		batch, out, prompt int
		tbt                float64
	}{{20, 16, 64, 60}, {32, 128, 256, 15}, {64, 16, 64, 100}} {
		p := Params{Batch: tc.batch, OutputTokens: tc.out, PromptTokens: tc.prompt, Cost: batching.Cost{PrefillMsPerToken: 0.02, TBTBaseMs: tc.tbt, TBTPerRequestMs: 0.2}}
		want := enginesim.Capacity(enginesim.Options{MaxBatch: tc.batch, OutputTokens: tc.out, PromptTokens: tc.prompt,
			PrefillMsPerToken: 0.02, BaseTBTMs: tc.tbt, TBTGrowthMs: 0.2, KVTokens: 1 << 30, TimeScale: 1})
		if got := p.Capacity(); math.Abs(got-want) > 1e-9*want {
			t.Errorf("%+v: capacity %.6f, enginesim %.6f", tc, got, want)
		}
	}
}

// TestRunServesWhatItAdmits: below capacity everything is served and the
// TTFT is about half a decode step; past it, with no queue allowed, the
// TTFT stays near the unloaded one and some capacity is lost, and with an
// unbounded allowance the engines serve their capacity while the TTFT
// grows.
func TestRunServesWhatItAdmits(t *testing.T) {
	p := Params{Engines: 4, Batch: 20, OutputTokens: 16, PromptTokens: 64, Cost: batching.Cost{PrefillMsPerToken: 0.02, TBTBaseMs: 60, TBTPerRequestMs: 0.2},
		Load: 0.25, Allowance: 1000, QueueCap: -1, Seconds: 300, Seed: 1}
	low := Run(p)
	if math.Abs(low.Served-0.25) > 0.02 || low.TTFTP50 < 20 || low.TTFTP50 > 50 {
		t.Fatalf("at 25%% load: %+v, want served ~0.25 and TTFT p50 ~ half a 60 ms step", low)
	}
	p.Load, p.Allowance = 1.5, 0
	none := Run(p)
	if none.Served < 0.85 || none.Served > 0.97 || none.TTFTP99 > 1.3*low.TTFTP99 {
		t.Fatalf("150%% load, no queue: %+v (unloaded p99 %.1f)", none, low.TTFTP99)
	}
	p.Allowance = 1000
	all := Run(p)
	if all.Served < 0.99 || all.TTFTP99 < 5*low.TTFTP99 {
		t.Fatalf("150%% load, unbounded queue: %+v, want capacity served and a long queue", all)
	}
	if again := Run(p); again.Served != all.Served || again.TTFTP50 != all.TTFTP50 || again.TTFTP99 != all.TTFTP99 {
		t.Fatalf("not deterministic: %+v then %+v", all, again)
	}
}

// TestCriticalNeverShed: critical requests are admitted past every limit
// (to the least occupied engine), so with them more is served than without
// at the same allowance, some of them go beyond the limits at 150% of
// capacity, and their TTFT p99 is reported; without them it is NaN.
func TestCriticalNeverShed(t *testing.T) {
	p := Params{Engines: 2, Batch: 64, OutputTokens: 16, PromptTokens: 64, Cost: batching.Cost{PrefillMsPerToken: 0.02, TBTBaseMs: 100, TBTPerRequestMs: 0.2},
		Load: 1.5, Allowance: 0, QueueCap: -1, Seconds: 120, Seed: 1}
	plain := Run(p)
	if !math.IsNaN(plain.CriticalP99) || plain.Forced != 0 {
		t.Fatalf("without critical requests: %+v", plain)
	}
	p.Critical = 0.2
	crit := Run(p)
	if crit.Forced <= 0 || crit.Forced >= 1 || math.IsNaN(crit.CriticalP99) || crit.CriticalP99 < crit.TTFTP50 {
		t.Fatalf("with 20%% critical requests: %+v", crit)
	}
	if crit.Served < plain.Served {
		t.Fatalf("critical requests admitted past the limits served less: %.3f < %.3f", crit.Served, plain.Served)
	}
}

// TestRouterPolicyCosts: shedding sheddable requests by key up front and
// reserving slots from them (the router's relaxed snapshot shed and
// SlotReserve) each serve less than the oracle without them at the same
// allowance.
func TestRouterPolicyCosts(t *testing.T) {
	p := Params{Engines: 2, Batch: 64, OutputTokens: 16, PromptTokens: 64, Cost: batching.Cost{PrefillMsPerToken: 0.02, TBTBaseMs: 100, TBTPerRequestMs: 0.2},
		Load: 1.5, Allowance: 2, QueueCap: -1, Seconds: 120, Seed: 1, Critical: 0.2, Sheddable: 0.4}
	free := Run(p)
	keyed := p
	keyed.KeyShed = 1.0 / 6
	reserved := p
	reserved.Reserve = 0.05
	for name, q := range map[string]Params{"key shed": keyed, "reserve": reserved} {
		if r := Run(q); r.Served >= free.Served {
			t.Errorf("%s: served %.3f, not less than %.3f without it", name, r.Served, free.Served)
		}
	}
}

// TestServedCountsEveryLength: a request is served when its last token
// comes, from a decode step or, for a one-token request, its prefill.
func TestServedCountsEveryLength(t *testing.T) {
	for _, out := range []int{1, 2, 16} {
		p := Params{Engines: 2, Batch: 8, OutputTokens: out, PromptTokens: 64, Cost: batching.Cost{PrefillMsPerToken: 0.02, TBTBaseMs: 20, TBTPerRequestMs: 0.2},
			Load: 0.5, Allowance: 1000, QueueCap: -1, Seconds: 60, Seed: 1}
		if r := Run(p); math.Abs(r.Served-0.5) > 0.03 {
			t.Errorf("%d-token requests at half of capacity: served %.3f of capacity, want 0.5", out, r.Served)
		}
	}
}
