package optimizersvc_test

import (
	"math"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/services/optimizersvc"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestAlikeClustersShareOneSplit: three clusters of one region, whose
// network rows agree, get the same weights in the snapshots the service
// writes — the split of their traffic that the objective leaves open is
// the one the loads fix (optimizer.SplitTies), not whichever the solver's
// path reached (from a cold start it gives them 0.09 to 0.12 of their
// traffic on the other region's engines).
func TestAlikeClustersShareOneSplit(t *testing.T) {
	env := testenv.StartNATS(t)
	dem := kv(t, env.JS, env.Names.DemandBucket)
	for c, rps := range map[string]float64{"x1": 72, "x2": 54, "x3": 90, "y1": 36} {
		putDemand(t, dem, c, rps)
	}
	for _, e := range []struct{ name, region string }{{"ex1", "r1"}, {"ex2", "r1"}, {"ex3", "r1"}, {"ex4", "r1"}, {"ey1", "r2"}, {"ey2", "r2"}} {
		putRegionEngine(t, env, e.name, e.region, 100)
	}
	r := record(t, env)
	start(t, env, optimizersvc.Options{Instance: "opt-ties", Clusters: []string{"x1", "x2", "x3", "y1"},
		ClusterRegions: map[string]string{"x1": "r1", "x2": "r1", "x3": "r1", "y1": "r2"},
		NetworkMs:      map[string]map[string]float64{}, MaxInterval: 200 * time.Millisecond})
	waitSnapshots(t, r, "x1", "x2", "x3", "y1")
	first, _ := r.latest(model + ".x1")
	if first.snap.ShedFraction > 0 {
		t.Fatalf("x1 sheds %v with capacity to spare", first.snap.ShedFraction)
	}
	spill := first.snap.Weights["ey1"] + first.snap.Weights["ey2"]
	if !(spill > 0.01) {
		t.Logf("x1's weights %v: no traffic to region r2, so only the split among r1's engines is tested", first.snap.Weights)
	}
	for _, c := range []string{"x2", "x3"} {
		u, _ := r.latest(model + "." + c)
		for e, w := range first.snap.Weights {
			if math.Abs(u.snap.Weights[e]-w) > 1e-6 {
				t.Errorf("engine %s: weight %.6f from %s, %.6f from x1, whose network rows agree (x1 %v, %s %v)",
					e, u.snap.Weights[e], c, w, first.snap.Weights, c, u.snap.Weights)
			}
		}
	}
}
