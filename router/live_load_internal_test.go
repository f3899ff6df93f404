package router

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/live"
	"github.com/switchyard-dev/switchyard/router/selection"
)

func TestBatchSlots(t *testing.T) {
	cases := []struct {
		sig  messages.EngineSignal
		want float64
	}{
		{messages.EngineSignal{MaxRunning: 16, CapacityRPS: 10, BaseLatencyMs: 2000}, 16},
		{messages.EngineSignal{CapacityRPS: 10, BaseLatencyMs: 2000}, 20}, // Little's law
		{messages.EngineSignal{CapacityRPS: 1, BaseLatencyMs: 300}, 1},    // at least 1
		{messages.EngineSignal{CapacityRPS: 10}, 0},                       // unknown
		{messages.EngineSignal{}, 0},
	}
	for _, c := range cases {
		if got := live.BatchSlots(&c.sig); got != c.want {
			t.Errorf("BatchSlots(mrun %d, cap %v, base %v ms) = %v, want %v",
				c.sig.MaxRunning, c.sig.CapacityRPS, c.sig.BaseLatencyMs, got, c.want)
		}
	}
}

func TestBoundLoad(t *testing.T) {
	tbl := mustTable(t, []selection.Engine{{Name: "a", Weight: 0.5}, {Name: "b", Weight: 0.5}}, selection.TableOptions{})
	set := live.NewLiveSet(nil)
	b := set.Bind(tbl)
	a, _ := tbl.Index("a")
	bi, _ := tbl.Index("b")
	check := func(when string, want float64) {
		t.Helper()
		if got := b.Load(a); math.Abs(got-want) > 1e-12 && !(math.IsNaN(got) && math.IsNaN(want)) {
			t.Fatalf("%s: Load = %v, want %v", when, got, want)
		}
	}
	check("no signal", math.NaN())
	b.Acquire(a)
	check("no signal, one in flight", math.NaN())
	set.ObserveSignal(&messages.EngineSignal{Model: "m", Engine: "a", Queue: 3, Running: 5, CapacityRPS: 10})
	check("signal without a batch size", math.NaN())
	set.ObserveSignal(&messages.EngineSignal{Model: "m", Engine: "a", Queue: 3, Running: 5, MaxRunning: 16})
	check("signal of 8 outstanding in 16 slots", 0.5) // 7 of other routers and this router's one
	b.Acquire(a)
	b.Acquire(a)
	check("two sent since the signal", 10.0/16)
	b.Release(a)
	b.Release(a)
	check("this router's completions between signals are seen", 8.0/16)
	set.ObserveSignal(&messages.EngineSignal{Model: "m", Engine: "a", Running: 4, MaxRunning: 16})
	check("newer signal", 4.0/16) // 3 of other routers and this router's one
	b.Release(a)
	check("this router's last request done", 3.0/16)
	b.Acquire(a)
	b.Acquire(a)
	set.ObserveSignal(&messages.EngineSignal{Model: "m", Engine: "a", Running: 1, MaxRunning: 16})
	check("a signal that has not seen all of this router's requests yet", 2.0/16)
	// A table installed later binds the same engine state.
	tbl2 := mustTable(t, []selection.Engine{{Name: "b", Weight: 0.3}, {Name: "a", Weight: 0.7}}, selection.TableOptions{})
	a2, _ := tbl2.Index("a")
	if got := set.Bind(tbl2).Load(a2); got != 2.0/16 {
		t.Fatalf("Load through a new table's Bound = %v, want %v", got, 2.0/16)
	}
	if got := b.Load(bi); !math.IsNaN(got) {
		t.Fatalf("Load of an engine without signal = %v, want NaN", got)
	}
	// Unknown loads never win PickTwo's comparison: every key keeps Pick's
	// engine.
	for _, k := range keyHashes(200) {
		want, _ := tbl.Pick(k, b)
		if got, _ := tbl.PickTwo(k, b); got != want {
			t.Fatalf("PickTwo(%x) = %d with b's load unknown, want Pick's %d", k, got, want)
		}
	}
}

// TestLivePicksAllocFree checks that the live router's picks through a
// real Bound (PickTwo and PickRecent with Bound.Load) do not allocate.
func TestLivePicksAllocFree(t *testing.T) {
	tbl := mustTable(t, engineSet(randomWeights(rand.New(rand.NewPCG(3, 1)), 100, 0.95)), selection.TableOptions{})
	set := live.NewLiveSet(nil)
	for i := 0; i < tbl.Len(); i++ {
		set.ObserveSignal(&messages.EngineSignal{Engine: tbl.Engine(i).Name, Queue: i % 7, Running: i % 5, MaxRunning: 8})
	}
	b := set.Bind(tbl)
	rk := mustRecent(t, 1<<10)
	keys := keyHashes(4096)
	var n int
	for name, pick := range map[string]func(uint64) (int, bool){
		"PickTwo":    func(k uint64) (int, bool) { return tbl.PickTwo(k, b) },
		"PickRecent": func(k uint64) (int, bool) { return tbl.PickRecent(k, b, rk) },
	} {
		allocs := testing.AllocsPerRun(1000, func() {
			n++
			if _, ok := pick(keys[n&4095]); !ok {
				t.Fatalf("%s found no engine", name)
			}
		})
		if allocs != 0 {
			t.Fatalf("%s through a live.Bound allocates %.1f times per call", name, allocs)
		}
	}
}
