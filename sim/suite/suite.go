// Package suite runs the workload suite behind `switchyard sim --suite`:
// every scenario of a directory with every policy, one run per scenario,
// and renders the reports — one table per scenario, one table of the whole
// suite — with issue 18's criteria judged per scenario for the switchyard
// policy against the best other policy.
package suite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/switchyard-dev/switchyard/sim"
	"github.com/switchyard-dev/switchyard/sim/scenario"
)

// ErrSuite is wrapped by errors finding the suite's scenario files.
var ErrSuite = errors.New("sim: bad suite")

// Subject is the policy the criteria judge.
const Subject = "switchyard"

// PrefixAware lists the baselines that route for KV reuse: the KV-hit
// criterion compares the subject with the best of them.
func PrefixAware() []string {
	return []string{"prefix-affinity", "sglang-cache-aware", "llmd-weighted"}
}

// The criteria's limits (issue 18): the subject's e2e mean within 2% and
// e2e p99 within 5% of the best other policy's, goodput at most 0.5 points
// below the best, KV hit at least 95% of the best prefix-aware baseline's,
// at most 2% of keys remapped per weight update.
const (
	MeanLimit   = 1.02
	P99Limit    = 1.05
	GoodputDrop = 0.005
	KVHitShare  = 0.95
	RemapLimit  = 0.02
)

// Files returns the scenario files of paths: a directory stands for its
// *.yaml files (sorted), a file for itself.
func Files(paths []string) ([]string, error) {
	var out []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrSuite, err)
		}
		if !st.IsDir() {
			out = append(out, p)
			continue
		}
		m, err := filepath.Glob(filepath.Join(p, "*.yaml"))
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrSuite, p, err)
		}
		if len(m) == 0 {
			return nil, fmt.Errorf("%w: %s: no *.yaml scenario files", ErrSuite, p)
		}
		slices.Sort(m)
		out = append(out, m...)
	}
	return out, nil
}

// Options configures Run.
type Options struct {
	// Sim configures each scenario's run; its Progress is replaced by
	// Progress below.
	Sim sim.Options
	// Progress, when set, is called with the scenario's index and name, the
	// number of scenarios, and a policy's progress as sim.Options.Progress.
	Progress func(k, n int, scenario, policy string, done float64)
	// Done, when set, is called after each scenario with its outcome.
	Done func(k, n int, o *Outcome)
}

// Outcome is one scenario's report and its verdicts.
type Outcome struct {
	Report   *sim.Report
	Verdicts []Verdict
}

// Run runs every scenario with every policy of opts.Sim, one after another.
func Run(ctx context.Context, scenarios []*scenario.Scenario, opts Options) ([]Outcome, error) {
	out := make([]Outcome, 0, len(scenarios))
	for k, sc := range scenarios {
		so := opts.Sim
		so.Context = ctx
		if p := opts.Progress; p != nil {
			so.Progress = func(policy string, x float64) { p(k, len(scenarios), sc.Name, policy, x) }
		}
		rep, err := sim.Run(sc, so)
		if err != nil {
			return out, fmt.Errorf("suite: scenario %s: %w", sc.Name, err)
		}
		out = append(out, Outcome{Report: rep, Verdicts: Judge(rep)})
		if opts.Done != nil {
			opts.Done(k, len(scenarios), &out[len(out)-1])
		}
	}
	return out, nil
}

// Verdict is one criterion judged on one scenario.
type Verdict struct {
	// Criterion names it: "e2e mean", "e2e p99", "goodput", "kv hit", "remap".
	Criterion string `json:"criterion"`
	// Pass says whether the subject meets it, and Reason why, with figures.
	Pass   bool   `json:"pass"`
	Reason string `json:"reason"`
}

// best returns the policy among names (other than Subject, present in the
// report, with a number) that minimises or maximises get, or "" when none.
func best(r *sim.Report, names []string, get func(sim.Result) float64, lower bool) (string, float64) {
	who, v := "", math.NaN()
	for _, n := range names {
		res, ok := r.Policies[n]
		if n == Subject || !ok {
			continue
		}
		x := get(res)
		if math.IsNaN(x) {
			continue
		}
		if who == "" || (lower && x < v) || (!lower && x > v) {
			who, v = n, x
		}
	}
	return who, v
}

// Judge evaluates the criteria for Subject on a report. A criterion that
// cannot be judged (the subject or every other policy missing) fails and
// says so.
func Judge(r *sim.Report) []Verdict {
	sub, ok := r.Policies[Subject]
	if !ok {
		return []Verdict{{Criterion: "run", Reason: Subject + " was not run"}}
	}
	var out []Verdict
	ratio := func(name string, get func(sim.Result) float64, limit float64) {
		who, b := best(r, r.Order, get, true)
		x := get(sub)
		v := Verdict{Criterion: name}
		switch {
		case who == "":
			v.Reason = "no other policy to compare with"
		case math.IsNaN(x):
			v.Reason = Subject + " served nothing"
		default:
			v.Pass = x <= limit*b
			v.Reason = fmt.Sprintf("%.0f ms = %.3fx %s's %.0f ms (limit %.2fx)", x, x/b, who, b, limit)
		}
		out = append(out, v)
	}
	ratio("e2e mean", func(x sim.Result) float64 { return x.E2EMeanMs }, MeanLimit)
	ratio("e2e p99", func(x sim.Result) float64 { return x.E2EP99Ms }, P99Limit)

	v := Verdict{Criterion: "goodput"}
	if who, b := best(r, r.Order, func(x sim.Result) float64 { return x.Goodput }, false); who == "" {
		v.Reason = "no other policy to compare with"
	} else {
		v.Pass = sub.Goodput >= b-GoodputDrop
		v.Reason = fmt.Sprintf("%.2f%% vs %s's %.2f%% (%+.2f points, limit -%.1f)", 100*sub.Goodput, who, 100*b, 100*(sub.Goodput-b), 100*GoodputDrop)
	}
	out = append(out, v)

	v = Verdict{Criterion: "kv hit"}
	who, b := best(r, PrefixAware(), func(x sim.Result) float64 { return x.KVHitRate }, false)
	switch {
	case who == "":
		v.Reason = "no prefix-aware baseline was run"
	case b <= 0:
		v.Pass, v.Reason = true, "no KV reuse for any prefix-aware baseline"
	default:
		v.Pass = sub.KVHitRate >= KVHitShare*b
		v.Reason = fmt.Sprintf("%.1f%% = %.3fx %s's %.1f%% (limit %.2fx)", 100*sub.KVHitRate, sub.KVHitRate/b, who, 100*b, KVHitShare)
	}
	out = append(out, v)

	v = Verdict{Criterion: "remap"}
	if sub.WeightUpdates == 0 {
		v.Pass, v.Reason = true, "no weight updates"
	} else {
		v.Pass = sub.KeysRemappedPerUpdate <= RemapLimit
		v.Reason = fmt.Sprintf("%.2f%% of keys per update over %d updates (limit %.0f%%)", 100*sub.KeysRemappedPerUpdate, sub.WeightUpdates, 100*RemapLimit)
	}
	return append(out, v)
}

// Passed reports whether every verdict passed.
func Passed(vs []Verdict) bool {
	for _, v := range vs {
		if !v.Pass {
			return false
		}
	}
	return len(vs) > 0
}

// Columns are the suite table's columns.
func Columns() []string {
	return []string{"scenario", "load", "policy", "e2e mean", "e2e p99", "vs LB", "goodput", "kv hit", "remap/upd"}
}

// WriteSuite renders the suite: one row per scenario and policy (Columns),
// then the criteria per scenario, each PASS or FAIL with its reason.
func WriteSuite(w io.Writer, outs []Outcome) error {
	var b strings.Builder
	rows := [][]string{Columns()}
	for _, o := range outs {
		r := o.Report
		for k, name := range r.Order {
			x := r.Policies[name]
			sc, load := "", ""
			if k == 0 {
				sc, load = r.Scenario, fmt.Sprintf("%.0f%%", 100*r.OfferedUtilisation)
			}
			gap, remap := "-", "-"
			if g := r.Gap(name); !math.IsNaN(g) {
				gap = fmt.Sprintf("%+.1f%%", 100*g)
			}
			if x.WeightUpdates > 0 {
				remap = fmt.Sprintf("%.2f%%", 100*x.KeysRemappedPerUpdate)
			}
			rows = append(rows, []string{sc, load, name, ms(x.E2EMeanMs), ms(x.E2EP99Ms), gap,
				fmt.Sprintf("%.2f%%", 100*x.Goodput), fmt.Sprintf("%.1f%%", 100*x.KVHitRate), remap})
		}
	}
	writeRows(&b, rows, 3)
	b.WriteString("\ncriteria for " + Subject + " (e2e mean <= 1.02x and p99 <= 1.05x the best other policy, goodput >= best - 0.5 points, " +
		"kv hit >= 0.95x the best prefix-aware baseline, keys remapped per update <= 2%):\n")
	passed := 0
	for _, o := range outs {
		verdict := "FAIL"
		if Passed(o.Verdicts) {
			verdict = "PASS"
			passed++
		}
		fmt.Fprintf(&b, "%s %s\n", verdict, o.Report.Scenario)
		for _, v := range o.Verdicts {
			mark := "fail"
			if v.Pass {
				mark = "pass"
			}
			fmt.Fprintf(&b, "  %s %-8s %s\n", mark, v.Criterion, v.Reason)
		}
	}
	fmt.Fprintf(&b, "%d of %d scenarios pass every criterion\n", passed, len(outs))
	_, err := io.WriteString(w, b.String())
	return err
}

func ms(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.0f", v)
}

// writeRows writes rows as aligned columns: those of the first left
// columns left-aligned, the others right-aligned.
func writeRows(b *strings.Builder, rows [][]string, left int) {
	width := make([]int, len(rows[0]))
	for _, row := range rows {
		for k, c := range row {
			width[k] = max(width[k], len([]rune(c)))
		}
	}
	for _, row := range rows {
		for k, c := range row {
			sep := "  "
			if k == 0 {
				sep = ""
			}
			if k < left {
				fmt.Fprintf(b, "%s%-*s", sep, width[k], c)
			} else {
				fmt.Fprintf(b, "%s%*s", sep, width[k], c)
			}
		}
		b.WriteByte('\n')
	}
}
