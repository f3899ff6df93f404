package sim

import (
	"testing"

	"github.com/switchyard-dev/switchyard/sim/scenario"
)

// prefixYAML is a small prefix workload: tenants whose system prompts lead
// every conversation, sent without session ids, on 6 engines whose caches
// hold a few tenants each.
const prefixYAML = `
name: prefix
duration_s: 60
warmup_s: 10
seed: 3
slo: {ttft_ms: 2000, tbt_ms: 80}
engine_types:
  - {name: t, max_batch: 32, prefill_ms_per_token: 0.01, tbt_base_ms: 12, tbt_per_request_ms: 0.1, tbt_per_ktoken_ms: 0.02, kv_blocks: 400}
engines:
  - {name: e, region: r1, type: t, count: 6}
clusters:
  - {name: x, region: r1, generator: {family: tenants, rate: 12, tenants: 30, think_s: 5}}
`

// TestPrefixBaselinesReuse checks that the peers' cache-aware routers,
// which know only what they routed, reuse the KV cache far more than
// random routing, and that the routers' indexes stay within their bounds.
func TestPrefixBaselinesReuse(t *testing.T) {
	sc := mustParse(t, prefixYAML)
	rep, err := Run(sc, Options{Policies: []string{"random", "sglang-cache-aware", "llmd-weighted"}, Parallel: 2, CalibrationRequests: 1000})
	if err != nil {
		t.Fatal(err)
	}
	base := rep.Policies["random"].KVHitRate
	for _, name := range []string{"sglang-cache-aware", "llmd-weighted"} {
		res := rep.Policies[name]
		if res.KVHitRate < base+0.1 || res.Goodput < 0.9 {
			t.Errorf("%s: KV hit %.1f%% (random %.1f%%), goodput %.1f%%: want at least 10 points more reuse and goodput ≥ 90%%",
				name, 100*res.KVHitRate, 100*base, 100*res.Goodput)
		}
	}
}

// TestRoutedIndexEvicts checks the approximate index's matching and its
// least-recently-used eviction.
func TestRoutedIndexEvicts(t *testing.T) {
	x := newRoutedIndex(2)
	old := &scenario.Arrival{Prompt: 1536, Blocks: []uint64{1, 2, 3}}
	fresh := &scenario.Arrival{Prompt: 1536, Blocks: []uint64{1, 4, 5}}
	x.insert(0, old)
	x.insert(0, fresh)
	x.insert(1, &scenario.Arrival{Prompt: 5000}) // no names: counts, never matches
	if m := x.match(0, []uint64{1, 2, 9}); m != 2 {
		t.Fatalf("match %d, want 2", m)
	}
	if m := x.match(1, old.Blocks); m != 0 || x.size(1) != 10 {
		t.Fatalf("anonymous prompt: match %d size %d, want 0 and 10", m, x.size(1))
	}
	x.evict(0, 3) // 2 and 3 are the oldest
	if x.size(0) != 3 || x.match(0, old.Blocks) != 1 || x.match(0, fresh.Blocks) != 3 {
		t.Fatalf("after eviction: size %d, old match %d, fresh match %d; want 3, 1, 3", x.size(0), x.match(0, old.Blocks), x.match(0, fresh.Blocks))
	}
	x.evict(1, 4)
	if x.size(1) != 4 {
		t.Fatalf("anonymous blocks after eviction %d, want 4", x.size(1))
	}
}

// TestBoundUnderPrefixReuse checks that on a prefix workload the lower
// bound is measured with a perfect cache — it is below the bound of the
// same arrivals without prefix information — and that no policy beats it
// by more than the calibration noise.
func TestBoundUnderPrefixReuse(t *testing.T) {
	sc := mustParse(t, prefixYAML)
	opts := Options{Policies: []string{"round-robin", "sglang-cache-aware", "llmd-weighted"}, Parallel: 2, CalibrationRequests: 1000}
	rep, err := Run(sc, opts)
	if err != nil {
		t.Fatal(err)
	}
	arr, err := sc.Arrivals(sc.Seed)
	if err != nil {
		t.Fatal(err)
	}
	for k := range arr {
		arr[k].Blocks, arr[k].Key = nil, 0
	}
	blind, err := RunArrivals(sc, arr, []string{"round-robin"}, sc.Seed, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !(rep.LowerBoundE2EMeanMs < blind.LowerBoundE2EMeanMs) {
		t.Fatalf("bound with prefixes %.0f ms, without %.0f ms: want the perfect cache to lower it", rep.LowerBoundE2EMeanMs, blind.LowerBoundE2EMeanMs)
	}
	for _, name := range rep.Order {
		if g := rep.Gap(name); g < -0.05 {
			t.Errorf("%s: %.1f%% below the lower bound", name, -100*g)
		}
	}
}
