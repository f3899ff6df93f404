package optimizer

import (
	"errors"
	"math"
	"testing"
)

func TestPolicies(t *testing.T) {
	p := caseStudy()
	opt, err := PolicyByName("optimal", DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	best, err := opt.Solve(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range PolicyNames() {
		t.Run(name, func(t *testing.T) {
			pol, err := PolicyByName(name, DefaultOptions())
			if err != nil {
				t.Fatal(err)
			}
			if pol.Name() != name {
				t.Errorf("Name() = %q", pol.Name())
			}
			sol, err := pol.Solve(p, nil)
			if err != nil {
				t.Fatal(err)
			}
			served := 0.0
			for _, c := range sol.Clusters {
				sum := c.ShedFraction
				for _, w := range c.Weights {
					sum += w
				}
				if math.Abs(sum-1) > 1e-9 {
					t.Errorf("cluster %s: weights and shed sum to %g", c.Name, sum)
				}
				served += c.DemandRPS - c.ShedRPS
			}
			if name != "optimal" && sol.ShedRPS <= best.ShedRPS+1e-9 && sol.MeanLatencyMs < best.MeanLatencyMs-1e-6 {
				t.Errorf("%s beats optimal: %g < %g ms", name, sol.MeanLatencyMs, best.MeanLatencyMs)
			}
			t.Logf("%-13s mean latency %8.1f ms, shed %.2f req/s", name, sol.MeanLatencyMs, sol.ShedRPS)
		})
	}
	// Specific behaviours on the case study.
	near, _ := PolicyByName("nearest", DefaultOptions())
	ns, _ := near.Solve(p, nil)
	if ns.Engines[1].Utilisation <= 1 || ns.ShedRPS != 0 {
		t.Errorf("nearest: engine-b utilisation %g, shed %g; want overload and no shed", ns.Engines[1].Utilisation, ns.ShedRPS)
	}
	wf, _ := PolicyByName("waterfall", DefaultOptions())
	ws, _ := wf.Solve(p, nil)
	for _, e := range ws.Engines {
		if e.Utilisation > 1 {
			t.Errorf("waterfall overloads %s", e.Name)
		}
	}
	ll, _ := PolicyByName("least-latency", DefaultOptions())
	ls, _ := ll.Solve(p, nil)
	if !(ls.MeanLatencyMs >= best.MeanLatencyMs-1e-6) {
		t.Errorf("least-latency %g beats optimal %g", ls.MeanLatencyMs, best.MeanLatencyMs)
	}
	if _, err := PolicyByName("fastest", DefaultOptions()); !errors.Is(err, ErrUnknownPolicy) {
		t.Errorf("unknown policy: got %v", err)
	}
}
