package stack

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

func TestDefaultIsTheCaseStudy(t *testing.T) {
	f := Default()
	if len(f.Clusters) != 3 || len(f.Engines) != 3 {
		t.Fatalf("default stack has %d clusters and %d engines", len(f.Clusters), len(f.Engines))
	}
	want := map[string]float64{"A": 90, "B": 120, "C": 40, "engine-a": 100, "engine-b": 100, "engine-c": 80}
	for _, c := range f.Clusters {
		if want[c.Name] != c.DemandRPS {
			t.Errorf("cluster %s demand %v", c.Name, c.DemandRPS)
		}
	}
	for _, e := range f.Engines {
		if want[e.Name] != e.CapacityRPS {
			t.Errorf("engine %s capacity %v", e.Name, e.CapacityRPS)
		}
	}
	if f.NetworkMs("r1", "r1") != 1 || f.NetworkMs("r1", "r2") != 5 {
		t.Errorf("network: %+v", f.Network)
	}
}

func TestExampleMatchesBuiltIn(t *testing.T) {
	data, err := os.ReadFile("../examples/stack.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, DefaultFileBytes()) {
		t.Fatal("examples/stack.yaml differs from the built-in stack/case-study.yaml; keep them identical")
	}
}

func TestParseErrorsNameTheField(t *testing.T) {
	base := string(DefaultFileBytes())
	cases := []struct{ name, from, to, want string }{
		{"bad model", "model: llama", "model: llama.3", "model"},
		{"negative demand", "demand_rps: 90", "demand_rps: -90", "clusters[0].demand_rps"},
		{"zero capacity", "capacity_rps: 80", "capacity_rps: 0", "engines[2].capacity_rps"},
		{"dotted engine", "name: engine-b", "name: engine.b", "engines[1].name"},
		{"duplicate", "name: engine-c", "name: engine-a", "already used"},
		{"unknown key", "model: llama", "model: llama\nbogus: 1", "bogus"},
		{"not a number", "demand_rps: 40", "demand_rps: lots", "lots"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := strings.Replace(base, c.from, c.to, 1)
			if src == base {
				t.Fatalf("replacement %q not applied", c.from)
			}
			_, err := Parse("x.yaml", []byte(src))
			if !errors.Is(err, ErrStack) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "x.yaml") {
				t.Fatalf("got %v, want an ErrStack naming x.yaml and %q", err, c.want)
			}
		})
	}
}

func TestDelayFrom(t *testing.T) {
	f := Default()
	d := f.DelayFrom("B")
	if d("engine-b") != time.Millisecond || d("engine-a") != 5*time.Millisecond || d("nope") != 0 {
		t.Fatalf("delays from B: %s %s %s", d("engine-b"), d("engine-a"), d("nope"))
	}
	if f.DelayFrom("Z") != nil {
		t.Fatal("a delay function for a cluster not in the stack")
	}
}
