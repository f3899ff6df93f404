package optimizersvc

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/optimizer"
)

// PenaltyOptions are the outlier rules and the penalty schedule (see the
// package comment). Zero values take the defaults given per field.
type PenaltyOptions struct {
	// Off turns penalties off.
	Off bool
	// ErrorRateFloor and ErrorRateFactor: an engine is an outlier when its
	// error rate (fast window) exceeds max(ErrorRateFloor, ErrorRateFactor ×
	// the fleet median). Defaults 0.05 and 3.
	ErrorRateFloor, ErrorRateFactor float64
	// TimeoutRateFloor: an engine is an outlier when its timeout rate (fast
	// window) exceeds max(TimeoutRateFloor, ErrorRateFactor × the fleet's
	// median timeout rate). Default 0.05.
	TimeoutRateFloor float64
	// FailedIntervals: an engine is an outlier after this many consecutive
	// report intervals without a success. Default 1.
	FailedIntervals int
	// SlowTTFT turns on the slow-TTFT rule below. It is off by default: on a
	// CPU-starved host every engine's TTFT as routers see it rises together
	// with the routers' own delays, and penalising engines then takes
	// capacity away exactly when it is short.
	SlowTTFT bool
	// TTFTFactor and TTFTSlackMs: an engine is an outlier when the TTFT
	// routers see (fast window) exceeds TTFTFactor × its fitted TTFT profile
	// at its load plus TTFTSlackMs. Defaults 3 and 50 ms.
	TTFTFactor, TTFTSlackMs float64
	// EvidenceMaxAge: outcomes are judged only when routers sent the engine
	// requests this recently. Default 5 s.
	EvidenceMaxAge time.Duration
	// Base, Growth and Max: the n-th penalty in a row lasts Base ×
	// Growth^(n−1), at most Max. Defaults 5 s, 2 and 5 min.
	Base   time.Duration
	Growth float64
	Max    time.Duration
	// SlowStart is how long the multiplier takes to ramp back to 1 after a
	// penalty ends, and after an engine's effective capacity comes back from
	// about zero for any other reason (see Service.slowStart: its health
	// signal, status, an operator override, a capacity drop). Default 10 s.
	SlowStart time.Duration
	// NoSlowStart turns the slow start off: capacity comes back at once.
	NoSlowStart bool
	// RecoveryFloor is where the ramp starts for a penalty of multiplier 0
	// and for a capacity back from about zero, so that the engine gets a
	// little traffic to prove itself. Default 0.1.
	RecoveryFloor float64
	// StrikeDecay is how long an engine must behave after a penalty's slow
	// start for one of its strikes to be forgiven: with Growth 2 the length
	// of its next penalty halves every StrikeDecay of good behaviour.
	// Default 1 min: an engine that relapses within a minute of coming back
	// (a flapping one) keeps escalating, one whose fault is gone is back at
	// strike zero within a few minutes.
	StrikeDecay time.Duration
	// NoStrikeDecay keeps strikes until Forget clears them all.
	NoStrikeDecay bool
	// Forget is how long an engine must behave after its slow start before
	// all its strikes are forgotten (and its penalty record deleted),
	// whatever StrikeDecay left. Default 5 min.
	Forget time.Duration
	// MaxShare is the largest share of a model's engines penalised at once;
	// beyond it only the worst are. Default 0.5.
	MaxShare float64
}

// WithDefaults returns a copy of o with every zero field set to its default.
func (o PenaltyOptions) WithDefaults() PenaltyOptions {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.ErrorRateFloor, 0.05)
	def(&o.ErrorRateFactor, 3)
	def(&o.TimeoutRateFloor, 0.05)
	if o.FailedIntervals == 0 {
		o.FailedIntervals = 1
	}
	def(&o.TTFTFactor, 3)
	def(&o.TTFTSlackMs, 50)
	defDur(&o.EvidenceMaxAge, messages.OutcomeEvidenceAge)
	defDur(&o.Base, 5*time.Second)
	def(&o.Growth, 2)
	defDur(&o.Max, 5*time.Minute)
	defDur(&o.SlowStart, 10*time.Second)
	def(&o.RecoveryFloor, 0.1)
	defDur(&o.StrikeDecay, time.Minute)
	defDur(&o.Forget, 5*time.Minute)
	def(&o.MaxShare, 0.5)
	return o
}

// Validate reports the first field of o (after defaults) that is not
// usable, naming it as Penalties.<field> with its value; the error wraps
// ErrOptions.
func (o PenaltyOptions) Validate() error {
	o = o.WithDefaults()
	for _, f := range []struct {
		field string
		v, hi float64
	}{
		{"ErrorRateFloor", o.ErrorRateFloor, 1}, {"TimeoutRateFloor", o.TimeoutRateFloor, 1},
		{"ErrorRateFactor", o.ErrorRateFactor, math.MaxFloat64}, {"TTFTFactor", o.TTFTFactor, math.MaxFloat64},
		{"TTFTSlackMs", o.TTFTSlackMs, math.MaxFloat64}, {"RecoveryFloor", o.RecoveryFloor, 1}, {"MaxShare", o.MaxShare, 1},
	} {
		if math.IsNaN(f.v) || f.v <= 0 || f.v > f.hi {
			return fmt.Errorf("%w: Penalties.%s is %v, want a finite number in (0, %v]", ErrOptions, f.field, f.v, f.hi)
		}
	}
	if math.IsNaN(o.Growth) || o.Growth < 1 || o.Growth > math.MaxFloat64 {
		return fmt.Errorf("%w: Penalties.Growth is %v, want a finite number >= 1", ErrOptions, o.Growth)
	}
	if o.FailedIntervals < 1 {
		return fmt.Errorf("%w: Penalties.FailedIntervals is %d, want >= 1", ErrOptions, o.FailedIntervals)
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"EvidenceMaxAge", o.EvidenceMaxAge}, {"Base", o.Base}, {"Max", o.Max}, {"SlowStart", o.SlowStart},
		{"StrikeDecay", o.StrikeDecay}, {"Forget", o.Forget}} {
		if d.v <= 0 {
			return fmt.Errorf("%w: Penalties.%s is %s, want > 0 (zero means the default)", ErrOptions, d.field, d.v)
		}
	}
	if o.Base > o.Max {
		return fmt.Errorf("%w: Penalties.Base %s is longer than Penalties.Max %s", ErrOptions, o.Base, o.Max)
	}
	// Penalty records must validate (messages.MaxPenaltySpan) to be written.
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"Max", o.Max}, {"SlowStart", o.SlowStart}} {
		if d.v > messages.MaxPenaltySpan {
			return fmt.Errorf("%w: Penalties.%s is %s, want at most %s (messages.MaxPenaltySpan)", ErrOptions, d.field, d.v, messages.MaxPenaltySpan)
		}
	}
	return nil
}

// slowStart is the length of a slow start: SlowStart, or 0 with NoSlowStart.
func (o *PenaltyOptions) slowStart() time.Duration {
	if o.NoSlowStart {
		return 0
	}
	return o.SlowStart
}

// Multipliers of the penalty rules.
const (
	// heavyRate is the error or timeout rate from which the multiplier is 0.
	heavyRate = 0.5
	// rateMultiplier is the multiplier for an error or timeout rate above
	// the threshold but below heavyRate.
	rateMultiplier = 0.25
	// slowMultiplier is the multiplier of an engine slow to first token.
	slowMultiplier = 0.5
)

// verdict is what the rules find about one engine at one time.
type verdict struct {
	reason     string  // "" when the engine behaves
	multiplier float64 // 0..1, 1 when it behaves
	detail     string
}

// fleet holds a model's fleet-wide aggregates of outcomes.
type fleet struct {
	errorMedian, timeoutMedian float64
}

// fleetOf returns the medians over the engines with fresh evidence.
func fleetOf(outs []*messages.EngineOutcomes) fleet {
	var errs, tos []float64
	for _, o := range outs {
		if o != nil {
			errs = append(errs, o.ErrorRate.Fast)
			tos = append(tos, o.TimeoutRate.Fast)
		}
	}
	var f fleet
	if len(errs) > 0 {
		f.errorMedian, f.timeoutMedian = optimizer.Median(errs), optimizer.Median(tos)
	}
	return f
}

// assess applies the outlier rules to one engine's outcomes. expectTTFTMs is
// the engine's fitted TTFT at its load (0: unknown, the TTFT rule is off).
func (o *PenaltyOptions) assess(out *messages.EngineOutcomes, fl fleet, expectTTFTMs float64) verdict {
	v := verdict{multiplier: 1}
	if out == nil {
		return v
	}
	worse := func(reason string, m float64, detail string) {
		if m < v.multiplier {
			v = verdict{reason: reason, multiplier: m, detail: detail}
		}
	}
	rate := func(r float64) float64 {
		if r >= heavyRate {
			return 0
		}
		return rateMultiplier
	}
	if out.FailedIntervals >= o.FailedIntervals {
		worse(messages.ReasonFailures, 0, fmt.Sprintf("%d report intervals in a row without a success", out.FailedIntervals))
	}
	if limit := math.Max(o.ErrorRateFloor, o.ErrorRateFactor*fl.errorMedian); out.ErrorRate.Fast > limit {
		worse(messages.ReasonErrorRate, rate(out.ErrorRate.Fast),
			fmt.Sprintf("error rate %.3f above %.3f (fleet median %.3f)", out.ErrorRate.Fast, limit, fl.errorMedian))
	}
	if limit := math.Max(o.TimeoutRateFloor, o.ErrorRateFactor*fl.timeoutMedian); out.TimeoutRate.Fast > limit {
		worse(messages.ReasonTimeouts, rate(out.TimeoutRate.Fast),
			fmt.Sprintf("timeout rate %.3f above %.3f (fleet median %.3f)", out.TimeoutRate.Fast, limit, fl.timeoutMedian))
	}
	if o.SlowTTFT && expectTTFTMs > 0 && out.TTFTMs.Fast > 0 {
		if limit := o.TTFTFactor*expectTTFTMs + o.TTFTSlackMs; out.TTFTMs.Fast > limit {
			worse(messages.ReasonSlowTTFT, slowMultiplier,
				fmt.Sprintf("TTFT seen by routers %.0f ms above %.0f ms (%.0f × profile %.0f ms + %.0f ms)",
					out.TTFTMs.Fast, limit, o.TTFTFactor, expectTTFTMs, o.TTFTSlackMs))
		}
	}
	return v
}

// duration returns the length of the strikes-th penalty in a row.
func (o *PenaltyOptions) duration(strikes int) time.Duration {
	d := float64(o.Base) * math.Pow(o.Growth, float64(max(strikes-1, 0)))
	if d >= float64(o.Max) || math.IsInf(d, 0) {
		return o.Max
	}
	return time.Duration(d)
}

// penalty is one engine's penalty state.
type penalty struct {
	strikes      int // given, before decay (see strikesAt)
	reason       string
	detail       string
	mult         float64   // multiplier while penalised
	since, until time.Time // the penalty
	recoverUntil time.Time // end of the slow start
	stored       bool      // read from the bucket: its record is deleted when forgotten
}

// strikesAt returns p's strikes at now after decay: one fewer for every
// StrikeDecay since the end of its slow start. It is a function of the
// record's fields alone, so that every instance (and a restarted one)
// decays the same strikes the same way.
func (o *PenaltyOptions) strikesAt(p *penalty, now time.Time) int {
	if p == nil {
		return 0
	}
	if o.NoStrikeDecay || now.Before(p.recoverUntil) {
		return p.strikes
	}
	gone := now.Sub(p.recoverUntil) / o.StrikeDecay
	if gone >= time.Duration(p.strikes) {
		return 0
	}
	return p.strikes - int(gone)
}

// forgotten reports whether p's strikes are all forgiven at now: decayed to
// none, or Forget after the end of its slow start.
func (o *PenaltyOptions) forgotten(p *penalty, now time.Time) bool {
	if now.Before(p.recoverUntil) {
		return false
	}
	return o.strikesAt(p, now) == 0 || now.After(p.recoverUntil.Add(o.Forget))
}

// multiplier returns the health multiplier at now: mult while penalised, a
// linear ramp from max(mult, floor) to 1 during the slow start, then 1.
func (p *penalty) multiplier(now time.Time, floor float64) float64 {
	switch {
	case p == nil || p.strikes == 0 || !now.Before(p.recoverUntil):
		return 1
	case now.Before(p.until):
		return p.mult
	}
	from := math.Max(p.mult, floor)
	span := p.recoverUntil.Sub(p.until).Seconds()
	if span <= 0 {
		return 1
	}
	return math.Min(1, from+(1-from)*now.Sub(p.until).Seconds()/span)
}

// phase returns the penalty's phase at now.
func (p *penalty) phase(now time.Time) string {
	switch {
	case now.Before(p.until):
		return messages.PhasePenalised
	case now.Before(p.recoverUntil):
		return messages.PhaseRecovering
	}
	return messages.PhaseRecovered
}

// candidate is one engine the rules found misbehaving in a round.
type candidate struct {
	key     string
	verdict verdict
	errRate float64
}

// penaltyEvent is a change the leader logs and publishes.
type penaltyEvent struct {
	key string
	p   penalty
	new bool // a new penalty (or a harsher multiplier), not a phase change
}

// judge updates the penalties of one model's engines at now. outs holds each
// engine's outcomes (nil when without fresh evidence: not judged), expect its
// fitted TTFT. It returns the new penalties.
func (o *PenaltyOptions) judge(pens map[string]*penalty, keys []string, outs map[string]*messages.EngineOutcomes,
	expect map[string]float64, now time.Time) []penaltyEvent {
	list := make([]*messages.EngineOutcomes, 0, len(keys))
	for _, k := range keys {
		list = append(list, outs[k])
	}
	fl := fleetOf(list)
	var cands []candidate
	active := 0
	for _, k := range keys {
		p := pens[k]
		if p != nil && p.strikes > 0 && now.Before(p.until) {
			active++
		}
		out := outs[k]
		if out == nil {
			continue
		}
		// Judge only evidence newer than the current penalty's start
		// (while penalised: a harsher verdict) or its end (after it).
		if p != nil && p.strikes > 0 {
			ref := p.until
			if now.Before(p.until) {
				ref = p.since
			}
			if !time.UnixMilli(out.LastSent).After(ref) {
				continue
			}
		}
		v := o.assess(out, fl, expect[k])
		if v.reason == "" {
			continue
		}
		cands = append(cands, candidate{key: k, verdict: v, errRate: out.ErrorRate.Fast})
	}
	sort.SliceStable(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		if a.verdict.multiplier != b.verdict.multiplier {
			return a.verdict.multiplier < b.verdict.multiplier
		}
		return a.errRate > b.errRate
	})
	limit := int(math.Floor(o.MaxShare * float64(len(keys))))
	var events []penaltyEvent
	for _, c := range cands {
		p := pens[c.key]
		if p != nil && p.strikes > 0 && now.Before(p.until) {
			if c.verdict.multiplier < p.mult { // harsher within the same penalty
				p.mult, p.reason, p.detail = c.verdict.multiplier, c.verdict.reason, c.verdict.detail
				events = append(events, penaltyEvent{key: c.key, p: *p, new: true})
			}
			continue
		}
		if active >= limit {
			continue // fleet cap: only the worst are penalised
		}
		active++
		if p == nil {
			p = &penalty{}
			pens[c.key] = p
		}
		p.strikes = o.strikesAt(p, now) + 1
		p.reason, p.detail, p.mult = c.verdict.reason, c.verdict.detail, c.verdict.multiplier
		p.since = now
		p.until = now.Add(o.duration(p.strikes))
		p.recoverUntil = p.until.Add(o.slowStart())
		events = append(events, penaltyEvent{key: c.key, p: *p, new: true})
	}
	return events
}

// penalisedKeys returns the keys of pens with a penalty in force at now, sorted.
func penalisedKeys(pens map[string]*penalty, now time.Time) []string {
	var ks []string
	for k, p := range pens {
		if p.strikes > 0 && now.Before(p.until) {
			ks = append(ks, k)
		}
	}
	slices.Sort(ks)
	return ks
}
