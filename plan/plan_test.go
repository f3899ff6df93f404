package plan

import (
	"math"
	"testing"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/optimizer"
)

func TestDemand(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    *messages.DemandState
		want [optimizer.NumPriorities]float64
	}{
		{"none", nil, [optimizer.NumPriorities]float64{optimizer.Standard: 1}},
		{"zero", &messages.DemandState{}, [optimizer.NumPriorities]float64{optimizer.Standard: 1}},
		{"total", &messages.DemandState{RPS: messages.Window{Fast: 30, Slow: 5}}, [optimizer.NumPriorities]float64{optimizer.Standard: 30}},
		{"by priority", &messages.DemandState{RPS: messages.Window{Fast: 30}, RPSByPriority: map[string]messages.Window{
			messages.PriorityCritical: {Fast: 10}, messages.PrioritySheddable: {Fast: 20}}},
			[optimizer.NumPriorities]float64{optimizer.Critical: 10, optimizer.Sheddable: 20}},
		{"raised to the floor", &messages.DemandState{RPSByPriority: map[string]messages.Window{
			messages.PriorityCritical: {Fast: 0.1}, messages.PriorityStandard: {Fast: 0.4}}},
			[optimizer.NumPriorities]float64{optimizer.Critical: 0.2, optimizer.Standard: 0.8}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Demand(tc.d, 1)
			for q := range got {
				if math.Abs(got[q]-tc.want[q]) > 1e-12 {
					t.Fatalf("Demand = %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestProblem(t *testing.T) {
	rtt := map[[2]string]float64{{"c1", "a"}: 5, {"c1", "b"}: 40, {"c2", "b"}: 3}
	in := Input{
		Engines: []Engine{
			{Name: "a", CapacityRPS: 100, Health: 1, BaseMs: 700},
			{Name: "down", CapacityRPS: 100, Health: 0, BaseMs: 700},
			{Name: "b", CapacityRPS: 50, Health: 0.5, BaseMs: 900},
		},
		Clusters: []Cluster{{Name: "c1", Demand: &messages.DemandState{RPS: messages.Window{Fast: 60}}}, {Name: "c2"}},
		Network: func(c, e string) (float64, bool) {
			ms, ok := rtt[[2]string{c, e}]
			return ms, ok
		},
		Targets:      Targets{Common: 0.9, PerEngine: map[string]float64{"b": 0.8}},
		MinDemandRPS: 1,
	}
	p := Problem(in)
	for _, tc := range []struct {
		what      string
		got, want any
	}{
		{"engines", len(p.Engines), 2},
		{"a's capacity", p.Engines[0].CapacityRPS, 90.0},
		{"b's capacity", p.Engines[1].CapacityRPS, 40.0},
		{"b's health", p.Engines[1].Health, 0.5},
		{"b's base", p.Engines[1].Profile.(optimizer.QueueProfile).BaseMs, 900.0},
		{"clusters", len(p.Clusters), 2},
		{"c1's demand", p.Clusters[0].Demand[optimizer.Standard], 60.0},
		{"c2's demand (the floor)", p.Clusters[1].Demand[optimizer.Standard], 1.0},
		{"c1's links", len(p.Network[0]), 2},
		{"c2's links", len(p.Network[1]), 1},
		{"c2's link engine", p.Network[1][0], optimizer.Link{Engine: 1, Ms: 3}},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %v, want %v", tc.what, tc.got, tc.want)
		}
	}
	if err := p.Validate(); err != nil {
		t.Fatalf("problem does not validate: %v", err)
	}
}

func TestSnapshot(t *testing.T) {
	p := &optimizer.Problem{
		Engines:  []optimizer.Engine{{Name: "a", CapacityRPS: 10, Health: 1}, {Name: "b", CapacityRPS: 10, Health: 1}},
		Clusters: []optimizer.Cluster{{Name: "c", Demand: [optimizer.NumPriorities]float64{optimizer.Standard: 8, optimizer.Sheddable: 4}}},
		Network:  [][]optimizer.Link{{{Engine: 0, Ms: 2}, {Engine: 1, Ms: 10}}},
	}
	sol := &optimizer.Solution{
		Engines: []optimizer.EngineResult{{Utilisation: 0.9, LatencyMs: 100}, {Utilisation: 0.4, LatencyMs: math.Inf(1)}},
		Clusters: []optimizer.ClusterResult{{Name: "c", Engines: []int{0, 1}, Weights: []float64{0.6, 0.3}, ShedFraction: 0.1,
			ShedRPS: 1.2, DemandRPS: 12, ShedByPriority: [optimizer.NumPriorities]float64{optimizer.Sheddable: 1.2}}},
		Diagnostics: optimizer.Diagnostics{RelGap: math.NaN()},
	}
	snap := Snapshot("m", p, sol, 0, Targets{Common: 0.9, PerEngine: map[string]float64{"b": 0.45}})
	for _, tc := range []struct {
		what      string
		got, want float64
	}{
		{"a's weight", snap.Weights["a"], 0.6},
		{"b's weight", snap.Weights["b"], 0.3},
		{"shed", snap.ShedFraction, 0.1},
		{"a's utilisation", snap.Utilisation["a"], 0.9},
		{"b's utilisation, relative to the common target", snap.Utilisation["b"], 0.2},
		{"a's latency", snap.LatencyMs["a"], 102},
		{"sheddable shed", snap.ShedByPriority["sheddable"], 0.3},
		{"gap without a certificate", snap.Gap, 1},
		{"demand", snap.DemandRPS, 12},
	} {
		if math.Abs(tc.got-tc.want) > 1e-9 {
			t.Errorf("%s = %v, want %v", tc.what, tc.got, tc.want)
		}
	}
	if _, ok := snap.LatencyMs["b"]; ok {
		t.Errorf("b's infinite latency is in the snapshot: %v", snap.LatencyMs)
	}
	if _, ok := snap.ShedByPriority["standard"]; !ok {
		t.Errorf("a class with demand has no shed fraction: %v", snap.ShedByPriority)
	}
}

func TestFitSampleAndBase(t *testing.T) {
	st := &messages.EngineState{Time: 42, CapacityRPS: 20, Health: 0.5, LoadRPS: messages.Window{Slow: 3},
		TTFTMs: messages.Window{Slow: 50}, TBTMs: messages.Window{Slow: 20}, OutputTokens: messages.Window{Slow: 11}}
	if s := FitSample(st); s.CapacityRPS != 10 || s.TimeMs != 42 || s.LoadRPS != 3 || s.LatencyMs() != 270 {
		t.Errorf("FitSample = %+v (latency %v), want capacity 10, time 42, load 3, latency 270", s, s.LatencyMs())
	}
	for _, tc := range []struct {
		name string
		base float64
		want float64
	}{
		{"prior", 0, 500},
		{"own idle latency", 800, 800},
	} {
		st := &messages.EngineState{BaseLatencyMs: tc.base}
		if got := BaseMs(nil, st, 500); got != tc.want {
			t.Errorf("%s: BaseMs = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestDistance(t *testing.T) {
	a := &messages.WeightSnapshot{Weights: map[string]float64{"x": 0.5, "y": 0.5}}
	b := &messages.WeightSnapshot{Weights: map[string]float64{"x": 0.4, "z": 0.5}, ShedFraction: 0.1}
	tv, flip := Distance(a, b)
	if math.Abs(tv-0.6) > 1e-12 || !flip {
		t.Errorf("distance %v flip %v, want 0.6 true", tv, flip)
	}
	if tv, flip := Distance(a, a); tv != 0 || flip {
		t.Errorf("distance to itself %v %v", tv, flip)
	}
}
