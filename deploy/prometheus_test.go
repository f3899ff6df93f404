package deploy_test

import (
	"context"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"
	"go.yaml.in/yaml/v3"

	"github.com/switchyard-dev/switchyard/stack"
	"github.com/switchyard-dev/switchyard/testenv"
)

const (
	rulesFile  = "prometheus/switchyard.rules.yml"
	metricsDoc = "../docs/metrics.md"
)

var (
	// codeName is a metric name as a Go string literal.
	codeName = regexp.MustCompile(`"(switchyard_[a-z0-9_]+)"`)
	// poisonComponent is a poison.Options component, which names
	// switchyard_<component>_handler_panics_total.
	poisonComponent = regexp.MustCompile(`poison\.Options\{Component:\s*"([a-z]+)"`)
	// docRow is a metric's row in docs/metrics.md: name and type.
	docRow = regexp.MustCompile("(?m)^\\| `(switchyard_[a-z0-9_]+)` \\| ([a-z]+) \\|")
	// promIdent is a PromQL identifier (metric, recording rule, label or function name).
	promIdent = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	// quoted is a PromQL string.
	quoted = regexp.MustCompile(`"[^"]*"`)
)

// codeMetrics returns the metric names the non-test Go code registers.
func codeMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range codeName.FindAllSubmatch(src, -1) {
			names[string(m[1])] = true
		}
		for _, m := range poisonComponent.FindAllSubmatch(src, -1) {
			names["switchyard_"+string(m[1])+"_handler_panics_total"] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// docMetrics returns the metrics docs/metrics.md lists, with their types.
func docMetrics(t *testing.T) map[string]string {
	t.Helper()
	doc, err := os.ReadFile(metricsDoc)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, m := range docRow.FindAllSubmatch(doc, -1) {
		out[string(m[1])] = string(m[2])
	}
	return out
}

// TestMetricsDocMatchesCode checks that docs/metrics.md lists every metric
// the code registers and no other, so that the rules checked against it
// below name real metrics.
func TestMetricsDocMatchesCode(t *testing.T) {
	code, doc := codeMetrics(t), docMetrics(t)
	if len(code) < 50 {
		t.Fatalf("found %d metric names in the code; the scan is broken", len(code))
	}
	for n := range code {
		if _, ok := doc[n]; !ok {
			t.Errorf("%s is registered by the code but not listed in docs/metrics.md", n)
		}
	}
	for n := range doc {
		if !code[n] {
			t.Errorf("docs/metrics.md lists %s, which no code registers", n)
		}
	}
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Record string `yaml:"record"`
			Alert  string `yaml:"alert"`
			Expr   string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// ruleMetrics returns the switchyard_ metrics the rules' expressions read
// (a histogram's _bucket, _sum and _count as the histogram) and fails on a
// recording rule read but not defined.
func ruleMetrics(t *testing.T, doc map[string]string) []string {
	t.Helper()
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.Unmarshal(data, &rf); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	recorded := map[string]bool{}
	var exprs []string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded[r.Record] = true
			}
			exprs = append(exprs, r.Expr)
		}
	}
	seen := map[string]bool{}
	for _, e := range exprs {
		e = quoted.ReplaceAllString(e, `""`) // label values are no names
		for _, id := range promIdent.FindAllString(e, -1) {
			switch {
			case strings.Contains(id, ":"):
				if !recorded[id] {
					t.Errorf("%s reads the recording rule %s, which it does not define", rulesFile, id)
				}
			case strings.HasPrefix(id, "switchyard_"):
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if base, ok := strings.CutSuffix(id, suffix); ok && doc[base] == "histogram" {
						id = base
					}
				}
				seen[id] = true
			}
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	slices.Sort(names)
	if len(names) < 5 {
		t.Fatalf("%s reads %d switchyard metrics: %v; the scan is broken", rulesFile, len(names), names)
	}
	return names
}

// eventOnly are metrics the rules read that a stack exports only once
// their event happened (a vector's first child): they are checked against
// docs/metrics.md and the code, not against an idle stack's /metrics.
var eventOnly = map[string]string{
	"switchyard_router_retries_suppressed_total": "a retry refused",
	"switchyard_router_engine_ejected":           "an engine ejected",
}

// TestRulesReadRealMetrics checks every metric the Prometheus rules read:
// it is listed in docs/metrics.md (and so registered by the code, see
// above), and a running stack serving a request per router exports it —
// router series with the cluster label the rules group by.
func TestRulesReadRealMetrics(t *testing.T) {
	doc := docMetrics(t)
	names := ruleMetrics(t, doc)
	for _, n := range names {
		if _, ok := doc[n]; !ok {
			t.Errorf("%s reads %s, which docs/metrics.md does not list", rulesFile, n)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	reg := prometheus.NewRegistry()
	s, err := stack.Start(ctx, stack.Options{DataDir: t.TempDir(), NATSPort: -1, RouterAddr: "127.0.0.1:0", Logger: zerolog.Nop(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i, r := range s.Routers() {
		testenv.WaitFor(t, 20*time.Second, "a chat request through the router of cluster "+s.File().Clusters[i].Name+" answers 200", func() bool { return testenv.ChatStatus("http://"+r.Addr(), "llama") == http.StatusOK })
	}
	gather := prometheus.Gatherers{reg, s.Gatherer()}
	// exported returns, per metric name, whether every series has a cluster label.
	exported := func() map[string]bool {
		fams, err := gather.Gather()
		if err != nil {
			t.Fatalf("gather the stack's metrics: %v", err)
		}
		out := map[string]bool{}
		for _, f := range fams {
			all := true
			for _, m := range f.GetMetric() {
				all = all && slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == "cluster" })
			}
			out[f.GetName()] = all
		}
		return out
	}
	// Poll until the stack exports them all (a snapshot's age once one is
	// installed); then name what is missing.
	var got map[string]bool
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got = exported()
		var missing []string
		for _, n := range names {
			if _, ok := got[n]; !ok && eventOnly[n] == "" {
				missing = append(missing, n)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a running stack does not export %v, which %s reads", missing, rulesFile)
		}
	}
	for _, n := range names {
		why, event := eventOnly[n]
		_, ok := got[n]
		switch {
		case event && !ok:
			t.Logf("%s: exported after %s; checked against docs/metrics.md and the code", n, why)
		case strings.HasPrefix(n, "switchyard_router_") && !got[n]:
			t.Errorf("%s: a series without the cluster label the rules group by", n)
		}
	}
}
