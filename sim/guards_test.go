package sim

import "testing"

// TestSwitchyardRunsRouterGuards runs the switchyard policy through an
// engine failure and checks that the router's own guards did the routing:
// the failed engine's refusals ejected it at the routers that sent to it,
// refused requests were retried elsewhere rather than failed, and the
// routers' in-flight counts (live.Bound) track the simulator's own
// through every retry and failure.
func TestSwitchyardRunsRouterGuards(t *testing.T) {
	sc := mustParse(t, smallYAML)
	arrivals, err := sc.Arrivals(sc.Seed)
	if err != nil {
		t.Fatal(err)
	}
	f, err := compile(sc, arrivals[len(arrivals)-1].AtMs)
	if err != nil {
		t.Fatal(err)
	}
	for j := range f.engines {
		f.engines[j].capacity, f.engines[j].idleMs = 40, 500 // about what calibration measures for this type
	}
	pol := &switchyard{}
	r := newRun(f, arrivals, pol, sc.Seed)
	ejectedAt := map[int]bool{} // clusters whose router ejected a-1
	mismatch := 0
	r.onSignal = func(r *run) {
		for c := range pol.g.routers {
			g := &pol.g.routers[c]
			if g.bound == nil {
				continue
			}
			if i, ok := g.bound.Table().Index("a-1"); ok && g.bound.Live(i).Ejected() {
				ejectedAt[c] = true
			}
			if g.bound.TotalInFlight() != int64(r.totalIn[c]) {
				mismatch++
			}
		}
	}
	r.simulate(true)
	res := r.m.result(r, "switchyard")
	for _, tc := range []struct {
		what string
		ok   bool
	}{
		{"a router ejected the failed engine", len(ejectedAt) > 0},
		{"the routers' in-flight counts match the simulator's at every signal", mismatch == 0},
		{"refused requests were retried (under 1% failed)", res.FailedFraction < 0.01},
		{"requests were served", res.Requests > 0 && res.Goodput > 0.5},
	} {
		if !tc.ok {
			t.Errorf("%s: no (ejected at %v, %d mismatches, result %+v)", tc.what, ejectedAt, mismatch, res)
		}
	}
}
