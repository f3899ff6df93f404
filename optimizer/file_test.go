package optimizer

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
)

func TestParseCaseStudyFile(t *testing.T) {
	data, err := os.ReadFile("../examples/case-study.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := ParseProblem("case-study.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	want := caseStudy()
	if len(p.Clusters) != 3 || len(p.Engines) != 3 {
		t.Fatalf("parsed %d clusters, %d engines", len(p.Clusters), len(p.Engines))
	}
	for i := range want.Network {
		for k := range want.Network[i] {
			if p.Network[i][k] != want.Network[i][k] {
				t.Errorf("network[%d][%d] = %v, want %v", i, k, p.Network[i][k], want.Network[i][k])
			}
		}
	}
	sol := solve(t, p, nil, DefaultOptions())
	out, err := sol.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		MeanLatencyMs *float64 `json:"mean_latency_ms"`
		Clusters      map[string]struct {
			Weights       map[string]float64 `json:"weights"`
			ShedFraction  *float64           `json:"shed_fraction"`
			MeanLatencyMs *float64           `json:"mean_latency_ms"`
		} `json:"clusters"`
		Engines map[string]struct {
			LoadRPS     *float64 `json:"load_rps"`
			Utilisation *float64 `json:"utilisation"`
			LatencyMs   *float64 `json:"latency_ms"`
		} `json:"engines"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	if doc.MeanLatencyMs == nil || len(doc.Clusters) != 3 || len(doc.Engines) != 3 {
		t.Fatalf("JSON lacks keys: %s", out)
	}
	for name, c := range doc.Clusters {
		if c.ShedFraction == nil || c.MeanLatencyMs == nil || len(c.Weights) == 0 {
			t.Errorf("cluster %s lacks keys: %s", name, out)
		}
	}
	for name, e := range doc.Engines {
		if e.LoadRPS == nil || e.Utilisation == nil || e.LatencyMs == nil {
			t.Errorf("engine %s lacks keys: %s", name, out)
		}
	}
	var b strings.Builder
	if err := WriteTable(&b, sol); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"CLUSTER", "engine-c", "policy optimal"} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, b.String())
		}
	}
}

const goodYAML = `
clusters:
  - name: A
    demand_by_priority: {critical: 10, standard: 70, sheddable: 10}
engines:
  - name: engine-a
    capacity_rps: 100
    health: 0.5
    profile: {kind: points, points: [[0, 400], [50, 450], [90, 900]]}
network_ms:
  A: {engine-a: 1}
`

func TestParseProblem(t *testing.T) {
	p, err := ParseProblem("good.yaml", []byte(goodYAML))
	if err != nil {
		t.Fatal(err)
	}
	if p.Clusters[0].Demand != [3]float64{10, 70, 10} || p.Engines[0].Health != 0.5 || p.Engines[0].Profile.Kind() != "points" {
		t.Errorf("parsed %+v", p)
	}
	jsonDoc := `{"clusters": [{"name": "A", "demand_rps": 5}], "engines": [{"name": "e", "capacity_rps": 10,
		"profile": {"kind": "queue", "base_ms": 100}}], "network_ms": {"A": {"e": 2}}}`
	p, err = ParseProblem("good.json", []byte(jsonDoc))
	if err != nil {
		t.Fatal(err)
	}
	if p.Engines[0].Health != 1 || p.Clusters[0].Demand[Standard] != 5 {
		t.Errorf("parsed %+v", p)
	}
}

func TestParseProblemErrors(t *testing.T) {
	tests := []struct {
		name, doc, field string
		want             error
	}{
		{"negative capacity", `{clusters: [{name: A, demand_rps: 1}], engines: [{name: e, capacity_rps: -3, profile: {kind: queue, base_ms: 1}}], network_ms: {A: {e: 1}}}`, "engines[0].capacity_rps", ErrNegative},
		{"nan demand", `{clusters: [{name: A, demand_rps: .nan}], engines: [], network_ms: {}}`, "clusters[0].demand_rps", ErrNotFinite},
		{"unknown engine", `{clusters: [{name: A, demand_rps: 1}], engines: [{name: e, capacity_rps: 3, profile: {kind: queue, base_ms: 1}}], network_ms: {A: {f: 1}}}`, "network_ms.A.f", ErrUnknownEngine},
		{"unknown cluster", `{clusters: [], engines: [], network_ms: {Z: {}}}`, "network_ms.Z", ErrUnknownCluster},
		{"point not a number", `{clusters: [], engines: [{name: e, capacity_rps: 3, profile: {kind: points, points: [[0, x]]}}], network_ms: {}}`, "engines[0].profile.points[0][1]", ErrWrongType},
		{"quoted number", `{clusters: [{name: A, demand_rps: "5"}], engines: [], network_ms: {}}`, "clusters[0].demand_rps", ErrWrongType},
		{"zero capacity with demand", `{clusters: [{name: A, demand_rps: 1}], engines: [{name: e, capacity_rps: 0, profile: {kind: queue, base_ms: 1}}], network_ms: {A: {e: 1}}}`, "network_ms.A", ErrNoCapacity},
		{"unknown key", `{clusters: [{name: A, demand_rps: 1, colour: red}], engines: [], network_ms: {}}`, "clusters[0].colour", ErrUnknownKey},
		{"missing key", `{clusters: [], engines: []}`, "network_ms", ErrMissingKey},
		{"bad kind", `{clusters: [], engines: [{name: e, capacity_rps: 3, profile: {kind: magic}}], network_ms: {}}`, "engines[0].profile.kind", ErrBadProfile},
		{"health above one", `{clusters: [], engines: [{name: e, capacity_rps: 3, health: 1.5, profile: {kind: queue, base_ms: 1}}], network_ms: {}}`, "engines[0].health", ErrOutOfRange},
		{"negative network", `{clusters: [{name: A, demand_rps: 1}], engines: [{name: e, capacity_rps: 3, profile: {kind: queue, base_ms: 1}}], network_ms: {A: {e: -1}}}`, "network_ms.A.e", ErrNegative},
		{"duplicate engine", `{clusters: [], engines: [{name: e, capacity_rps: 3, profile: {kind: queue, base_ms: 1}}, {name: e, capacity_rps: 3, profile: {kind: queue, base_ms: 1}}], network_ms: {}}`, "engines[1].name", ErrDuplicateName},
		{"bad name", `{clusters: [{name: "a b", demand_rps: 1}], engines: [], network_ms: {}}`, "clusters[0].name", ErrInvalidName},
		{"syntax", `{clusters: [`, "", ErrSyntax},
		{"infinite base", `{clusters: [], engines: [{name: e, capacity_rps: 3, profile: {kind: queue, base_ms: .inf}}], network_ms: {}}`, "engines[0].profile.base_ms", ErrNotFinite},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseProblem("bad.yaml", []byte(tc.doc))
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.File != "bad.yaml" || fe.Field != tc.field {
				t.Errorf("error %q: want file bad.yaml and field %q", err, tc.field)
			}
			if !strings.HasPrefix(err.Error(), "bad.yaml: ") {
				t.Errorf("error %q does not start with the file name", err)
			}
		})
	}
}

func FuzzParseProblem(f *testing.F) {
	if data, err := os.ReadFile("../examples/case-study.yaml"); err == nil {
		f.Add(data)
	}
	f.Add([]byte(goodYAML))
	f.Add([]byte(`{"clusters": [{"name": "A", "demand_rps": 5}], "engines": [{"name": "e", "capacity_rps": 10, "profile": {"kind": "queue", "base_ms": 100}}], "network_ms": {"A": {"e": 2}}}`))
	f.Add([]byte(`{clusters: [{name: A, demand_rps: .nan}], engines: [], network_ms: {}}`))
	f.Add([]byte(`a: &x [*x]`))
	f.Add([]byte(`{clusters: [], engines: [{name: e, capacity_rps: 3, profile: {kind: points, points: [[0, 1], [0, 2], [5, 1], [1e308, 1e308]]}}], network_ms: {}}`))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParseProblem("fuzz.yaml", data)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || fe.File != "fuzz.yaml" {
				t.Fatalf("error %v is not a FieldError naming the file", err)
			}
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("parsed problem does not validate: %v", err)
		}
		if len(p.Clusters)*len(p.Engines) <= 64 {
			opt := DefaultOptions()
			opt.MaxSweeps = 50
			if _, err := NewSolver(opt).Solve(p, nil); err != nil {
				t.Fatalf("solve: %v", err)
			}
		}
	})
}
