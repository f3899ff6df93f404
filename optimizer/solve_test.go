package optimizer

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func solve(t *testing.T, p *Problem, prev *Solution, opt Options) *Solution {
	t.Helper()
	sol, err := NewSolver(opt).Solve(p, prev)
	if err != nil {
		t.Fatal(err)
	}
	return sol
}

func TestCaseStudy(t *testing.T) {
	p := caseStudy()
	sol := solve(t, p, nil, DefaultOptions())
	if !sol.Diagnostics.Converged {
		t.Fatalf("not converged: %+v", sol.Diagnostics)
	}
	for _, e := range sol.Engines {
		if e.Utilisation >= 1 {
			t.Errorf("engine %s at utilisation %g", e.Name, e.Utilisation)
		}
	}
	b := &sol.Clusters[1]
	toA, toC := b.Weight(0)*b.DemandRPS, b.Weight(2)*b.DemandRPS
	if toC < 20 || toC <= toA {
		t.Errorf("B sends %.3f req/s to engine-c and %.3f to engine-a; want at least 20 to engine-c and more than to engine-a", toC, toA)
	}
	nearest, err := PolicyByName("nearest", DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	ns, err := nearest.Solve(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !(sol.MeanLatencyMs < ns.MeanLatencyMs) {
		t.Errorf("optimal mean latency %g not below nearest's %g", sol.MeanLatencyMs, ns.MeanLatencyMs)
	}
	for _, c := range sol.Clusters {
		sum := c.ShedFraction
		for _, w := range c.Weights {
			sum += w
		}
		if math.Abs(sum-1) > 1e-9 {
			t.Errorf("cluster %s: weights and shed sum to %g", c.Name, sum)
		}
	}
}

func TestShedByPriority(t *testing.T) {
	for _, kind := range []string{"queue", "points"} {
		t.Run(kind, func(t *testing.T) {
			var prof Profile = QueueProfile{BaseMs: 400}
			if kind == "points" {
				pp, err := NewPointsProfile([][2]float64{{0, 400}, {50, 450}, {100, 900}})
				if err != nil {
					t.Fatal(err)
				}
				prof = pp
			}
			// Capacity 200, demand 300: 100 req/s must be shed, sheddable (60) first, then 40
			// of standard (120), no critical (120).
			p := &Problem{
				Clusters: []Cluster{
					{Name: "A", Demand: [3]float64{Critical: 60, Standard: 60, Sheddable: 30}},
					{Name: "B", Demand: [3]float64{Critical: 60, Standard: 60, Sheddable: 30}},
				},
				Engines: []Engine{
					{Name: "e1", CapacityRPS: 100, Health: 1, Profile: prof},
					{Name: "e2", CapacityRPS: 100, Health: 1, Profile: prof},
				},
				Network: [][]Link{{{0, 1}, {1, 5}}, {{0, 5}, {1, 1}}},
			}
			sol := solve(t, p, nil, DefaultOptions())
			var shed [NumPriorities]float64
			for _, c := range sol.Clusters {
				for q := range shed {
					shed[q] += c.ShedByPriority[q]
				}
			}
			// Queue latency diverges at capacity: the engines stop where the marginal cost
			// reaches the standard shed price, within 0.3% of capacity.
			tol := 1e-6
			if kind == "queue" {
				tol = 0.003 * 200
			}
			if math.Abs(sol.ShedRPS-100) > tol {
				t.Errorf("total shed %g, want 100 (±%g)", sol.ShedRPS, tol)
			}
			if math.Abs(shed[Sheddable]-60) > 1e-6 || shed[Critical] > 1e-6 || math.Abs(shed[Standard]-40) > tol {
				t.Errorf("shed by priority %v, want sheddable 60, standard 40, critical 0", shed)
			}
		})
	}
}

// moved returns the fraction of traffic whose engine changed between two solutions.
func moved(a, b *Solution) float64 {
	mv, total := 0.0, 0.0
	for i := range b.Clusters {
		for k := range b.Clusters[i].Weights {
			mv += math.Abs(b.Clusters[i].FlowsRPS[k] - a.Clusters[i].Weights[k]*b.Clusters[i].DemandRPS)
		}
		total += b.Clusters[i].DemandRPS
	}
	return mv / 2 / total
}

func TestStability(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    *Problem
	}{
		{"case-study", caseStudy()},
		{"10x100", randomProblem(3, 10, 100, 100, 0.7)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opt := DefaultOptions()
			first := solve(t, tc.p, nil, opt)
			tc.p.Clusters[0].Demand[Standard] *= 1.01
			second := solve(t, tc.p, first, opt)
			if m := moved(first, second); m > 0.012 {
				t.Errorf("1%% demand change in one cluster moved %.2f%% of traffic", 100*m)
			}
			for i := range tc.p.Clusters {
				tc.p.Clusters[i].Demand[Standard] *= 0.99
			}
			third := solve(t, tc.p, second, opt)
			if m := moved(second, third); m > 0.012 {
				t.Errorf("1%% demand change in every cluster moved %.2f%% of traffic", 100*m)
			}
		})
	}
}

func TestDeterminism(t *testing.T) {
	p := randomProblem(5, 20, 50, 50, 0.8)
	a := solve(t, p, nil, DefaultOptions())
	b := solve(t, p, nil, DefaultOptions())
	for i := range a.Clusters {
		for k := range a.Clusters[i].Weights {
			if math.Float64bits(a.Clusters[i].Weights[k]) != math.Float64bits(b.Clusters[i].Weights[k]) {
				t.Fatalf("cluster %d weight %d differs: %v vs %v", i, k, a.Clusters[i].Weights[k], b.Clusters[i].Weights[k])
			}
		}
	}
}

func TestEdgeCases(t *testing.T) {
	q := QueueProfile{BaseMs: 100}
	tests := []struct {
		name  string
		p     *Problem
		check func(t *testing.T, s *Solution)
	}{
		{"zero demand", &Problem{
			Clusters: []Cluster{{Name: "A"}},
			Engines:  []Engine{{Name: "e", CapacityRPS: 10, Health: 1, Profile: q}},
			Network:  [][]Link{{{0, 1}}},
		}, func(t *testing.T, s *Solution) {
			if s.Engines[0].LoadRPS != 0 || s.ShedRPS != 0 || s.Clusters[0].Weights[0] != 0 {
				t.Errorf("zero demand routed or shed: %+v", s)
			}
		}},
		{"zero capacity engine", &Problem{
			Clusters: []Cluster{{Name: "A", Demand: [3]float64{Standard: 5}}},
			Engines:  []Engine{{Name: "dead", CapacityRPS: 0, Health: 1, Profile: q}, {Name: "e", CapacityRPS: 10, Health: 1, Profile: q}},
			Network:  [][]Link{{{0, 0}, {1, 50}}},
		}, func(t *testing.T, s *Solution) {
			if s.Engines[0].LoadRPS != 0 || math.Abs(s.Engines[1].LoadRPS-5) > 1e-9 {
				t.Errorf("loads %+v", s.Engines)
			}
		}},
		{"no eligible engine", &Problem{
			Clusters: []Cluster{{Name: "A", Demand: [3]float64{Standard: 5}}, {Name: "B", Demand: [3]float64{Standard: 5}}},
			Engines:  []Engine{{Name: "e", CapacityRPS: 10, Health: 1, Profile: q}},
			Network:  [][]Link{nil, {{0, 1}}},
		}, func(t *testing.T, s *Solution) {
			if s.Clusters[0].ShedFraction != 1 {
				t.Errorf("A shed %g, want 1", s.Clusters[0].ShedFraction)
			}
			if !strings.Contains(strings.Join(s.Diagnostics.Notes, "\n"), "cluster A has no eligible engine: all shed") {
				t.Errorf("notes %q lack the no-eligible-engine note", s.Diagnostics.Notes)
			}
		}},
		{"health", &Problem{
			Clusters: []Cluster{{Name: "A", Demand: [3]float64{Standard: 60}}},
			Engines:  []Engine{{Name: "sick", CapacityRPS: 100, Health: 0.5, Profile: q}, {Name: "well", CapacityRPS: 100, Health: 1, Profile: q}},
			Network:  [][]Link{{{0, 1}, {1, 1}}},
		}, func(t *testing.T, s *Solution) {
			// Equal marginal cost b/(1-x/C)^2 means equal utilisation: 20 and 40.
			if math.Abs(s.Engines[0].LoadRPS-20) > 1e-3 || math.Abs(s.Engines[1].LoadRPS-40) > 1e-3 {
				t.Errorf("loads %g and %g, want 20 and 40", s.Engines[0].LoadRPS, s.Engines[1].LoadRPS)
			}
		}},
		{"health zero", &Problem{
			Clusters: []Cluster{{Name: "A", Demand: [3]float64{Critical: 5}}},
			Engines:  []Engine{{Name: "e", CapacityRPS: 10, Health: 0, Profile: q}},
			Network:  [][]Link{{{0, 1}}},
		}, func(t *testing.T, s *Solution) {
			if s.Clusters[0].ShedFraction != 1 {
				t.Errorf("shed %g, want 1", s.Clusters[0].ShedFraction)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := solve(t, tc.p, nil, DefaultOptions())
			if !s.Diagnostics.Converged {
				t.Errorf("not converged: %+v", s.Diagnostics)
			}
			tc.check(t, s)
		})
	}
}

func TestValidate(t *testing.T) {
	q := QueueProfile{BaseMs: 100}
	base := func() *Problem {
		return &Problem{
			Clusters: []Cluster{{Name: "A", Demand: [3]float64{Standard: 5}}},
			Engines:  []Engine{{Name: "e", CapacityRPS: 10, Health: 1, Profile: q}},
			Network:  [][]Link{{{0, 1}}},
		}
	}
	tests := []struct {
		name   string
		modify func(p *Problem)
		want   error
		field  string
	}{
		{"nan demand", func(p *Problem) { p.Clusters[0].Demand[Critical] = math.NaN() }, ErrNotFinite, "clusters[0].demand_by_priority.critical"},
		{"negative capacity", func(p *Problem) { p.Engines[0].CapacityRPS = -1 }, ErrNegative, "engines[0].capacity_rps"},
		{"health above 1", func(p *Problem) { p.Engines[0].Health = 2 }, ErrOutOfRange, "engines[0].health"},
		{"bad name", func(p *Problem) { p.Engines[0].Name = "a.b" }, ErrInvalidName, "engines[0].name"},
		{"duplicate", func(p *Problem) { p.Clusters = append(p.Clusters, p.Clusters[0]); p.Network = append(p.Network, nil) }, ErrDuplicateName, "clusters[1].name"},
		{"unknown engine", func(p *Problem) { p.Network[0][0].Engine = 3 }, ErrUnknownEngine, "network_ms.A[0]"},
		{"zero capacity", func(p *Problem) { p.Engines[0].CapacityRPS = 0 }, ErrNoCapacity, "network_ms.A"},
		{"bad profile", func(p *Problem) { p.Engines[0].Profile = QueueProfile{} }, ErrBadProfile, "engines[0].profile"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := base()
			tc.modify(p)
			err := p.Validate()
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			var fe *FieldError
			if !errors.As(err, &fe) || !strings.HasPrefix(fe.Field, tc.field) {
				t.Errorf("error %v does not name field %s", err, tc.field)
			}
		})
	}
}

func TestWarmStartMatchesByName(t *testing.T) {
	p := caseStudy()
	first := solve(t, p, nil, DefaultOptions())
	// Reverse the engines: the warm start must match them by name.
	q := caseStudy()
	q.Engines[0], q.Engines[2] = q.Engines[2], q.Engines[0]
	for i := range q.Network {
		for k := range q.Network[i] {
			q.Network[i][k].Engine = 2 - q.Network[i][k].Engine
		}
		r := q.Network[i]
		r[0], r[2] = r[2], r[0]
	}
	second := solve(t, q, first, DefaultOptions())
	if m := math.Abs(second.Engines[2].LoadRPS - first.Engines[0].LoadRPS); m > 0.01 {
		t.Errorf("engine-a load %g after reordering, %g before", second.Engines[2].LoadRPS, first.Engines[0].LoadRPS)
	}
	if second.Diagnostics.Iterations > first.Diagnostics.Iterations {
		t.Errorf("warm start took %d sweeps, cold %d", second.Diagnostics.Iterations, first.Diagnostics.Iterations)
	}
}

// TestDiagnosticsPath: every solve names the path that answered — the level
// solver on small problems, the Newton path first above 20 clusters, sweeps
// alone for the equilibrium baseline — and the report carries it.
func TestDiagnosticsPath(t *testing.T) {
	valid := map[string]bool{}
	for _, p := range []string{PathLevels, PathNewton, PathAuction} {
		valid[p], valid[p+"+"+PathSweeps] = true, true
	}
	valid[PathSweeps] = true
	s := NewSolver(DefaultOptions())
	for _, c := range []struct {
		name   string
		p      *Problem
		prefix string
	}{
		{"case study", caseStudy(), PathLevels},
		{"30 clusters", randomProblem(3, 30, 40, 6, 0.7), PathNewton},
		// The level solver does not settle cold on this small overloaded problem: the chain
		// goes on to the Newton path and then to the auction, whose point the sweeps finish.
		{"small overloaded", randomProblem(1, 3, 5, 5, 1.2), PathAuction},
		{"overloaded", overloaded(5, 30, 40, 1.3), ""},
	} {
		sol, err := s.Solve(c.p, nil)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		path := sol.Diagnostics.Path
		if !valid[path] || !strings.HasPrefix(path, c.prefix) {
			t.Errorf("%s: path %q, want a valid path starting with %q", c.name, path, c.prefix)
		}
		if got := sol.Report().Diagnostics.Path; got != path {
			t.Errorf("%s: report path %q, want %q", c.name, got, path)
		}
	}
	pol, err := PolicyByName("least-latency", DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	eq, err := pol.Solve(caseStudy(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if eq.Diagnostics.Path != PathSweeps {
		t.Errorf("equilibrium path %q, want %q", eq.Diagnostics.Path, PathSweeps)
	}
}
