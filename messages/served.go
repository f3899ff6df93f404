package messages

import "time"

// OutcomeEvidenceAge is how recent routers' requests to an engine must be
// for their outcomes to say anything about it: the optimizer's default
// evidence age (optimizersvc PenaltyOptions.EvidenceMaxAge), and the age
// the operators' view (internal/enginestate, the dashboard) judges a
// silent engine by. Five seconds spans several router report intervals.
const OutcomeEvidenceAge = 5 * time.Second

// ServedOnOutcomes reports whether a silent engine (its state stale or
// down: no signal for the aggregator's stale-after) is still serving by
// the routers' own outcomes at now: a router sent it requests within
// maxAge and the newest reports naming it were not all failures (no
// failed interval in a row, and a success measured). Its signals are
// then missing, not the engine — its agent or publisher died — and its
// state is unknown rather than down: the optimizer keeps planning it, and
// the routers' outcomes take it out the moment its requests fail.
func (s *EngineState) ServedOnOutcomes(now time.Time, maxAge time.Duration) bool {
	if s == nil || (s.Status != StatusStale && s.Status != StatusDown) {
		return false
	}
	o := s.Outcomes
	return o != nil && o.LastSent > 0 && now.UnixMilli()-o.LastSent <= maxAge.Milliseconds() &&
		o.FailedIntervals == 0 && o.TTFTMs.Fast > 0
}
