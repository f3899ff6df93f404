package live

import (
	"math"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/guard"
	"github.com/switchyard-dev/switchyard/router/selection"
)

// TestBoundSlotTimes checks the weight-averaged slot time and step of a
// bound's engines, that engines without a signal saying them are left out
// unless they carry half the weight, and that an answer is reused for
// slotTimesEvery.
func TestBoundSlotTimes(t *testing.T) {
	now := time.Unix(1000, 0)
	set := NewLiveSet(func() time.Time { return now })
	table, err := selection.NewTable([]selection.Engine{{Name: "a", Weight: 0.5}, {Name: "b", Weight: 0.3}, {Name: "c", Weight: 0.2}, {Name: "d"}}, selection.TableOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b := set.Bind(table)
	if _, _, ok := b.SlotTimes(); ok {
		t.Fatal("slot times known before any signal")
	}
	// Only c has told (weight 0.2 of 1): not enough.
	set.ObserveSignal(&messages.EngineSignal{Model: "m", Engine: "c", MaxRunning: 10, CapacityRPS: 5, TBTMs: 40})
	now = now.Add(slotTimesEvery)
	if _, _, ok := b.SlotTimes(); ok {
		t.Fatal("slot times known from a fifth of the weight")
	}
	// a: 20 slots at 10 req/s = 2 s, 50 ms steps; b: MaxRunning unknown, so
	// capacity × idle latency = 4 slots at 8 req/s = 0.5 s, no step; d has
	// no weight and does not count.
	set.ObserveSignal(&messages.EngineSignal{Model: "m", Engine: "a", MaxRunning: 20, CapacityRPS: 10, TBTMs: 50})
	set.ObserveSignal(&messages.EngineSignal{Model: "m", Engine: "b", CapacityRPS: 8, BaseLatencyMs: 500})
	set.ObserveSignal(&messages.EngineSignal{Model: "m", Engine: "d", MaxRunning: 100, CapacityRPS: 1, TBTMs: 900})
	// Within slotTimesEvery of the last answer: reused.
	if _, _, ok := b.SlotTimes(); ok {
		t.Fatal("answer not reused within slotTimesEvery")
	}
	now = now.Add(slotTimesEvery)
	slot, step, ok := b.SlotTimes()
	wantSlot := (0.5*2 + 0.3*0.5 + 0.2*2) / 1.0
	wantStep := (0.5*0.05 + 0.2*0.04) / 0.7
	if !ok || math.Abs(slot-wantSlot) > 1e-9 || math.Abs(step-wantStep) > 1e-9 {
		t.Fatalf("SlotTimes = %v, %v, %v; want %v, %v, true", slot, step, ok, wantSlot, wantStep)
	}
}

// TestBoundOverflow checks where Overflow sends a request whose engine's
// batch is full: to the nearest spare engine with a free slot while its
// extra predicted latency is below the wait for a slot, and nowhere while
// the engine has a free slot, its load is unknown, or every cheaper spare
// is full or down.
func TestBoundOverflow(t *testing.T) {
	now := time.Unix(1000, 0)
	table, err := selection.NewTable([]selection.Engine{{Name: "a", Weight: 1}, {Name: "near"}, {Name: "far"}}, selection.TableOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// near costs 50 ms more than a, far 450 ms more.
	f := guard.FiguresOf(&messages.WeightSnapshot{Model: "m", Cluster: "c",
		Weights:   map[string]float64{"a": 1, "near": 0, "far": 0},
		LatencyMs: map[string]float64{"a": 1000, "near": 1050, "far": 1450}})
	for _, tc := range []struct {
		name         string
		a, near, far int // outstanding requests in each engine's signal (-1: no signal)
		downNear     bool
		figures      *guard.Figures
		want         string
	}{
		// 10 slots at 10 req/s: a slot frees every 100 ms at capacity.
		{name: "free slot stays", a: 9, figures: f, want: "a"},
		{name: "load unknown stays", a: -1, figures: f, want: "a"},
		{name: "full goes near (wait 100 ms, +50 ms)", a: 10, figures: f, want: "near"},
		{name: "near full, far costs more than the wait", a: 10, near: 10, figures: f, want: "a"},
		{name: "near full, queue of 4: far is worth it (wait 500 ms, +450 ms)", a: 14, near: 10, figures: f, want: "far"},
		{name: "near down, far costs more than the wait", a: 10, downNear: true, figures: f, want: "a"},
		{name: "no figures", a: 10, want: "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := NewLiveSet(func() time.Time { return now })
			b := set.Bind(table)
			for name, n := range map[string]int{"a": tc.a, "near": tc.near, "far": tc.far} {
				if n >= 0 {
					set.ObserveSignal(&messages.EngineSignal{Model: "m", Engine: name, Running: min(n, 10),
						Queue: max(0, n-10), MaxRunning: 10, CapacityRPS: 10})
				}
			}
			set.SetDown("near", tc.downNear)
			a, _ := table.Index("a")
			got, ok := b.Overflow(a, tc.figures)
			if name := table.Engine(got).Name; name != tc.want || ok != (tc.want != "a") {
				t.Fatalf("Overflow = %s, %v; want %s", name, ok, tc.want)
			}
		})
	}
}
