package messages

import (
	"fmt"
	"math"
	"time"
)

// Bounds on counts that no real engine or router reaches; larger values are
// treated as corrupt.
const (
	maxCount   = 1 << 40
	maxLatency = 24 * 3600 * 1000.0 // a day, in ms
	maxRate    = 1e9
	maxMapLen  = 20000
)

// checker accumulates the first validation error, naming kind and field.
type checker struct {
	kind Kind
	err  error
}

func (c *checker) fail(field string, format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("%w: %s.%s %s", ErrInvalid, c.kind, field, fmt.Sprintf(format, args...))
	}
}

func (c *checker) finite(field string, v float64) bool {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		c.fail(field, "is %v, want a finite number", v)
		return false
	}
	return true
}

// nonNeg checks 0 <= v <= limit.
func (c *checker) nonNeg(field string, v, limit float64) {
	if !c.finite(field, v) {
		return
	}
	if v < 0 {
		c.fail(field, "is %v, want >= 0", v)
	} else if v > limit {
		c.fail(field, "is %v, want <= %v", v, limit)
	}
}

func (c *checker) fraction(field string, v float64) {
	if !c.finite(field, v) {
		return
	}
	if v < 0 || v > 1 {
		c.fail(field, "is %v, want a fraction in 0..1", v)
	}
}

func (c *checker) count(field string, v int64) {
	if v < 0 || v > maxCount {
		c.fail(field, "is %d, want 0..%d", v, int64(maxCount))
	}
}

func (c *checker) name(field, v string, optional bool) {
	if optional && v == "" {
		return
	}
	if !ValidName(v) {
		c.fail(field, "is %q, want 1-%d characters of A-Z a-z 0-9 _ - (a NATS token: no dots, spaces or wildcards)", v, MaxNameLen)
	}
}

func (c *checker) model(v string, optional bool) { c.modelID("model", v, optional) }

func (c *checker) modelID(field, v string, optional bool) {
	if optional && v == "" {
		return
	}
	if p := modelIDProblem(v); p != "" {
		c.fail(field, "is %q, which %s (a model id: any printable characters but white space)", v, p)
	}
}

func (c *checker) time(field string, ms int64, now time.Time) {
	if ms < EpochMs {
		c.fail(field, "is %d, want a Unix time in ms from %s (EpochMs) on", ms, fmtMs(EpochMs))
		return
	}
	if limit := now.Add(MaxFutureSkew).UnixMilli(); ms > limit {
		c.failWith(ErrFuture, field, "is %s, more than %s in the future", fmtMs(ms), MaxFutureSkew)
	}
}

func (c *checker) window(field string, w Window, limit float64) {
	c.nonNeg(field+".fast", w.Fast, limit)
	c.nonNeg(field+".slow", w.Slow, limit)
}

func (c *checker) mapLen(field string, n int) {
	if n > maxMapLen {
		c.fail(field, "has %d entries, want at most %d", n, maxMapLen)
	}
}

func (c *checker) transports(field string, ts []Transport) {
	if len(ts) > 8 {
		c.fail(field, "has %d entries, want at most 8", len(ts))
	}
	for i, t := range ts {
		f := fmt.Sprintf("%s[%d]", field, i)
		if t.Kind != TransportHTTP && t.Kind != TransportNATS {
			c.fail(f+".kind", "is %q, want %q or %q", t.Kind, TransportHTTP, TransportNATS)
		}
		if t.Address == "" || len(t.Address) > 512 {
			c.fail(f+".address", "is %q, want a non-empty address of at most 512 bytes", t.Address)
		}
	}
}

// Validate checks every field of the signal; its time must be at most
// MaxMessageAge old (checked last, so that ErrExpired says the rest is valid).
func (m *EngineSignal) Validate(now time.Time) error {
	c := checker{kind: KindSignal}
	c.model(m.Model, false)
	c.modelID("served_model", m.ServedModel, true)
	c.name("engine", m.Engine, false)
	c.name("region", m.Region, true)
	c.time("time_ms", m.Time, now)
	c.nonNeg("ttft_ms", m.TTFTMs, maxLatency)
	c.nonNeg("tbt_ms", m.TBTMs, maxLatency)
	c.count("queue", int64(m.Queue))
	c.count("running", int64(m.Running))
	c.count("max_running", int64(m.MaxRunning))
	c.fraction("kv_use", m.KVUse)
	c.nonNeg("capacity_rps", m.CapacityRPS, maxRate)
	c.nonNeg("load_rps", m.LoadRPS, maxRate)
	c.nonNeg("output_tokens", m.OutputTokens, 1e7)
	c.count("replicas", int64(m.Replicas))
	c.fraction("health", m.Health)
	c.nonNeg("base_latency_ms", m.BaseLatencyMs, maxLatency)
	c.nonNeg("prompt_tokens", m.PromptTokens, maxTokensPerRequest)
	c.nonNeg("prefill_weight", m.PrefillWeight, maxPrefillWeight)
	c.transports("transports", m.Transports)
	c.fresh("time_ms", m.Time, now)
	return c.err
}

// Validate checks every field of the report: besides ranges, the interval is
// at least MinReportInterval and no count implies a rate above MaxRouterRate.
func (m *RouterReport) Validate(now time.Time) error {
	c := checker{kind: KindReport}
	c.model(m.Model, false)
	c.name("cluster", m.Cluster, false)
	c.name("router", m.Router, false)
	c.time("time_ms", m.Time, now)
	iv := 0.0 // the interval rates are checked over; 0 when invalid
	if c.finite("interval_s", m.IntervalS) {
		if m.IntervalS < MinReportInterval || m.IntervalS > 3600 {
			c.fail("interval_s", "is %v, want %v <= interval <= 3600", m.IntervalS, MinReportInterval)
		} else {
			iv = m.IntervalS
		}
	}
	c.count("requests", m.Requests)
	c.count("shed", m.Shed)
	c.count("retries", m.Retries)
	c.rate("requests", m.Requests, iv)
	c.rate("shed", m.Shed, iv)
	c.rate("retries", m.Retries, iv)
	c.mapLen("demand_by_priority", len(m.DemandByPriority))
	for p, n := range m.DemandByPriority {
		if !ValidPriority(p) {
			c.fail("demand_by_priority", "has key %q, want critical, standard or sheddable", p)
		}
		c.count("demand_by_priority."+p, n)
		c.rate("demand_by_priority."+p, n, iv)
	}
	c.mapLen("engines", len(m.Engines))
	for e, o := range m.Engines {
		c.name("engines key", e, false)
		f := "engines." + e
		c.count(f+".sent", o.Sent)
		c.count(f+".succeeded", o.Succeeded)
		c.count(f+".timeouts", o.Timeouts)
		c.rate(f+".sent", o.Sent, iv)
		c.rate(f+".succeeded", o.Succeeded, iv)
		c.rate(f+".timeouts", o.Timeouts, iv)
		c.nonNeg(f+".latency_ms", o.LatencyMs, maxLatency)
		c.nonNeg(f+".ttft_ms", o.TTFTMs, maxLatency)
		if len(o.Errors) > 16 {
			c.fail(f+".errors", "has %d classes, want at most 16", len(o.Errors))
		}
		for class, n := range o.Errors {
			c.name(f+".errors key", class, false)
			c.count(f+".errors."+class, n)
			c.rate(f+".errors."+class, n, iv)
		}
	}
	c.mapLen("rtt_ms", len(m.RTTMs))
	for e, v := range m.RTTMs {
		c.name("rtt_ms key", e, false)
		c.nonNeg("rtt_ms."+e, v, maxLatency)
	}
	c.tokens("prompt_tokens", m.PromptTokens, m.Requests)
	c.count("completed", m.Completed)
	c.rate("completed", m.Completed, iv)
	c.tokens("output_tokens", m.OutputTokens, m.Completed)
	c.fresh("time_ms", m.Time, now)
	return c.err
}

// Validate checks every field of the engine state.
func (m *EngineState) Validate(now time.Time) error {
	c := checker{kind: KindEngineState}
	c.model(m.Model, false)
	c.name("engine", m.Engine, false)
	c.name("region", m.Region, true)
	switch m.Status {
	case StatusUp, StatusStale, StatusDown:
	default:
		c.fail("status", "is %q, want %q, %q or %q", m.Status, StatusUp, StatusStale, StatusDown)
	}
	c.time("time_ms", m.Time, now)
	if m.LastSignal != 0 {
		c.time("last_signal_ms", m.LastSignal, now)
	}
	c.window("ttft_ms", m.TTFTMs, maxLatency)
	c.window("tbt_ms", m.TBTMs, maxLatency)
	c.window("queue", m.Queue, maxCount)
	c.window("running", m.Running, maxCount)
	c.window("kv_use", m.KVUse, 1)
	c.window("load_rps", m.LoadRPS, maxRate)
	c.window("output_tokens", m.OutputTokens, 1e7)
	c.window("prompt_tokens", m.PromptTokens, maxTokensPerRequest)
	c.nonNeg("prefill_weight", m.PrefillWeight, maxPrefillWeight)
	c.count("in_flight", m.InFlight)
	c.nonNeg("capacity_rps", m.CapacityRPS, maxRate)
	c.count("replicas", int64(m.Replicas))
	c.fraction("health", m.Health)
	c.nonNeg("base_latency_ms", m.BaseLatencyMs, maxLatency)
	c.transports("transports", m.Transports)
	if o := m.Outcomes; o != nil {
		if o.LastReport != 0 {
			c.time("outcomes.last_report_ms", o.LastReport, now)
		}
		if o.LastSent != 0 {
			c.time("outcomes.last_sent_ms", o.LastSent, now)
		}
		c.window("outcomes.sent_rps", o.SentRPS, maxRate)
		c.window("outcomes.error_rate", o.ErrorRate, 1)
		c.window("outcomes.timeout_rate", o.TimeoutRate, 1)
		c.window("outcomes.ttft_ms", o.TTFTMs, maxLatency)
		c.count("outcomes.failed_intervals", int64(o.FailedIntervals))
	}
	return c.err
}

// Bounds of the mix fields: no request holds more tokens than
// maxTokensPerRequest (above every model's context window), no engine's
// prompt token costs more than maxPrefillWeight output tokens.
const (
	maxTokensPerRequest = 1 << 24
	maxPrefillWeight    = 100
)

// tokens checks a report's token sum: a count of at most
// maxTokensPerRequest per request of the n it sums over.
func (c *checker) tokens(field string, v, n int64) {
	if v < 0 || v > maxTokensPerRequest*max(n, 0) {
		c.fail(field, "is %d, want 0..%d (at most %d tokens for each of %d requests)", v, maxTokensPerRequest*max(n, 0), int64(maxTokensPerRequest), n)
	}
}

// mix checks the mix windows of a demand state (prefix "") or a router's entry.
func (c *checker) mix(prefix string, prompt, done, output, variance Window) {
	c.window(prefix+"prompt_tps", prompt, maxRate*maxTokensPerRequest)
	c.window(prefix+"done_rps", done, maxRate)
	c.window(prefix+"output_tps", output, maxRate*maxTokensPerRequest)
	c.window(prefix+"rps_var", variance, maxRate*maxRate)
}

// maxText bounds free-text fields (reasons, details).
const maxText = 512

func (c *checker) text(field, v string) {
	if len(v) > maxText {
		c.fail(field, "has %d bytes, want at most %d", len(v), maxText)
	}
}

// Validate checks every field of the penalty.
func (m *Penalty) Validate(now time.Time) error {
	c := checker{kind: KindPenalty}
	c.model(m.Model, false)
	c.name("engine", m.Engine, false)
	c.time("time_ms", m.Time, now)
	switch m.Phase {
	case PhasePenalised, PhaseRecovering, PhaseRecovered:
	default:
		c.fail("phase", "is %q, want %q, %q or %q", m.Phase, PhasePenalised, PhaseRecovering, PhaseRecovered)
	}
	c.fraction("multiplier", m.Multiplier)
	switch m.Reason {
	case ReasonFailures, ReasonErrorRate, ReasonTimeouts, ReasonSlowTTFT:
	default:
		c.fail("reason", "is %q, want %s, %s, %s or %s", m.Reason, ReasonFailures, ReasonErrorRate, ReasonTimeouts, ReasonSlowTTFT)
	}
	c.text("detail", m.Detail)
	if m.Since <= 0 || m.Until < m.Since || m.RecoverUntil < m.Until {
		c.fail("until_ms", "since %d, until %d, recover until %d: want 0 < since <= until <= recover_until", m.Since, m.Until, m.RecoverUntil)
	} else {
		c.time("since_ms", m.Since, now)
		span := MaxPenaltySpan.Milliseconds()
		if m.Until-m.Since > span || m.RecoverUntil-m.Until > span {
			c.fail("until_ms", "since %s, until %s, recover until %s: want a penalty and a recovery of at most %s each",
				fmtMs(m.Since), fmtMs(m.Until), fmtMs(m.RecoverUntil), MaxPenaltySpan)
		}
	}
	c.count("strikes", int64(m.Strikes))
	return c.err
}

// Validate checks every field of the operator override.
func (m *Operator) Validate(now time.Time) error {
	c := checker{kind: KindOperator}
	c.name("engine", m.Engine, false)
	c.model(m.Model, true)
	c.time("time_ms", m.Time, now)
	switch m.Action {
	case ActionDrain, ActionCordon:
		if m.Health != 0 {
			c.fail("health", "is %v, want none for %s", m.Health, m.Action)
		}
	case ActionHealth:
		c.fraction("health", m.Health)
	default:
		c.fail("action", "is %q, want %q, %q or %q", m.Action, ActionDrain, ActionCordon, ActionHealth)
	}
	c.text("reason", m.Reason)
	c.text("by", m.By)
	return c.err
}

// Validate checks every field of the demand state.
func (m *DemandState) Validate(now time.Time) error {
	c := checker{kind: KindDemandState}
	c.model(m.Model, false)
	c.name("cluster", m.Cluster, false)
	c.time("time_ms", m.Time, now)
	if m.LastReport != 0 {
		c.time("last_report_ms", m.LastReport, now)
	}
	c.window("rps", m.RPS, maxRate)
	c.window("shed_rps", m.ShedRPS, maxRate)
	c.window("retry_rps", m.RetryRPS, maxRate)
	c.mix("", m.PromptTPS, m.DoneRPS, m.OutputTPS, m.RPSVar)
	for p, w := range m.RPSByPriority {
		if !ValidPriority(p) {
			c.fail("rps_by_priority", "has key %q, want critical, standard or sheddable", p)
		}
		c.window("rps_by_priority."+p, w, maxRate)
	}
	c.mapLen("routers", len(m.Routers))
	for r, d := range m.Routers {
		c.name("routers key", r, false)
		f := "routers." + r
		c.time(f+".last_report_ms", d.LastReport, now)
		c.window(f+".rps", d.RPS, maxRate)
		c.window(f+".shed_rps", d.ShedRPS, maxRate)
		c.window(f+".retry_rps", d.RetryRPS, maxRate)
		c.mix(f+".", d.PromptTPS, d.DoneRPS, d.OutputTPS, d.RPSVar)
		for p, w := range d.Priority {
			if !ValidPriority(p) {
				c.fail(f+".rps_by_priority", "has key %q, want critical, standard or sheddable", p)
			}
			c.window(f+".rps_by_priority."+p, w, maxRate)
		}
	}
	return c.err
}

// Validate checks every field of the RTT state.
func (m *RTTState) Validate(now time.Time) error {
	c := checker{kind: KindRTTState}
	c.name("cluster", m.Cluster, false)
	c.name("engine", m.Engine, false)
	c.time("time_ms", m.Time, now)
	c.window("rtt_ms", m.RTTMs, maxLatency)
	return c.err
}

// Validate checks every field of the snapshot; weights and the shed fraction
// must sum to 1 within 1e-6 unless the snapshot has no weights at all, and the
// generation must be at most GenerationCeiling(now).
func (m *WeightSnapshot) Validate(now time.Time) error {
	c := checker{kind: KindWeights}
	c.model(m.Model, false)
	c.name("cluster", m.Cluster, false)
	c.name("writer", m.Writer, true)
	c.time("time_ms", m.Time, now)
	if m.Generation == 0 {
		c.fail("generation", "is 0, want >= 1")
	} else if ceiling := GenerationCeiling(now); m.Generation > ceiling {
		c.failWith(ErrFuture, "generation", "is %d, above %d, the ceiling at %s (GenerationCeiling)", m.Generation, ceiling, fmtMs(now.UnixMilli()))
	}
	c.fraction("shed_fraction", m.ShedFraction)
	c.nonNeg("demand_rps", m.DemandRPS, maxRate)
	c.nonNeg("gap", m.Gap, math.MaxFloat64)
	c.mapLen("weights", len(m.Weights))
	sum := m.ShedFraction
	for e, w := range m.Weights {
		c.name("weights key", e, false)
		c.fraction("weights."+e, w)
		sum += w
	}
	if c.err == nil && len(m.Weights) > 0 && math.Abs(sum-1) > 1e-6 {
		c.fail("weights", "sum with shed_fraction to %v, want 1", sum)
	}
	for p, f := range m.ShedByPriority {
		if !ValidPriority(p) {
			c.fail("shed_by_priority", "has key %q, want critical, standard or sheddable", p)
		}
		c.fraction("shed_by_priority."+p, f)
	}
	c.mapLen("utilisation", len(m.Utilisation))
	for e, u := range m.Utilisation {
		c.name("utilisation key", e, false)
		c.nonNeg("utilisation."+e, u, 1e6)
	}
	c.mapLen("latency_ms", len(m.LatencyMs))
	for e, l := range m.LatencyMs {
		c.name("latency_ms key", e, false)
		c.nonNeg("latency_ms."+e, l, maxLatency)
	}
	c.slots(m)
	return c.err
}

// slots checks a snapshot's selection table: both fields empty, or distinct
// engines of Weights and a power-of-two count of in-range slot indexes.
func (c *checker) slots(m *WeightSnapshot) {
	if len(m.SlotEngines) == 0 && len(m.Slots) == 0 {
		return
	}
	if len(m.SlotEngines) == 0 {
		c.fail("slot_engines", "is empty, but slots are set")
		return
	}
	c.mapLen("slot_engines", len(m.SlotEngines))
	seen := make(map[string]struct{}, len(m.SlotEngines))
	for i, e := range m.SlotEngines {
		f := fmt.Sprintf("slot_engines[%d]", i)
		c.name(f, e, false)
		if _, dup := seen[e]; dup {
			c.fail(f, "repeats engine %q", e)
		}
		seen[e] = struct{}{}
		if _, ok := m.Weights[e]; !ok {
			c.fail(f, "is %q, not a key of weights", e)
		}
	}
	n := len(m.Slots) / 2
	if len(m.Slots)%2 != 0 || n < MinSnapshotSlots || n > MaxSnapshotSlots || n&(n-1) != 0 {
		c.fail("slots", "has %d bytes, want 2 bytes per slot for a power-of-two count of %d..%d slots",
			len(m.Slots), MinSnapshotSlots, MaxSnapshotSlots)
		return
	}
	for s := 0; s < n; s++ {
		if j := int(m.Slots[2*s]) | int(m.Slots[2*s+1])<<8; j >= len(m.SlotEngines) {
			c.fail("slots", "slot %d refers to engine %d, want < %d (slot_engines)", s, j, len(m.SlotEngines))
			return
		}
	}
}

// Priority classes of demand, from the first shed to the last.
const (
	PrioritySheddable = "sheddable"
	PriorityStandard  = "standard"
	PriorityCritical  = "critical"
)

// ValidPriority reports whether p names a priority class.
func ValidPriority(p string) bool {
	return p == PriorityCritical || p == PriorityStandard || p == PrioritySheddable
}
