package live

import (
	"math"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
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
