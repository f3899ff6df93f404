package sim

import (
	"context"
	"fmt"

	"github.com/switchyard-dev/switchyard/sim/scenario"
)

// What the live check (package sim/livecheck) needs of the simulator: the
// switchyard policy's outcome on given arrivals, measured as the live side
// is, and the compiled fleet's names, network and measured period.

// LiveSide is what one side of the live check measured over the requests
// arriving in the measured period.
type LiveSide struct {
	// Requests counts measured arrivals; OK, Shed and Failed split them
	// (Failed: errors, requests dropped by the load generator, or unfinished).
	Requests int `json:"requests"`
	OK       int `json:"ok"`
	Shed     int `json:"shed"`
	Failed   int `json:"failed"`
	// Latencies of served requests as the client sees them, network included, ms.
	E2EMeanMs float64 `json:"e2e_mean_ms"`
	E2EP50Ms  float64 `json:"e2e_p50_ms"`
	E2EP99Ms  float64 `json:"e2e_p99_ms"`
	TTFTP50Ms float64 `json:"ttft_p50_ms"`
	TTFTP99Ms float64 `json:"ttft_p99_ms"`
	// Shares[cluster][engine] is the share of the cluster's served requests
	// that the engine served.
	Shares map[string]map[string]float64 `json:"shares"`
	// TimerLateP50Ms and TimerLateP99Ms (live side only) are how late a
	// 1 ms sleep woke up during the run: the host's scheduling delay, which
	// every engine step and proxied token also suffers. Above a few ms the
	// host is too busy for the live run to mean much.
	TimerLateP50Ms float64 `json:"timer_late_p50_ms,omitempty"`
	TimerLateP99Ms float64 `json:"timer_late_p99_ms,omitempty"`
	// EngineTTFTMs and EngineTBTMs (live side only) are each engine's own
	// mean TTFT and time between tokens over the whole run, warm-up
	// included, without the router, HTTP and network: where time went.
	EngineTTFTMs map[string]float64 `json:"engine_ttft_ms,omitempty"`
	EngineTBTMs  map[string]float64 `json:"engine_tbt_ms,omitempty"`
	// CapacityRPS is each engine's capacity as this side knows it: the
	// simulator's calibrated saturation throughput, or the engine
	// simulator's analytic capacity that the live engines signal.
	CapacityRPS map[string]float64 `json:"capacity_rps"`
}

// RunLiveSide simulates the switchyard policy on arrivals, keeping each
// cluster's engine shares: the simulator's side of the live check. calib is
// the calibration effort (Options.CalibrationRequests).
func RunLiveSide(ctx context.Context, sc *scenario.Scenario, arrivals []scenario.Arrival, seed uint64, calib int) (*LiveSide, error) {
	f, err := compile(sc, arrivals[len(arrivals)-1].AtMs)
	if err != nil {
		return nil, err
	}
	mix := arrivals[:min(len(arrivals), calibMix)]
	profiles := map[int]Profile{}
	side := &LiveSide{Shares: map[string]map[string]float64{}, CapacityRPS: map[string]float64{}}
	for j := range f.engines {
		e := &f.engines[j]
		p, ok := profiles[e.typeIdx]
		if !ok {
			if p, err = calibrate(sc, e.typeIdx, mix, nil, seed, calib); err != nil {
				return nil, err
			}
			profiles[e.typeIdx] = p
		}
		e.capacity, e.idleMs = p.CapacityRPS, p.IdleMs
		side.CapacityRPS[e.name] = p.CapacityRPS
	}
	pol, err := newPolicy("switchyard", sc)
	if err != nil {
		return nil, err
	}
	r := newRun(f, arrivals, pol, seed)
	r.ctx = ctx
	r.simulate(true)
	if ctx.Err() != nil {
		return nil, fmt.Errorf("sim: live check: %w", ctx.Err())
	}
	counts := grid[int](len(f.clusters), len(f.engines))
	served := make([]int, len(f.clusters))
	for q := range r.reqs {
		if r.m.counts(r, int32(q)) && r.reqs[q].state == rsDone {
			c := r.arrivals[q].Cluster
			counts[c][r.reqs[q].engine]++
			served[c]++
		}
	}
	res := r.m.result(r, "switchyard")
	side.Requests = int(res.Requests)
	side.OK = int(r.m.served)
	side.Shed = int(r.m.shedN)
	side.Failed = int(r.m.failedN)
	side.E2EMeanMs, side.E2EP50Ms, side.E2EP99Ms = res.E2EMeanMs, quantile(res.E2ESorted, 0.5), res.E2EP99Ms
	side.TTFTP50Ms, side.TTFTP99Ms = res.TTFTP50Ms, res.TTFTP99Ms
	for c := range f.clusters {
		row := map[string]float64{}
		for j := range f.engines {
			if served[c] > 0 {
				row[f.engines[j].name] = float64(counts[c][j]) / float64(served[c])
			}
		}
		side.Shares[f.clusters[c].name] = row
	}
	return side, nil
}

// LiveLayout is the fleet a scenario compiles to, as the live check
// compares it: names in the simulator's order, the modelled network and
// the measured period.
type LiveLayout struct {
	// Clusters and Engines are the names, engines expanded by count.
	Clusters []string
	Engines  []string
	// OneWayMs[c][j] is the one-way network latency from cluster c to
	// engine j, ms.
	OneWayMs [][]float64
	// MeasureFromMs and MeasureToMs bound the arrivals that count, ms.
	MeasureFromMs, MeasureToMs float64
}

// Layout compiles s for arrivals (sorted by time, at least one).
func Layout(s *scenario.Scenario, arrivals []scenario.Arrival) (*LiveLayout, error) {
	f, err := compile(s, arrivals[len(arrivals)-1].AtMs)
	if err != nil {
		return nil, err
	}
	l := &LiveLayout{OneWayMs: f.oneWay, MeasureFromMs: f.measureFrom, MeasureToMs: f.measureTo}
	for _, c := range f.clusters {
		l.Clusters = append(l.Clusters, c.name)
	}
	for _, e := range f.engines {
		l.Engines = append(l.Engines, e.name)
	}
	return l, nil
}
