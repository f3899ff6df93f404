package optimizer

import (
	"math"
	"testing"
)

// regionsProblem: three clusters in region x and one in y; four equal
// engines in x and two in y. The x clusters' rows agree, as do the columns
// of each region's engines, so the objective leaves their split open.
func regionsProblem(load float64) *Problem {
	q := QueueProfile{BaseMs: 400}
	p := &Problem{}
	region := []string{"x", "x", "x", "x", "y", "y"}
	for j, r := range region {
		p.Engines = append(p.Engines, Engine{Name: "e" + itoa(j) + r, CapacityRPS: 100, Health: 1, Profile: q})
	}
	clusters := []struct {
		name, region string
		demand       float64
	}{{"x1", "x", 120}, {"x2", "x", 90}, {"x3", "x", 150}, {"y1", "y", 60}}
	for _, c := range clusters {
		p.Clusters = append(p.Clusters, Cluster{Name: c.name, Demand: [NumPriorities]float64{Standard: load * c.demand}})
		row := make([]Link, len(region))
		for j, r := range region {
			row[j] = Link{Engine: j, Ms: 1}
			if r != c.region {
				row[j].Ms = 40
			}
		}
		p.Network = append(p.Network, row)
	}
	return p
}

// scramble moves traffic around a cycle of zero cost: x1 sends more to
// engine 0 and less to engine 1, x2 the other way round. Loads, served
// traffic and the objective stay the same.
func scramble(sol *Solution, d float64) {
	c1, c2 := &sol.Clusters[0], &sol.Clusters[1]
	d = math.Min(d, math.Min(c1.FlowsRPS[1], c2.FlowsRPS[0]))
	c1.FlowsRPS[0] += d
	c1.FlowsRPS[1] -= d
	c2.FlowsRPS[0] -= d
	c2.FlowsRPS[1] += d
	for _, c := range []*ClusterResult{c1, c2} {
		for k := range c.Weights {
			c.Weights[k] = c.FlowsRPS[k] / c.DemandRPS
		}
	}
}

// TestSplitTies: of the plans the objective leaves open, SplitTies returns
// one that depends on the loads alone — two solutions that differ only by
// a trade along a cycle of zero cost come out the same — with every
// engine's load, every cluster's served traffic and the objective as they
// were; clusters whose rows agree get the same weights, and each engine of
// a class of equal engines its share of a cluster in proportion to its
// load. A row farther from every engine by the same amount agrees.
func TestSplitTies(t *testing.T) {
	for _, shift := range []float64{0, 3} {
		for _, load := range []float64{0.1, 0.6, 0.95, 1.3} {
			t.Run("x3 +"+itoa(int(shift))+" ms, load "+itoa(int(load*100))+"%", func(t *testing.T) {
				p := regionsProblem(load)
				for k := range p.Network[2] {
					p.Network[2][k].Ms += shift
				}
				a, err := NewSolver(Options{}).Solve(p, nil)
				if err != nil {
					t.Fatal(err)
				}
				b, err := NewSolver(Options{}).Solve(p, nil)
				if err != nil {
					t.Fatal(err)
				}
				scramble(b, 5+10*load)
				loads, served, obj := make([]float64, len(p.Engines)), make([]float64, len(p.Clusters)), a.Diagnostics.Objective
				for i, cr := range a.Clusters {
					for k, j := range cr.Engines {
						loads[j] += cr.FlowsRPS[k]
						served[i] += cr.FlowsRPS[k]
					}
				}
				tol := NewSolver(Options{}).Options().Tolerance
				SplitTies(p, a, tol)
				SplitTies(p, b, tol)
				gotLoads, gotServed := make([]float64, len(p.Engines)), make([]float64, len(p.Clusters))
				for i := range a.Clusters {
					for k, j := range a.Clusters[i].Engines {
						x := a.Clusters[i].FlowsRPS[k]
						gotLoads[j] += x
						gotServed[i] += x
						if y := b.Clusters[i].FlowsRPS[k]; math.Abs(x-y) > 1e-9 {
							t.Errorf("cluster %s engine %s: %.6f req/s from one solution, %.6f from the same traded along a cycle of zero cost",
								p.Clusters[i].Name, p.Engines[j].Name, x, y)
						}
						if w := x / a.Clusters[i].DemandRPS; math.Abs(a.Clusters[i].Weights[k]-w) > 1e-12 {
							t.Errorf("cluster %s engine %s: weight %v, flow/demand %v", p.Clusters[i].Name, p.Engines[j].Name, a.Clusters[i].Weights[k], w)
						}
					}
				}
				for j := range loads {
					if math.Abs(gotLoads[j]-loads[j]) > 1e-9 {
						t.Errorf("engine %s: load %.6f, the solver's %.6f", p.Engines[j].Name, gotLoads[j], loads[j])
					}
				}
				for i := range served {
					if math.Abs(gotServed[i]-served[i]) > 1e-9 {
						t.Errorf("cluster %s: serves %.6f, the solver's plan %.6f", p.Clusters[i].Name, gotServed[i], served[i])
					}
				}
				if d := a.Diagnostics.Objective - obj; math.Abs(d) > 1e-9*math.Abs(obj) {
					t.Errorf("objective moved by %g (of %g) though every latency of the rows it split agrees", d, obj)
				}
				// x1, x2 and x3 agree: one weight vector, scaled by what each serves.
				for i := 1; i < 3; i++ {
					for k := range a.Clusters[i].Engines {
						w0 := a.Clusters[0].FlowsRPS[k] / served[0]
						wi := a.Clusters[i].FlowsRPS[k] / served[i]
						if math.Abs(w0-wi) > 1e-9 {
							t.Errorf("engine %s: %s sends it %.6f of what it serves, %s %.6f", p.Engines[k].Name, p.Clusters[0].Name, w0, p.Clusters[i].Name, wi)
						}
					}
				}
				// Engines 0-3 agree: each takes from a cluster in proportion to its load.
				for i := range a.Clusters {
					var f, x float64
					for j := 0; j < 4; j++ {
						f += a.Clusters[i].FlowsRPS[j]
						x += loads[j]
					}
					for j := 0; j < 4; j++ {
						if want := f * loads[j] / x; math.Abs(a.Clusters[i].FlowsRPS[j]-want) > 1e-9 {
							t.Errorf("cluster %s engine %s: %.6f req/s, want %.6f (its share of the region's load)", p.Clusters[i].Name, p.Engines[j].Name, a.Clusters[i].FlowsRPS[j], want)
						}
					}
				}
			})
		}
	}
}

// TestSplitTiesKeepsWhatTheObjectiveChose: a cluster whose row differs
// from the others' beyond the tolerance, or lists other engines, is not
// grouped with them: what it sends to each region, which the objective
// chose, stays, and so does the network cost of the plan.
func TestSplitTiesKeepsWhatTheObjectiveChose(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(p *Problem)
	}{
		{"x2 2 ms farther from region x", func(p *Problem) {
			for k := range 4 {
				p.Network[1][k].Ms += 2
			}
		}},
		{"x2's row without engine 5", func(p *Problem) { p.Network[1] = p.Network[1][:5] }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := regionsProblem(1.2)
			tc.modify(p)
			sol, err := NewSolver(Options{}).Solve(p, nil)
			if err != nil {
				t.Fatal(err)
			}
			byRegion := func() (x, y, cost float64) {
				for k, j := range sol.Clusters[1].Engines {
					if j < 4 {
						x += sol.Clusters[1].FlowsRPS[k]
					} else {
						y += sol.Clusters[1].FlowsRPS[k]
					}
				}
				for i := range sol.Clusters {
					for k := range sol.Clusters[i].Engines {
						cost += sol.Clusters[i].FlowsRPS[k] * p.Network[i][k].Ms
					}
				}
				return x, y, cost
			}
			x0, y0, c0 := byRegion()
			SplitTies(p, sol, 1e-4)
			x1, y1, c1 := byRegion()
			if math.Abs(x1-x0) > 1e-9 || math.Abs(y1-y0) > 1e-9 {
				t.Errorf("x2 sends %.4f / %.4f req/s to regions x / y, the solver planned %.4f / %.4f", x1, y1, x0, y0)
			}
			if math.Abs(c1-c0) > 1e-9*c0 {
				t.Errorf("network cost of the plan %.4f, the solver's %.4f", c1, c0)
			}
		})
	}
}

// BenchmarkSplitTies: the pass the service runs after every solve, on the
// sparse benchmark's shape (1000 clusters, 10,000 engines, 50 each).
func BenchmarkSplitTies(b *testing.B) {
	p := randomProblem(3, 1000, 10000, 50, 0.7)
	sol, err := NewSolver(Options{}).Solve(p, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		SplitTies(p, sol, 1e-4)
	}
}
