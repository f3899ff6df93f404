package enginestate

import (
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
)

func TestOf(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	ms := now.UnixMilli()
	state := func(mod func(*messages.EngineState)) *messages.EngineState {
		st := &messages.EngineState{Model: "llama", Engine: "engine-b", Status: messages.StatusUp, Signals: 10,
			LastSignal: ms - 100, Health: 1, CapacityRPS: 100, LoadRPS: messages.Window{Fast: 80}, Running: messages.Window{Fast: 20}, InFlight: 20}
		if mod != nil {
			mod(st)
		}
		return st
	}
	errs := func(rate float64) func(*messages.EngineState) {
		return func(st *messages.EngineState) {
			st.Outcomes = &messages.EngineOutcomes{ErrorRate: messages.Window{Fast: rate, Slow: rate}}
		}
	}
	idle := func(st *messages.EngineState) {
		st.InFlight = 0 // the windows still smooth the last requests
	}
	drain := &messages.Operator{Engine: "engine-b", Action: messages.ActionDrain, By: "ops@host", Reason: "upgrade", Time: ms}
	pen := &messages.Penalty{Model: "llama", Engine: "engine-b", Phase: messages.PhasePenalised, Multiplier: 0.25,
		Reason: messages.ReasonErrorRate, Since: ms - 1000, Until: ms + 4000, RecoverUntil: ms + 14000, Strikes: 1}
	recovering := *pen
	recovering.Phase, recovering.Until = messages.PhaseRecovering, ms-5000 // halfway through a 10 s slow start
	recovering.RecoverUntil = ms + 5000
	expired := *pen
	expired.Until, expired.RecoverUntil = ms-20000, ms-10000

	cases := []struct {
		name   string
		in     Input
		want   State
		detail string  // a substring of the detail
		mult   float64 // the multiplier, when not 1
	}{
		{"no state", Input{}, Unknown, "no signal", 1},
		{"no signal yet", Input{State: state(func(st *messages.EngineState) { st.LastSignal = 0 })}, Unknown, "", 1},
		{"up", Input{State: state(nil)}, Up, "", 1},
		{"up with a few errors", Input{State: state(errs(0.04))}, Up, "", 1},
		{"degraded by errors", Input{State: state(errs(0.3))}, Degraded, "errors 30% of attempts", 1},
		{"degraded by timeouts", Input{State: state(func(st *messages.EngineState) {
			st.Outcomes = &messages.EngineOutcomes{TimeoutRate: messages.Window{Fast: 0.5}}
		})}, Degraded, "timeouts 50%", 1},
		{"degraded by health", Input{State: state(func(st *messages.EngineState) { st.Health = 0.7 })}, Degraded, "health 70%", 1},
		{"ejected: reports health 0", Input{State: state(func(st *messages.EngineState) { st.Health = 0; errs(1)(st) })}, Ejected, "errors 100%", 1},
		{"stale", Input{State: state(func(st *messages.EngineState) { st.Status = messages.StatusStale })}, Stale, "silent since", 1},
		{"down beats a drain", Input{State: state(func(st *messages.EngineState) { st.Status = messages.StatusDown }), Operator: drain}, Down, "silent", 1},
		{"draining", Input{State: state(nil), Operator: drain}, Draining, "operator drain by ops@host: upgrade; 20 requests in flight", 0},
		{"drained", Input{State: state(idle), Operator: drain}, Drained, "operator drain", 0},
		{"cordoned and empty", Input{State: state(idle), Operator: &messages.Operator{Engine: "engine-b", Action: messages.ActionCordon}}, Drained, "cordon", 0},
		{"a drain of another model", Input{State: state(nil), Operator: &messages.Operator{Engine: "engine-b", Model: "other", Action: messages.ActionDrain}}, Up, "", 1},
		{"penalised", Input{State: state(errs(0.5)), Penalty: pen}, Penalised, "×0.25 until", 0.25},
		{"slow start", Input{State: state(nil), Penalty: &recovering}, Penalised, "slow start ×0.62", 0.625},
		{"penalty over", Input{State: state(nil), Penalty: &expired}, Up, "", 1},
		{"operator health pin", Input{State: state(nil), Operator: &messages.Operator{Engine: "engine-b", Action: messages.ActionHealth, Health: 0.5}, Penalty: pen}, Penalised, "operator health ×0.50", 0.5},
		{"operator health 0", Input{State: state(nil), Operator: &messages.Operator{Engine: "engine-b", Action: messages.ActionHealth}}, Ejected, "operator health ×0.00", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.in.Now = now
			v := Of(c.in)
			if v.State != c.want || !strings.Contains(v.Detail, c.detail) {
				t.Errorf("Of = %s (%q), want %s (with %q)", v.State, v.Detail, c.want, c.detail)
			}
			if d := v.Multiplier - c.mult; d > 1e-9 || d < -1e-9 {
				t.Errorf("multiplier %v, want %v", v.Multiplier, c.mult)
			}
			if v.State != Up && v.State != Unknown && v.Detail == "" {
				t.Errorf("%s without a detail", v.State)
			}
		})
	}
}

// TestSilentButServedIsUnknown: an engine whose signals stopped (stale or
// down) while routers' requests to it succeed is unknown, not down; once
// routers' requests fail, or none is recent, it is down again.
func TestSilentButServedIsUnknown(t *testing.T) {
	now := time.Now()
	served := func(status string, lastSent time.Time, failed int) *messages.EngineState {
		return &messages.EngineState{Model: "m", Engine: "e", Status: status, LastSignal: now.Add(-10 * time.Second).UnixMilli(), Health: 1,
			Outcomes: &messages.EngineOutcomes{LastSent: lastSent.UnixMilli(), FailedIntervals: failed, TTFTMs: messages.Window{Fast: 40, Slow: 40}}}
	}
	for _, c := range []struct {
		name string
		st   *messages.EngineState
		want State
	}{
		{"down, served", served(messages.StatusDown, now.Add(-time.Second), 0), Unknown},
		{"stale, served", served(messages.StatusStale, now.Add(-time.Second), 0), Unknown},
		{"down, failing", served(messages.StatusDown, now.Add(-time.Second), 2), Down},
		{"down, no recent request", served(messages.StatusDown, now.Add(-time.Minute), 0), Down},
		{"up", served(messages.StatusUp, now.Add(-time.Second), 0), Up},
	} {
		if v := Of(Input{State: c.st, Now: now}); v.State != c.want {
			t.Errorf("%s: %s (%s), want %s", c.name, v.State, v.Detail, c.want)
		}
	}
}
