package suite

import (
	"bytes"
	"context"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/switchyard-dev/switchyard/sim"
	"github.com/switchyard-dev/switchyard/sim/scenario"
)

// TestSuiteTiny runs the suite of examples/sim/suite shrunk to 12 s per
// scenario and checks the table's structure — a row per scenario and
// policy, a verdict per criterion per scenario — not whether the criteria
// pass.
func TestSuiteTiny(t *testing.T) {
	files, err := Files([]string{"../../examples/sim/suite"})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 10 {
		t.Fatalf("%d scenario files in the suite, want ≥ 10", len(files))
	}
	var scs []*scenario.Scenario
	for _, f := range files {
		sc, err := scenario.LoadScenario(f)
		if err != nil {
			t.Fatal(err)
		}
		sc.DurationS, sc.WarmupS, sc.DrainS = 12, 3, 20
		scs = append(scs, sc)
	}
	var done int
	outs, err := Run(context.Background(), scs, Options{Sim: sim.Options{Parallel: 2, CalibrationRequests: 200},
		Done: func(k, n int, o *Outcome) { done++ }})
	if err != nil {
		t.Fatal(err)
	}
	if done != len(scs) || len(outs) != len(scs) {
		t.Fatalf("%d outcomes, %d Done calls for %d scenarios", len(outs), done, len(scs))
	}
	var b bytes.Buffer
	if err := WriteSuite(&b, outs); err != nil {
		t.Fatal(err)
	}
	text := b.String()
	lines := strings.Split(text, "\n")
	if got := strings.Fields(lines[0]); strings.Join(got, " ") != "scenario load policy e2e mean e2e p99 vs LB goodput kv hit remap/upd" {
		t.Fatalf("header %q", lines[0])
	}
	policies := sim.PolicyNames()
	for k, o := range outs {
		for p, name := range policies {
			row := strings.Fields(lines[1+k*len(policies)+p])
			if p == 0 {
				row = row[2:] // scenario and load
			}
			if len(row) != 7 || row[0] != name {
				t.Fatalf("scenario %s policy %s: row %q", o.Report.Scenario, name, lines[1+k*len(policies)+p])
			}
		}
		if len(o.Verdicts) != 5 {
			t.Fatalf("%s: %d verdicts, want 5", o.Report.Scenario, len(o.Verdicts))
		}
		for _, v := range o.Verdicts {
			if v.Reason == "" || strings.Contains(v.Reason, "NaN") {
				t.Fatalf("%s: criterion %s without a reason: %+v", o.Report.Scenario, v.Criterion, v)
			}
		}
		mark := "FAIL "
		if Passed(o.Verdicts) {
			mark = "PASS "
		}
		if !strings.Contains(text, "\n"+mark+o.Report.Scenario+"\n") {
			t.Fatalf("no %s line for %s", mark, o.Report.Scenario)
		}
	}
	if !strings.Contains(text, " of "+strconv.Itoa(len(outs))+" scenarios pass every criterion") {
		t.Fatal("no summary line")
	}
}

// TestJudge checks each criterion's limit on a constructed report.
func TestJudge(t *testing.T) {
	rep := func(sub sim.Result) *sim.Report {
		return &sim.Report{Order: []string{"round-robin", "prefix-affinity", Subject}, Policies: map[string]sim.Result{
			"round-robin":     {E2EMeanMs: 1000, E2EP99Ms: 5000, Goodput: 0.99, KVHitRate: 0.1},
			"prefix-affinity": {E2EMeanMs: 900, E2EP99Ms: 6000, Goodput: 0.98, KVHitRate: 0.6},
			Subject:           sub,
		}}
	}
	good := sim.Result{E2EMeanMs: 918, E2EP99Ms: 5250, Goodput: 0.985, KVHitRate: 0.57, WeightUpdates: 10, KeysRemappedPerUpdate: 0.02}
	if vs := Judge(rep(good)); !Passed(vs) {
		t.Fatalf("at the limits: %+v", vs)
	}
	for _, c := range []struct {
		criterion string
		bad       func(r *sim.Result)
	}{
		{"e2e mean", func(r *sim.Result) { r.E2EMeanMs = 919 }},
		{"e2e p99", func(r *sim.Result) { r.E2EP99Ms = 5251 }},
		{"goodput", func(r *sim.Result) { r.Goodput = 0.9849 }},
		{"kv hit", func(r *sim.Result) { r.KVHitRate = 0.5699 }},
		{"remap", func(r *sim.Result) { r.KeysRemappedPerUpdate = 0.0201 }},
		{"e2e mean", func(r *sim.Result) { r.E2EMeanMs = math.NaN() }},
	} {
		r := good
		c.bad(&r)
		for _, v := range Judge(rep(r)) {
			if (v.Criterion == c.criterion) == v.Pass {
				t.Errorf("%s broken: %s judged %v (%s)", c.criterion, v.Criterion, v.Pass, v.Reason)
			}
		}
	}
}
