package livecheck

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/sim/scenario"
)

func TestLiveStackFile(t *testing.T) {
	f, err := LiveStackFile(LiveScenario())
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Engines) != 3 || len(f.Clusters) != 3 || f.Clusters[1].DemandRPS != 60 || f.Network.InterRegionMs != 5 {
		t.Fatalf("derived stack %+v", f)
	}
	// The stack derives each type's max_batch back from capacity_rps.
	if c := f.Engines[0].CapacityRPS; math.Abs(c-51.2) > 0.1 {
		t.Errorf("engine-a capacity %.2f req/s, want about 51.2", c)
	}
	for _, bad := range []struct {
		edit func(*scenario.Scenario) string
	}{
		{func(s *scenario.Scenario) string {
			s.Clusters[0].TokenDist = "exponential"
			return "clusters[0].token_dist"
		}},
		{func(s *scenario.Scenario) string { s.EngineTypes[1].TBTBaseMs = 12; return "engine_types[1]" }},
		{func(s *scenario.Scenario) string { s.EngineTypes[0].KVBlocks = 3; return "engine_types[0].kv_blocks" }},
		{func(s *scenario.Scenario) string { s.Events = []scenario.Event{{AtS: 1}}; return "events" }},
	} {
		sc := LiveScenario()
		field := bad.edit(sc)
		if _, err := LiveStackFile(sc); !errors.Is(err, ErrLiveScenario) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: error %v, want ErrLiveScenario naming it", field, err)
		}
	}
}

// TestLiveAgreesLoosely runs a short live check (21 s of load, 10 s measured) and checks
// that the live stack and the simulator agree loosely: the engine shares,
// which routing decides, within 15 points; the mean end-to-end latency
// within a factor that tolerates a busy test host.
func TestLiveAgreesLoosely(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the live stack for 21 s")
	}
	if raceEnabled {
		t.Skip("compares real latencies with simulated ones; the race detector slows the real stack several times over (run without -race: go test -run TestLiveAgreesLoosely ./sim)")
	}
	sc := LiveScenario()
	sc.DurationS, sc.WarmupS, sc.DrainS = 21, 11, 10
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmp, err := RunLive(ctx, sc, LiveOptions{CalibrationRequests: 1000, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	_ = cmp.WriteTable(&b)
	t.Log("\n" + b.String())
	if cmp.Live.OK < cmp.Live.Requests*9/10 {
		t.Errorf("live: %d of %d requests served", cmp.Live.OK, cmp.Live.Requests)
	}
	for _, r := range cmp.Rows {
		if strings.HasPrefix(r.Metric, "share ") && math.Abs(r.Diff) > 0.15 {
			t.Errorf("%s: live %.3f sim %.3f, want within 15 points", r.Metric, r.Live, r.Sim)
		}
	}
	if ratio := cmp.Live.E2EMeanMs / cmp.Sim.E2EMeanMs; !(ratio > 0.8 && ratio < 2) {
		t.Errorf("e2e mean: live %.1f ms, sim %.1f ms: want a ratio in 0.8..2", cmp.Live.E2EMeanMs, cmp.Sim.E2EMeanMs)
	}
}
