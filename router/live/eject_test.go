package live_test

import (
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/live"
)

// TestEjectionOnSimulatedClock runs the ejection rule as a simulator does,
// without HTTP, on its own clock: consecutive failures eject the engine,
// the half-open probe after the backoff goes through alone, its failure
// doubles the ejection and its success restores the engine; a client error
// is neutral.
func TestEjectionOnSimulatedClock(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	set := live.NewLiveSet(func() time.Time { return now })
	e := set.Engine("e1")
	var o live.EjectOptions // the defaults
	type step struct {
		advance time.Duration
		claim   bool // expected Claim ok
		probe   bool // expected Claim probe
		res     control.Result
		change  live.EjectChange
	}
	var steps []step
	for i := 1; i < live.DefaultEjectAfter; i++ {
		steps = append(steps, step{claim: true, res: control.Result5xx, change: live.EjectNone})
	}
	steps = append(steps,
		step{claim: true, res: control.ResultClient, change: live.EjectNone}, // neutral: no failure counted
		step{claim: true, res: control.Result5xx, change: live.EjectStart},
		step{advance: live.DefaultEjectBackoff / 2, claim: false},
		step{advance: live.DefaultEjectBackoff, claim: true, probe: true, res: control.Result5xx, change: live.EjectAgain},
		step{advance: live.DefaultEjectBackoff + time.Millisecond, claim: false}, // doubled
		step{advance: live.DefaultEjectBackoff, claim: true, probe: true, res: control.ResultOK, change: live.EjectRestored},
		step{claim: true, res: control.ResultOK, change: live.EjectNone},
	)
	for i, s := range steps {
		now = now.Add(s.advance)
		ok, probe := e.Claim(now)
		if ok != s.claim || probe != s.probe {
			t.Fatalf("step %d: Claim = %v, %v; want %v, %v", i, ok, probe, s.claim, s.probe)
		}
		if !ok {
			continue
		}
		if ch, _, _ := e.Report(s.res, probe, now, o); ch != s.change {
			t.Fatalf("step %d: Report(%v) = change %d, want %d", i, s.res, ch, s.change)
		}
		if got, want := e.Ejected(), s.change == live.EjectStart || s.change == live.EjectAgain; s.change != live.EjectNone && got != want {
			t.Fatalf("step %d: Ejected = %v, want %v", i, got, want)
		}
	}
}
