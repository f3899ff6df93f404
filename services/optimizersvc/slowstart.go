package optimizersvc

import (
	"math"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/streams"
)

// AboutZeroShare is the share of an engine's reference capacity (the
// largest capacity_rps it has reported) below which its effective capacity
// counts as about zero: when it rises above again, the engine gets a slow
// start.
const AboutZeroShare = 0.05

// ramp is one engine's slow-start state: whether its effective capacity
// (before penalties) was about zero at the last round and, while it ramps
// back, since when.
type ramp struct {
	ref   float64   // largest capacity_rps reported, req/s
	low   bool      // effective capacity about zero at the last round
	start time.Time // start of the slow start in progress; zero when none
}

// multiplier returns the slow start's multiplier at now: a linear ramp from
// floor to 1 over d from r.start, 1 when no slow start is in progress.
func (r *ramp) multiplier(now time.Time, floor float64, d time.Duration) float64 {
	if r == nil || r.start.IsZero() || d <= 0 {
		return 1
	}
	el := now.Sub(r.start)
	if el >= d {
		return 1
	}
	return math.Min(1, floor+(1-floor)*math.Max(0, el.Seconds())/d.Seconds())
}

// slowStart folds an engine's effective capacity eff (req/s, before
// penalties and slow start; 0 when it is down or kept out) into its ramp
// and returns the slow-start multiplier of its health at now. A slow start
// begins when eff rises above AboutZeroShare of the engine's reference
// capacity after having been below it — whatever brought it to about zero:
// its own health signal, a stale or down status, an operator's drain,
// cordon or pinned health, or a capacity drop — and lasts
// PenaltyOptions.SlowStart, from PenaltyOptions.RecoveryFloor to 1. An
// engine first seen with capacity starts at once (a service that restarts
// does not throttle the fleet); penalties have their own slow start.
// Callers hold s.mu.
func (s *Service) slowStart(key string, st *messages.EngineState, eff float64, now time.Time) float64 {
	po := &s.opts.Penalties
	r := s.ramps[key]
	if r == nil {
		r = &ramp{}
		s.ramps[key] = r
	}
	r.ref = math.Max(r.ref, st.CapacityRPS)
	if !(eff > AboutZeroShare*r.ref) {
		if !r.start.IsZero() {
			s.endSlowStart(key, "effective capacity about zero again")
		}
		r.low = true
		return 1
	}
	if r.low {
		r.low = false
		if po.slowStart() > 0 {
			r.start = now
			model, engine, _ := streams.CutKey(key)
			s.log.Info().Str("model", model).Str("engine", engine).Float64("capacity_rps", eff).
				Float64("from_multiplier", po.RecoveryFloor).Dur("slow_start", po.slowStart()).
				Msg("engine capacity back from about zero; slow start")
		}
	}
	m := r.multiplier(now, po.RecoveryFloor, po.slowStart())
	if !r.start.IsZero() {
		model, engine, _ := streams.CutKey(key)
		if m >= 1 {
			s.endSlowStart(key, "done")
		} else {
			s.metrics.slowStart.WithLabelValues(model, engine).Set(m)
		}
	}
	return m
}

// endSlowStart ends the slow start of key, if any, and forgets the engine
// when its state is gone. Callers hold s.mu.
func (s *Service) endSlowStart(key, why string) {
	r := s.ramps[key]
	if r == nil {
		return
	}
	model, engine, _ := streams.CutKey(key)
	if !r.start.IsZero() {
		r.start = time.Time{}
		s.metrics.slowStart.DeleteLabelValues(model, engine)
		s.log.Info().Str("model", model).Str("engine", engine).Str("why", why).Msg("slow start over")
	}
	if _, ok := s.engines[key]; !ok {
		delete(s.ramps, key)
	}
}
