package suite

import (
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/switchyard-dev/switchyard/sim"
)

// WriteReport renders one scenario's report as a text table: every
// policy's latencies, goodput, KV hit, shares and weight churn.
func WriteReport(w io.Writer, r *sim.Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "scenario %s  seed %d  %d requests (%d measured, %.0f–%.0f s)  offered %.1f req/s = %.0f%% of nominal capacity\n",
		r.Scenario, r.Seed, r.Arrivals, measured(r), r.MeasuredFromS, r.MeasuredToS, r.OfferedRPS, 100*r.OfferedUtilisation)
	for _, p := range r.Profiles {
		if p.CapacityRPS > 0 {
			fmt.Fprintf(&b, "engine type %-10s capacity %.1f req/s  idle latency %.0f ms\n", p.Type, p.CapacityRPS, p.IdleMs)
		}
	}
	fmt.Fprintf(&b, "fluid lower bound on mean e2e latency: %.1f ms\n\n", r.LowerBoundE2EMeanMs)
	head := []string{"policy", "ttft p50", "p90", "p99", "tbt p50", "p99", "e2e mean", "p99", "vs LB", "goodput", "kv hit", "shed", "failed", "x-region", "peak util", "share sd", "excess sd", "revs", "remap/upd"}
	rows := [][]string{head}
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
	writeRows(&b, rows, 1)
	b.WriteString("\nlatencies in ms; vs LB: mean e2e over the fluid lower bound; excess sd: share sd without binomial sampling noise; revs: weight reversals for weighted policies, else traffic-share reversals; remap/upd: keys remapped per weight update\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func measured(r *sim.Report) int64 {
	for _, name := range r.Order {
		return r.Policies[name].Requests
	}
	return 0
}
