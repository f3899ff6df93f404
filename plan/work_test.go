package plan

import (
	"math"
	"testing"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/optimizer"
)

// mixDemand is a cluster's demand state of rps requests per second of
// prompt and output tokens, with one-second variance v.
func mixDemand(rps, prompt, output, v float64) *messages.DemandState {
	return &messages.DemandState{RPS: messages.Window{Fast: rps, Slow: rps},
		PromptTPS: messages.Window{Fast: rps * prompt, Slow: rps * prompt},
		DoneRPS:   messages.Window{Fast: rps, Slow: rps}, OutputTPS: messages.Window{Fast: rps * output, Slow: rps * output},
		RPSVar: messages.Window{Fast: v, Slow: v}}
}

// workInput is two engines of 100 req/s on a mix of 500 prompt and 100
// output tokens, a near each cluster's own: a prefill-heavy code cluster
// near engine a and a chat cluster near engine b, each 40 req/s.
func workInput(requests bool) Input {
	near := map[[2]string]float64{{"code", "a"}: 1, {"code", "b"}: 20, {"chat", "a"}: 20, {"chat", "b"}: 1}
	return Input{
		Engines: []Engine{
			{Name: "a", CapacityRPS: 100, Health: 1, BaseMs: 800, PromptTokens: 500, OutputTokens: 100, PrefillWeight: 0.1},
			{Name: "b", CapacityRPS: 100, Health: 1, BaseMs: 800, PromptTokens: 500, OutputTokens: 100, PrefillWeight: 0.1},
		},
		Clusters: []Cluster{{Name: "code", Demand: mixDemand(40, 4000, 20, 0)}, {Name: "chat", Demand: mixDemand(40, 100, 150, 0)}},
		Network:  func(c, e string) (float64, bool) { ms, ok := near[[2]string{c, e}]; return ms, ok },
		Targets:  Targets{Common: 0.9}, MinDemandRPS: 1, Requests: requests,
	}
}

// realUtilisation returns each engine's load in real work over its real
// capacity in work, for the requests the snapshots send it.
func realUtilisation(t *testing.T, in Input, b *Built, sol *optimizer.Solution) map[string]float64 {
	t.Helper()
	u := map[string]float64{}
	for i, c := range in.Clusters {
		snap := b.Snapshot("m", sol, i, in.Targets)
		p, o := c.Demand.Mix()
		for e, w := range snap.Weights {
			u[e] += w * snap.DemandRPS * messages.Work(p, o, 0.1)
		}
	}
	for _, e := range in.Engines {
		u[e.Name] /= e.CapacityRPS * messages.Work(e.PromptTokens, e.OutputTokens, 0.1)
	}
	return u
}

// TestWorkPlanLoadsRealWork shows the req/s plan keeping the prefill-heavy
// cluster on its near engine, which its work overloads, and the work plan
// loading both engines with their share of the real work.
func TestWorkPlanLoadsRealWork(t *testing.T) {
	for _, tc := range []struct {
		name     string
		requests bool
		overload bool
	}{{"requests", true, true}, {"work", false, false}} {
		t.Run(tc.name, func(t *testing.T) {
			in := workInput(tc.requests)
			b := Build(in)
			if got := b.PrefillWeight > 0; got == tc.requests {
				t.Fatalf("planned in work: %v, want %v", got, !tc.requests)
			}
			sol, err := optimizer.NewSolver(optimizer.DefaultOptions()).Solve(b.Problem, nil)
			if err != nil {
				t.Fatal(err)
			}
			u := realUtilisation(t, in, b, sol)
			t.Logf("real utilisation %v", u)
			if got := u["a"] > 1; got != tc.overload {
				t.Fatalf("real utilisation %v: engine a overloaded %v, want %v", u, got, tc.overload)
			}
			if !tc.requests {
				// Total work is 23,200 of 30,000 a second: both engines near 0.77.
				for e, v := range u {
					if math.Abs(v-23200.0/30000) > 0.1 {
						t.Errorf("engine %s at real utilisation %.3f, want about %.3f (%v)", e, v, 23200.0/30000, u)
					}
				}
			}
			for i := range in.Clusters {
				if snap := b.Snapshot("m", sol, i, in.Targets); math.Abs(snap.DemandRPS-40) > 1e-9 || snap.ShedFraction > 1e-9 {
					t.Errorf("cluster %s: demand %v req/s, shed %v; want 40 req/s, no shed", snap.Cluster, snap.DemandRPS, snap.ShedFraction)
				}
			}
		})
	}
}

// TestWorkUnitsFallBack checks when the plan counts in requests and what
// stands in for a mix that is not measured.
func TestWorkUnitsFallBack(t *testing.T) {
	in := workInput(false)
	for j := range in.Engines {
		in.Engines[j].PromptTokens = 0
	}
	if b := Build(in); b.PrefillWeight != 0 || b.ClusterWork[0] != 1 || b.EngineWork[0] != 1 {
		t.Errorf("no engine states its mix: planned in work (%v, %v, %v)", b.PrefillWeight, b.ClusterWork, b.EngineWork)
	}
	in = workInput(false)
	in.Engines[0].PrefillWeight, in.Engines[1].PrefillWeight = 0, 0
	in.Clusters[1].Demand = nil
	b := Build(in)
	if b.PrefillWeight != messages.DefaultPrefillWeight {
		t.Errorf("prefill weight %v, want the default %v", b.PrefillWeight, messages.DefaultPrefillWeight)
	}
	if want := messages.Work(500, 100, messages.DefaultPrefillWeight); math.Abs(b.ClusterWork[1]-want) > 1e-9 {
		t.Errorf("unmeasured cluster's work %v, want the fleet's mix %v", b.ClusterWork[1], want)
	}
}

// TestHeadroomGrowsWithVariance checks that the headroom grows with the
// measured variance, moves traffic off a cluster's near engine as it
// does, and is never shed as requests.
func TestHeadroomGrowsWithVariance(t *testing.T) {
	near := map[[2]string]float64{{"c", "a"}: 1, {"c", "b"}: 10}
	prev, prevW := 0.0, 2.0
	for _, v := range []float64{0, 100, 400, 1600} {
		in := Input{
			Engines:  []Engine{{Name: "a", CapacityRPS: 100, Health: 1, BaseMs: 500}, {Name: "b", CapacityRPS: 100, Health: 1, BaseMs: 500}},
			Clusters: []Cluster{{Name: "c", Demand: mixDemand(70, 0, 0, v)}},
			Network:  func(c, e string) (float64, bool) { ms, ok := near[[2]string{c, e}]; return ms, ok },
			Targets:  Targets{Common: 0.9}, MinDemandRPS: 1, HeadroomSD: DefaultHeadroomSD,
		}
		b := Build(in)
		want := math.Sqrt(v)
		if v == 0 {
			want = math.Sqrt(70) // Poisson until measured
		}
		if math.Abs(b.Headroom[0]-want) > 1e-9 {
			t.Fatalf("variance %v: headroom %v, want %v", v, b.Headroom[0], want)
		}
		sol, err := optimizer.NewSolver(optimizer.DefaultOptions()).Solve(b.Problem, nil)
		if err != nil {
			t.Fatal(err)
		}
		snap := b.Snapshot("m", sol, 0, in.Targets)
		t.Logf("variance %v: headroom %.2f, weights %v", v, b.Headroom[0], snap.Weights)
		if snap.ShedFraction != 0 || math.Abs(snap.Weights["a"]+snap.Weights["b"]-1) > 1e-9 || math.Abs(snap.DemandRPS-70) > 1e-9 {
			t.Fatalf("variance %v: snapshot %v, want all 70 req/s served", v, snap)
		}
		if v > 0 && (b.Headroom[0] <= prev || snap.Weights["a"] > prevW+1e-9) {
			t.Errorf("variance %v: headroom %v (before %v), near weight %v (before %v): want more headroom, no more on the near engine",
				v, b.Headroom[0], prev, snap.Weights["a"], prevW)
		}
		if v > 0 {
			prev = b.Headroom[0]
		}
		prevW = snap.Weights["a"]
	}
	if prevW > 0.75 {
		t.Errorf("at the largest variance the near engine keeps weight %v, want the far one to take a share", prevW)
	}
}
