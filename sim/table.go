package sim

import (
	"encoding/json"
	"io"
	"math"
)

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(jsonSafe(r))
}

// jsonSafe returns a copy of the report with NaN and infinite numbers
// replaced by -1 (encoding/json rejects them).
func jsonSafe(r *Report) any {
	type alias Report
	cp := *r
	cp.Policies = make(map[string]Result, len(r.Policies))
	for k, v := range r.Policies {
		for _, p := range []*float64{&v.TTFTP50Ms, &v.TTFTP90Ms, &v.TTFTP99Ms, &v.TBTP50Ms, &v.TBTP99Ms, &v.E2EMeanMs, &v.E2EP99Ms,
			&v.PeakUtilisation, &v.PeakWindowUtilisation, &v.TrafficShareStddev, &v.TrafficShareExcessStddev, &v.KeysRemappedPerUpdate, &v.TargetPeakUtilisation} {
			if math.IsNaN(*p) || math.IsInf(*p, 0) {
				*p = -1
			}
		}
		cp.Policies[k] = v
	}
	if math.IsNaN(cp.LowerBoundE2EMeanMs) {
		cp.LowerBoundE2EMeanMs = -1
	}
	cp.LowerBound.E2EMeanMs = cp.LowerBoundE2EMeanMs
	ph := make([]BoundPhase, len(cp.LowerBound.Phases))
	for k, p := range cp.LowerBound.Phases {
		if math.IsNaN(p.MeanLatencyMs) || math.IsInf(p.MeanLatencyMs, 0) {
			p.MeanLatencyMs = -1
		}
		if math.IsInf(p.MaxUtilisation, 0) {
			p.MaxUtilisation = -1
		}
		ph[k] = p
	}
	cp.LowerBound.Phases = ph
	return (*alias)(&cp)
}
