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
		{"bad model", "model: llama", "model: \"llama 3\"", "model"},
		{"negative demand", "demand_rps: 90", "demand_rps: -90", "clusters[0].demand_rps"},
		{"zero capacity", "capacity_rps: 80", "capacity_rps: 0", "engines[2].capacity_rps"},
		{"dotted engine", "name: engine-b", "name: engine.b", "engines[1].name"},
		{"duplicate", "name: engine-c", "name: engine-a", "already used"},
		{"engine named agent", "name: engine-b", "name: agent", `engines[1].name: "agent" is the identity name of the agent`},
		{"engine named admin", "name: engine-a", "name: admin", `engines[0].name: "admin" is the identity name of the admin`},
		{"engine named as a router", "name: engine-c", "name: router-B", `engines[2].name: "router-B" is the identity name of cluster B's router`},
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

// urlStack is the stack of engines by URL, with a model name that
// is a NATS token.
const urlStack = `model: llama
clusters:
  - {name: A, region: r1, router: "127.0.0.1:18180"}
engines:
  - {name: v1, region: r1, url: "http://127.0.0.1:18101", metrics: vllm, max_running: 8, capacity_rps: 40}
  - {name: v2, region: r1, url: "http://127.0.0.1:18102", metrics: vllm, max_running: 8, capacity_rps: 40}
`

func TestParseEnginesByURL(t *testing.T) {
	f, err := Parse("url.yaml", []byte(urlStack))
	if err != nil {
		t.Fatal(err)
	}
	if f.Simulated() != 0 || len(f.Engines) != 2 || !f.Engines[1].ByURL() || f.Engines[1].MaxRunning != 8 || f.Engines[1].Metrics != "vllm" {
		t.Fatalf("engines: %+v", f.Engines)
	}
	p, err := Options{File: f, DataDir: t.TempDir()}.Plan()
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Engines) != 0 || p.Agent == nil || len(p.Agent.Engines) != 2 {
		t.Fatalf("plan: %d simulated engines, agent %+v; want none simulated and an agent of 2", len(p.Engines), p.Agent)
	}
	if p.Optimizer == nil || p.Optimizer.ClusterRegions["A"] != "r1" {
		t.Fatalf("optimizer options: %+v; want cluster A's region r1, for the region default of engines the file does not name", p.Optimizer)
	}
	e := p.Agent.Engines[0]
	if e.Name != "v1" || e.URL != "http://127.0.0.1:18101" || e.Known.CapacityRPS != 40 || e.Known.MaxRunning != 8 || e.Region != "r1" || e.Model != "llama" {
		t.Fatalf("agent engine: %+v", e)
	}
	if _, err := Parse("url.yaml", []byte(strings.Replace(urlStack, ", max_running: 8, capacity_rps: 40}", "}", 1))); err != nil {
		t.Fatalf("an engine by URL without capacity or batch (learned by the agent): %v", err)
	}
}

func TestParseEnginesByURLErrorsNameTheField(t *testing.T) {
	cases := []struct{ name, from, to, want string }{
		{"no metrics", "metrics: vllm, max_running: 8, capacity_rps: 40}", "capacity_rps: 40}", "engines[0].metrics: missing"},
		{"unknown metrics", "metrics: vllm, max_running: 8, capacity_rps: 40}", "metrics: triton}", "engines[0].metrics"},
		{"bad url", `"http://127.0.0.1:18101"`, `"127.0.0.1:18101"`, "engines[0].url"},
		{"listen with url", "metrics: vllm, max_running: 8", "metrics: vllm, listen: 127.0.0.1:1, max_running: 8", "engines[0].listen"},
		{"negative batch", "max_running: 8", "max_running: -1", "engines[0].max_running"},
		{"bad kv endpoint", "capacity_rps: 40}", "capacity_rps: 40, kv_events: \"127.0.0.1:5557\"}", "engines[0].kv_events"},
		{"sim engine with metrics", `url: "http://127.0.0.1:18102", metrics: vllm, max_running: 8,`, "", "sim: missing, want the simulator's model: engines[1]"},
		{"typo", "max_running: 8", "max_runing: 8", "max_runing"},
		{"engine by URL named agent", "name: v2", "name: agent", `engines[1].name: "agent" is the identity name of the agent`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := strings.Replace(urlStack, c.from, c.to, 1)
			if src == urlStack {
				t.Fatalf("replacement %q not applied", c.from)
			}
			_, err := Parse("x.yaml", []byte(src))
			if !errors.Is(err, ErrStack) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an ErrStack naming %q", err, c.want)
			}
		})
	}
	// A simulated engine given a field of engines by URL is refused by name.
	src := strings.Replace(string(DefaultFileBytes()), "capacity_rps: 80}", "capacity_rps: 80, metrics: vllm}", 1)
	if _, err := Parse("x.yaml", []byte(src)); err == nil || !strings.Contains(err.Error(), "engines[2].metrics") {
		t.Fatalf("simulated engine with metrics: %v", err)
	}
}
