package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
)

// WriteTable renders the report as a text table.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "scenario %s  seed %d  %d requests (%d measured, %.0f–%.0f s)  offered %.1f req/s = %.0f%% of nominal capacity\n",
		r.Scenario, r.Seed, r.Arrivals, r.measured(), r.MeasuredFromS, r.MeasuredToS, r.OfferedRPS, 100*r.OfferedUtilisation)
	for _, p := range r.Profiles {
		if p.CapacityRPS > 0 {
			fmt.Fprintf(&b, "engine type %-10s capacity %.1f req/s  idle latency %.0f ms\n", p.Type, p.CapacityRPS, p.IdleMs)
		}
	}
	fmt.Fprintf(&b, "fluid lower bound on mean e2e latency: %.1f ms\n\n", r.LowerBoundE2EMeanMs)
	head := []string{"policy", "ttft p50", "p90", "p99", "tbt p50", "p99", "e2e mean", "p99", "vs LB", "goodput", "kv hit", "shed", "failed", "x-region", "peak util", "share sd", "excess sd", "revs", "remap/upd"}
	rows := [][]string{head}
	ms := func(v float64) string {
		if math.IsNaN(v) {
			return "-"
		}
		return fmt.Sprintf("%.0f", v)
	}
	pc := func(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }
	for _, name := range r.Order {
		x := r.Policies[name]
		gap := "-"
		if g := r.Gap(name); !math.IsNaN(g) {
			gap = fmt.Sprintf("%+.1f%%", 100*g)
		}
		revs := x.ShareReversals
		remap := "-"
		if x.WeightUpdates > 0 {
			revs = x.WeightReversals
			remap = fmt.Sprintf("%.2f%%", 100*x.KeysRemappedPerUpdate)
		}
		rows = append(rows, []string{name, ms(x.TTFTP50Ms), ms(x.TTFTP90Ms), ms(x.TTFTP99Ms), fmt.Sprintf("%.1f", x.TBTP50Ms), fmt.Sprintf("%.1f", x.TBTP99Ms),
			ms(x.E2EMeanMs), ms(x.E2EP99Ms), gap, pc(x.Goodput), pc(x.KVHitRate), pc(x.ShedFraction), pc(x.FailedFraction), pc(x.CrossRegionShare),
			fmt.Sprintf("%.2f", x.PeakUtilisation), fmt.Sprintf("%.4f", x.TrafficShareStddev), fmt.Sprintf("%.4f", x.TrafficShareExcessStddev), fmt.Sprint(revs), remap})
	}
	width := make([]int, len(head))
	for _, row := range rows {
		for k, c := range row {
			width[k] = max(width[k], len([]rune(c)))
		}
	}
	for _, row := range rows {
		for k, c := range row {
			if k == 0 {
				fmt.Fprintf(&b, "%-*s", width[k], c)
			} else {
				fmt.Fprintf(&b, "  %*s", width[k], c)
			}
		}
		b.WriteByte('\n')
	}
	b.WriteString("\nlatencies in ms; vs LB: mean e2e over the fluid lower bound; excess sd: share sd without binomial sampling noise; revs: weight reversals for weighted policies, else traffic-share reversals; remap/upd: keys remapped per weight update\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func (r *Report) measured() int64 {
	for _, name := range r.Order {
		return r.Policies[name].Requests
	}
	return 0
}

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
