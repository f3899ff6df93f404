package router_test

import (
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/control"
)

// TestEjectionOnSimulatedClock runs the ejection rule as a simulator does,
// without HTTP, on its own clock: consecutive failures eject the engine,
// the half-open probe after the backoff goes through alone, its failure
// doubles the ejection and its success restores the engine; a client error
// is neutral.
func TestEjectionOnSimulatedClock(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	set := router.NewLiveSet(func() time.Time { return now })
	e := set.Engine("e1")
	var o router.EjectOptions // the defaults
	type step struct {
		advance time.Duration
		claim   bool // expected Claim ok
		probe   bool // expected Claim probe
		res     control.Result
		change  router.EjectChange
	}
	var steps []step
	for i := 1; i < router.DefaultEjectAfter; i++ {
		steps = append(steps, step{claim: true, res: control.Result5xx, change: router.EjectNone})
	}
	steps = append(steps,
		step{claim: true, res: control.ResultClient, change: router.EjectNone}, // neutral: no failure counted
		step{claim: true, res: control.Result5xx, change: router.EjectStart},
		step{advance: router.DefaultEjectBackoff / 2, claim: false},
		step{advance: router.DefaultEjectBackoff, claim: true, probe: true, res: control.Result5xx, change: router.EjectAgain},
		step{advance: router.DefaultEjectBackoff + time.Millisecond, claim: false}, // doubled
		step{advance: router.DefaultEjectBackoff, claim: true, probe: true, res: control.ResultOK, change: router.EjectRestored},
		step{claim: true, res: control.ResultOK, change: router.EjectNone},
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
		if got, want := e.Ejected(), s.change == router.EjectStart || s.change == router.EjectAgain; s.change != router.EjectNone && got != want {
			t.Fatalf("step %d: Ejected = %v, want %v", i, got, want)
		}
	}
}
