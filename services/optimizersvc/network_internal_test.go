package optimizersvc

import (
	"testing"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/plan"
)

// links returns the network latency of each engine in cluster c's row of
// the problem buildProblems builds now (engines with no link: absent).
func links(t *testing.T, s *Service, c string) map[string]float64 {
	t.Helper()
	b := s.buildProblems()
	if len(b) != 1 {
		t.Fatalf("%d problems, want 1", len(b))
	}
	p := b[0].problem
	for i, pc := range p.Clusters {
		if pc.Name == c {
			out := map[string]float64{}
			for _, l := range p.Network[i] {
				out[p.Engines[l.Engine].Name] = l.Ms
			}
			return out
		}
	}
	t.Fatalf("cluster %s not in the problem", c)
	return nil
}

// TestRegionNetworkLatency: the latency of a link is the measured one, else
// the configured one, else the region default (an unknown region counting
// as another region); NoRegionDefault leaves such engines unlinked.
func TestRegionNetworkLatency(t *testing.T) {
	s, e1 := newRampService()
	e1.Region = "r1"
	s.engines["m.e2"] = &messages.EngineState{Model: "m", Engine: "e2", Region: "r2", Status: messages.StatusUp, CapacityRPS: 30, Health: 1}
	s.engines["m.e3"] = &messages.EngineState{Model: "m", Engine: "e3", Status: messages.StatusUp, CapacityRPS: 30, Health: 1}
	s.opts.Clusters = []string{"A", "B"}
	s.opts.ClusterRegions = map[string]string{"A": "r1"}
	s.opts.NetworkMs = map[string]map[string]float64{"A": {"e3": 7}}
	same, other := plan.DefaultSameRegionMs, plan.DefaultOtherRegionMs
	check := func(c string, want map[string]float64) {
		t.Helper()
		got := links(t, s, c)
		if len(got) != len(want) {
			t.Fatalf("cluster %s links %v, want %v", c, got, want)
		}
		for e, ms := range want {
			if g, ok := got[e]; !ok || g != ms {
				t.Fatalf("cluster %s links %v, want %v", c, got, want)
			}
		}
	}
	check("A", map[string]float64{"e1": same, "e2": other, "e3": 7})
	// B has no region: every engine is of another region to it.
	check("B", map[string]float64{"e1": other, "e2": other, "e3": other})
	s.rtt["A.e2"] = 2.5 // one-way, as watch stores it
	check("A", map[string]float64{"e1": same, "e2": 2.5, "e3": 7})
	s.opts.Regions = plan.RegionLatency{SameRegionMs: 3, OtherRegionMs: 50}
	check("A", map[string]float64{"e1": 3, "e2": 2.5, "e3": 7})
	s.opts.NoRegionDefault = true
	check("A", map[string]float64{"e2": 2.5, "e3": 7})
}
