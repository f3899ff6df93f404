package router

import (
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/guard"
	"github.com/switchyard-dev/switchyard/router/live"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/selection"
)

// TestAdmissionWithoutHandler drives the admission control and the
// ejection of a live set with a virtual clock, as the simulator does: the
// snapshot's shed fraction sheds by key, the latency allotment bounds a
// burst, Done gives the room back, and consecutive failures eject an
// engine until its backoff has passed on that clock.
func TestAdmissionWithoutHandler(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	set := live.NewLiveSet(clock)
	b := set.Bind(mustTable(t, []selection.Engine{{Name: "a", Weight: 1}}, selection.TableOptions{}))
	for _, tc := range []struct {
		name  string
		f     *guard.Figures
		n     int // requests admitted before the one decided
		key   uint64
		want  guard.ShedReason
		wantU float64
	}{
		{"no snapshot", nil, 0, 1, "", 0},
		{"headroom", &guard.Figures{DemandRPS: 10, Utilisation: 0.5, Latency: time.Second}, 100, 1, "", 0.5},
		{"shed all", &guard.Figures{ShedFraction: 1, DemandRPS: 10, Latency: time.Second}, 0, 1, guard.ShedSnapshot, 0},
		// Near the limit: m = 10 req/s × 1 s, allotment max(8, 1.5·10 + 4·√10) ≈ 27.6.
		{"burst over the allotment", &guard.Figures{DemandRPS: 10, Utilisation: 0.95, Latency: time.Second}, 30, 1, guard.ShedAdmission, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := live.NewAdmission(live.ProtectionOptions{})
			for range tc.n {
				if _, r, _ := a.Admit(now, nil, b, nil, 7, protocol.KeyNone, protocol.PriorityStandard); r != "" {
					t.Fatalf("setup request shed: %s", r)
				}
			}
			u, r, detail := a.Admit(now, tc.f, b, nil, tc.key, protocol.KeyNone, protocol.PriorityStandard)
			if r != tc.want || (r == "" && u < tc.wantU) {
				t.Fatalf("Admit = %v, %q (%s); want reason %q, utilisation at least %v", u, r, detail, tc.want, tc.wantU)
			}
			if r == guard.ShedAdmission {
				for range tc.n {
					a.Done()
				}
				if _, r, detail := a.Admit(now, tc.f, b, nil, tc.key, protocol.KeyNone, protocol.PriorityStandard); r != "" {
					t.Fatalf("shed after every request was done: %q (%s)", r, detail)
				}
			}
		})
	}
	el := b.Live(0)
	for k := range live.DefaultEjectAfter {
		if ch, _, _ := el.Report(control.Result5xx, false, now, live.EjectOptions{}); (ch == live.EjectStart) != (k == live.DefaultEjectAfter-1) {
			t.Fatalf("after %d failures the ejection change is %v", k+1, ch)
		}
	}
	if !b.Down(0) {
		t.Fatal("an ejected engine is not skipped")
	}
	now = now.Add(live.DefaultEjectBackoff)
	ok, probe := el.Claim(now)
	if !ok || !probe || !b.Down(0) {
		t.Fatalf("after the backoff: Claim = %v, %v, skipped %v; want the probe, others skipped", ok, probe, b.Down(0))
	}
	if ch, _, _ := el.Report(control.ResultOK, probe, now, live.EjectOptions{}); ch != live.EjectRestored || b.Down(0) {
		t.Fatal("a successful probe did not restore the engine")
	}
}

// TestPickFallback: with the weighted engine skipped, a request goes to a
// spare engine of weight zero that is not skipped; with none, to an
// ejected engine rather than nowhere; an engine marked down never.
func TestPickFallback(t *testing.T) {
	now := time.Unix(1000, 0)
	set := live.NewLiveSet(func() time.Time { return now })
	b := set.Bind(mustTable(t, []selection.Engine{{Name: "a", Weight: 1}, {Name: "b"}}, selection.TableOptions{}))
	ia, _ := b.Table().Index("a")
	ib, okb := b.Table().Index("b")
	if !okb {
		t.Fatal("the engine of weight zero is not in the table")
	}
	for range live.DefaultEjectAfter {
		b.Live(ia).Report(control.ResultConnect, false, now, live.EjectOptions{})
	}
	for _, tc := range []struct {
		name         string
		downB        bool
		want         int
		wantFallback bool
		wantOK       bool
	}{
		{"spare engine", false, ib, false, true},
		{"ejected engine rather than none", true, ia, true, true},
	} {
		set.SetDown("b", tc.downB)
		idx, fallback, ok := b.PickFallback(42, []string{"b"})
		if ok != tc.wantOK || (ok && (idx != tc.want || fallback != tc.wantFallback)) {
			t.Errorf("%s: PickFallback = %d, %v, %v; want %d, %v, %v", tc.name, idx, fallback, ok, tc.want, tc.wantFallback, tc.wantOK)
		}
	}
	set.SetDown("a", true)
	if idx, _, ok := b.PickFallback(42, []string{"b"}); ok {
		t.Errorf("picked %d with every engine down", idx)
	}
}
