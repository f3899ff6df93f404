package guard

import (
	"math"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/protocol"
)

func TestShedFractions(t *testing.T) {
	for _, tc := range []struct {
		s    float64
		mix  [protocol.NumPriorities]float64
		want [protocol.NumPriorities]float64
	}{
		{0, [3]float64{0.2, 0.5, 0.3}, [3]float64{0, 0, 0}},
		{1.0 / 3, [3]float64{0.2, 0.5, 0.3}, [3]float64{1, (1.0/3 - 0.2) / 0.5, 0}},
		{0.1, [3]float64{0.2, 0.5, 0.3}, [3]float64{0.5, 0, 0}},
		{0.8, [3]float64{0.2, 0.5, 0.3}, [3]float64{1, 1, 1.0 / 3}},
		{0.3, [3]float64{}, [3]float64{1, 0.3, 0}},
		{0.3, [3]float64{0, 0, 1}, [3]float64{1, 1, 0.3}},
	} {
		got := ShedFractions(tc.s, tc.mix)
		for p := range got {
			if d := got[p] - tc.want[p]; d > 1e-9 || d < -1e-9 {
				t.Errorf("ShedFractions(%v, %v) = %v, want %v", tc.s, tc.mix, got, tc.want)
				break
			}
		}
	}
}

func TestFiguresOf(t *testing.T) {
	f := FiguresOf(&messages.WeightSnapshot{Weights: map[string]float64{"a": 0.6, "b": 0.2}, ShedFraction: 0.2,
		ShedByPriority: map[string]float64{"sheddable": 1, "standard": 0.1}, DemandRPS: 100,
		Utilisation: map[string]float64{"a": 0.9, "b": 0.5}, LatencyMs: map[string]float64{"a": 200, "b": 600}})
	if !f.HasShedByPriority || f.ShedByPriority != [3]float64{1, 0.1, 0} || f.DemandRPS != 100 {
		t.Fatalf("%+v", f)
	}
	if d := f.Utilisation - 0.8; d > 1e-9 || d < -1e-9 || f.Latency != 300*time.Millisecond {
		t.Fatalf("utilisation %v latency %v", f.Utilisation, f.Latency)
	}
}

func TestBudgetEarnRate(t *testing.T) {
	o := BudgetOptions{}
	for _, c := range []struct{ u, want float64 }{{0, 0.2}, {0.5, 0.2}, {0.7, 0.072}, {0.9, 0.008}, {1, 0}, {1.5, 0}} {
		if got := o.EarnRate(c.u); got-c.want > 1e-9 || c.want-got > 1e-9 {
			t.Errorf("EarnRate(%v) = %v, want %v", c.u, got, c.want)
		}
	}
}

// TestFiguresIgnoreRoundingShed checks that a solver's rounding in a
// snapshot's shed fractions neither sheds nor turns admission control on.
func TestFiguresIgnoreRoundingShed(t *testing.T) {
	f := FiguresOf(&messages.WeightSnapshot{ShedFraction: 9e-16, ShedByPriority: map[string]float64{"standard": 9e-16},
		Weights: map[string]float64{"e": 1}})
	if f.ShedFraction != 0 || f.HasShedByPriority {
		t.Fatalf("figures %+v: rounding read as shedding", f)
	}
}

func TestCapacityAllotment(t *testing.T) {
	shedding := &Figures{ShedFraction: 1.0 / 3, DemandRPS: 120}
	byPrio := &Figures{HasShedByPriority: true, ShedByPriority: [protocol.NumPriorities]float64{0.5}, DemandRPS: 80}
	cases := []struct {
		name       string
		f          *Figures
		routers    int
		slot, step float64
		p          protocol.Priority
		min        int
		want       float64
	}{
		{"no snapshot", nil, 1, 1, 0.1, protocol.PriorityStandard, 8, 0},
		{"sheds nothing", &Figures{DemandRPS: 120, Latency: time.Second}, 1, 1, 0.1, protocol.PriorityStandard, 8, 0},
		{"slot time unknown", shedding, 1, 0, 0.1, protocol.PriorityStandard, 8, 0},
		{"no demand", &Figures{ShedFraction: 0.5}, 1, 1, 0.1, protocol.PriorityStandard, 8, 0},
		// λ = 120·(2/3) = 80 req/s.
		{"sheddable: the slots alone", shedding, 1, 1, 0.1, protocol.PrioritySheddable, 8, 80},
		{"standard", shedding, 1, 1, 0.1, protocol.PriorityStandard, 8, 80 * (1 + 0.375*0.1)},
		{"critical", shedding, 1, 1, 0.1, protocol.PriorityCritical, 8, 80 * (1 + 20*0.1)},
		{"two routers share it", shedding, 2, 1, 0.1, protocol.PriorityStandard, 8, 40 * (1 + 0.375*0.1)},
		{"no step known: the slots alone", shedding, 1, 1, 0, protocol.PriorityStandard, 8, 80},
		{"at least minInFlight", shedding, 1, 0.01, 0, protocol.PriorityStandard, 8, 8},
		{"shed by priority only", byPrio, 1, 0.5, 0, protocol.PriorityStandard, 8, 40},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := CapacityAllotment(c.f, c.routers, c.slot, c.step, c.p, c.min)
			if math.Abs(got-c.want) > 1e-9 {
				t.Fatalf("CapacityAllotment = %v, want %v", got, c.want)
			}
		})
	}
	// The classes are ordered: a burst sheds sheddable requests first and
	// critical ones last.
	s := CapacityAllotment(shedding, 1, 1, 0.1, protocol.PrioritySheddable, 8)
	d := CapacityAllotment(shedding, 1, 1, 0.1, protocol.PriorityStandard, 8)
	c := CapacityAllotment(shedding, 1, 1, 0.1, protocol.PriorityCritical, 8)
	if !(s < d && d < c) {
		t.Fatalf("allotments sheddable %v, standard %v, critical %v: want increasing", s, d, c)
	}
}

func TestRelaxedShed(t *testing.T) {
	for _, tc := range []struct{ s, h, want float64 }{
		{0, 0.25, 0},
		{1.0 / 3, 0.25, 1.0 / 6},
		{0.1, 0.25, 0},   // 1.25 × 0.9 > 1: nothing shed by key
		{0.5, 0, 0.5},    // no headroom: as planned
		{1, 0.25, 1},     // nothing served stays nothing served
		{0.6, 0.5, 0.4},  // 1 − 1.5 × 0.4
		{-1, 0.25, 0},    // clamped
		{0.9, -0.5, 0.9}, // negative headroom: none
	} {
		if got := RelaxedShed(tc.s, tc.h); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("RelaxedShed(%v, %v) = %v, want %v", tc.s, tc.h, got, tc.want)
		}
	}
}

// TestAdmissionFactor: a burst sheds sheddable requests first and critical
// ones last.
func TestAdmissionFactor(t *testing.T) {
	for _, tc := range []struct {
		p    protocol.Priority
		want float64
	}{{protocol.PrioritySheddable, 0.8}, {protocol.PriorityStandard, 1}, {protocol.PriorityCritical, 1.25}} {
		if got := AdmissionFactor(tc.p); got != tc.want {
			t.Errorf("AdmissionFactor(%s) = %v, want %v", tc.p, got, tc.want)
		}
	}
}

// TestFiguresEngineLatency checks that an engine's predicted latency is the
// snapshot's where it is finite and not negative, and unknown otherwise.
func TestFiguresEngineLatency(t *testing.T) {
	f := FiguresOf(&messages.WeightSnapshot{Model: "m", Cluster: "c", Weights: map[string]float64{"a": 1, "b": 0},
		LatencyMs: map[string]float64{"a": 1500, "b": 0, "c": -1, "d": math.Inf(1), "e": math.NaN()}})
	for _, tc := range []struct {
		engine string
		want   time.Duration
		ok     bool
	}{
		{"a", 1500 * time.Millisecond, true}, {"b", 0, true}, {"c", 0, false}, {"d", 0, false}, {"e", 0, false}, {"missing", 0, false},
	} {
		if got, ok := f.EngineLatency(tc.engine); got != tc.want || ok != tc.ok {
			t.Errorf("EngineLatency(%s) = %v, %v; want %v, %v", tc.engine, got, ok, tc.want, tc.ok)
		}
	}
}
