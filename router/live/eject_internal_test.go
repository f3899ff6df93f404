package live

import (
	"fmt"
	"testing"
	"time"
)

// TestEjectStateSingleProbe: after the backoff exactly one half-open probe
// goes through, and failed probes double the backoff up to its cap.
func TestEjectStateSingleProbe(t *testing.T) {
	var e ejectState
	o := EjectOptions{}.withDefaults()
	now := time.Unix(1000, 0)
	for i := 0; i < 3; i++ {
		e.report(false, false, now, o)
	}
	if ok, _ := e.claim(now); ok {
		t.Fatal("claim while ejected")
	}
	later := now.Add(o.Backoff)
	ok1, p1 := e.claim(later)
	ok2, _ := e.claim(later)
	if !ok1 || !p1 || ok2 {
		t.Fatalf("half-open claims: %v %v %v; want one probe", ok1, p1, ok2)
	}
	// Backoff doubles on failed probes up to the cap.
	var ds []time.Duration
	for i := 0; i < 7; i++ {
		at := later.Add(time.Duration(i) * time.Minute)
		_, _ = e.claim(at)
		_, d, _ := e.report(false, true, at, o)
		ds = append(ds, d)
	}
	want := []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second, 30 * time.Second}
	if fmt.Sprint(ds) != fmt.Sprint(want) {
		t.Fatalf("backoffs %v, want %v", ds, want)
	}
}
