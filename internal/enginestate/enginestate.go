// Package enginestate computes the one state an operator is shown for an
// engine — on the dashboard, in `switchyard engine list`, on /api/state and
// in the dashboard's metrics — from what the control plane holds about it:
// the aggregator's engine state in sy_engines (liveness, reported health,
// the outcomes routers saw), the optimizer's penalty record and the
// operator's record. It is pure: no I/O, no clock of its own.
package enginestate

import (
	"fmt"
	"strings"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
)

// State is an engine's state as operators see it.
type State string

// The states, from the most to the least severe as Of decides them: the
// first that applies wins.
const (
	// Unknown: no engine state, or one that has folded no signal yet; or
	// an engine whose signals stopped while routers' requests to it still
	// succeed (messages.EngineState.ServedOnOutcomes: its agent died).
	Unknown State = "unknown"
	// Down: the engine has been silent for the aggregator's down-after.
	Down State = "down"
	// Stale: the engine has been silent for the aggregator's stale-after;
	// the optimizer plans with a fraction of its capacity.
	Stale State = "stale"
	// Drained: an operator drained or cordoned it and its newest signal
	// has no request queued or running.
	Drained State = "drained"
	// Draining: an operator drained or cordoned it and requests still run
	// or wait on it.
	Draining State = "draining"
	// Ejected: no traffic is planned for it although it signals — it
	// reports health 0, or a penalty or an operator's health pin is 0.
	Ejected State = "ejected"
	// Penalised: the optimizer's penalty (or the slow start after it)
	// scales its capacity down.
	Penalised State = "penalised"
	// Degraded: it serves, but fails or times out more than
	// DegradedErrorRate of its attempts, or its health is below 1.
	Degraded State = "degraded"
	// Up: none of the above.
	Up State = "up"
)

// All lists every state, most severe first.
var All = []State{Unknown, Down, Stale, Drained, Draining, Ejected, Penalised, Degraded, Up}

// DegradedErrorRate is the error (or timeout) rate of the fast window above
// which a serving engine is degraded: the optimizer's default floor for
// penalising an outlier (optimizersvc PenaltyOptions.ErrorRateFloor), so
// that an engine shows degraded at the rate that can cost it traffic.
const DegradedErrorRate = 0.05

// Input is what the control plane holds about one engine of one model.
// Only State is required for anything but Unknown; Penalty and Operator
// are nil when there is no record (an Operator for another model is
// ignored).
type Input struct {
	State    *messages.EngineState
	Penalty  *messages.Penalty
	Operator *messages.Operator
	// Now is the time the records are judged at (penalties end).
	Now time.Time
}

// Verdict is an engine's state with the figures behind it.
type Verdict struct {
	// State is the engine's state.
	State State `json:"state"`
	// Detail says why, with the figure, for people ("errors 100% of
	// attempts", "×0.25 until 12:00:03 (error_rate)"); empty for Up.
	Detail string `json:"detail,omitempty"`
	// ErrorRate and TimeoutRate are the fast windows of the routers'
	// outcomes, 0..1 (0 while no router reported the engine).
	ErrorRate   float64 `json:"error_rate"`
	TimeoutRate float64 `json:"timeout_rate"`
	// Multiplier is the capacity multiplier of the penalty or operator
	// health pin in force, 1 when none.
	Multiplier float64 `json:"multiplier"`
	// UntilMs is when the penalty (or its slow start) ends, Unix ms; 0
	// when none is in force.
	UntilMs int64 `json:"until_ms,omitempty"`
	// Reason is the penalty's reason or the operator's action and reason.
	Reason string `json:"reason,omitempty"`
}

// Of returns the engine's verdict.
func Of(in Input) Verdict {
	v := Verdict{State: Up, Multiplier: 1}
	st := in.State
	if st == nil || st.LastSignal == 0 {
		v.State, v.Detail = Unknown, "no signal folded in yet"
		return v
	}
	if o := st.Outcomes; o != nil {
		v.ErrorRate, v.TimeoutRate = o.ErrorRate.Fast, o.TimeoutRate.Fast
	}
	op := in.Operator
	if op != nil && op.Model != "" && op.Model != st.Model {
		op = nil
	}
	if st.ServedOnOutcomes(in.Now, messages.OutcomeEvidenceAge) {
		// Its signals stopped but routers' requests to it succeed: its
		// agent or publisher died, not the engine, which stays planned.
		v.State, v.Detail = Unknown, fmt.Sprintf("no signals since %s; routers' requests succeed (errors %.0f%%), served on their outcomes",
			clock(st.LastSignal), 100*v.ErrorRate)
		return v
	}
	switch st.Status {
	case messages.StatusDown:
		v.State, v.Detail = Down, "silent since "+clock(st.LastSignal)
		return v
	case messages.StatusStale:
		v.State, v.Detail = Stale, "silent since "+clock(st.LastSignal)
		return v
	}
	if op != nil && (op.Action == messages.ActionDrain || op.Action == messages.ActionCordon) {
		v.Reason = operatorReason(op)
		v.Multiplier = 0
		if st.InFlight == 0 {
			v.State, v.Detail = Drained, v.Reason
		} else {
			v.State, v.Detail = Draining, fmt.Sprintf("%s; %d requests in flight", v.Reason, st.InFlight)
		}
		return v
	}
	// The multiplier the optimizer applies: an operator's pin replaces any
	// penalty.
	nowMs := in.Now.UnixMilli()
	var penDetail string
	switch {
	case op != nil && op.Action == messages.ActionHealth:
		v.Multiplier, v.Reason = op.Health, operatorReason(op)
		penDetail = fmt.Sprintf("operator health ×%.2f", op.Health)
	case in.Penalty != nil && in.Penalty.Model == st.Model:
		p := in.Penalty
		switch {
		case p.Phase == messages.PhasePenalised && nowMs < p.Until:
			v.Multiplier, v.UntilMs, v.Reason = p.Multiplier, p.Until, p.Reason
			penDetail = fmt.Sprintf("×%.2f until %s (%s)", p.Multiplier, clock(p.Until), p.Reason)
		case p.Phase != messages.PhaseRecovered && nowMs < p.RecoverUntil:
			// Slow start: the multiplier ramps from Multiplier at Until to 1.
			m := p.Multiplier
			if span := p.RecoverUntil - p.Until; span > 0 && nowMs > p.Until {
				m += (1 - m) * float64(nowMs-p.Until) / float64(span)
			}
			v.Multiplier, v.UntilMs, v.Reason = m, p.RecoverUntil, p.Reason
			penDetail = fmt.Sprintf("slow start ×%.2f until %s (%s)", m, clock(p.RecoverUntil), p.Reason)
		}
	}
	switch {
	case !(st.Health > 0):
		v.State, v.Detail = Ejected, "reports health 0"
		if f := failures(v); f != "" {
			v.Detail += "; " + f
		}
		return v
	case v.Multiplier <= 0:
		v.State, v.Detail = Ejected, penDetail
		return v
	case v.Multiplier < 1:
		v.State, v.Detail = Penalised, penDetail
		return v
	}
	var why []string
	if f := failures(v); f != "" {
		why = append(why, f)
	}
	if st.Health < 1 {
		why = append(why, fmt.Sprintf("health %.0f%%", 100*st.Health))
	}
	if len(why) > 0 {
		v.State, v.Detail = Degraded, strings.Join(why, ", ")
	}
	return v
}

// failures describes error and timeout rates above DegradedErrorRate.
func failures(v Verdict) string {
	var why []string
	if v.ErrorRate > DegradedErrorRate {
		why = append(why, fmt.Sprintf("errors %.0f%% of attempts", 100*v.ErrorRate))
	}
	if v.TimeoutRate > DegradedErrorRate {
		why = append(why, fmt.Sprintf("timeouts %.0f%% of attempts", 100*v.TimeoutRate))
	}
	return strings.Join(why, ", ")
}

func operatorReason(op *messages.Operator) string {
	s := "operator " + op.Action
	if op.By != "" {
		s += " by " + op.By
	}
	if op.Reason != "" {
		s += ": " + op.Reason
	}
	return s
}

// clock formats a Unix ms time as the local time of day.
func clock(ms int64) string {
	if ms == 0 {
		return "never"
	}
	return time.UnixMilli(ms).Format(time.TimeOnly)
}
