package stack_test

// Reliability scenarios of issue 6, each on the real stack: embedded NATS,
// the aggregator, the optimizer service, routers and simulated engines, with
// clients over real HTTP on loopback. Every figure is logged as a line
//
//	RELIABILITY | scenario | criterion | measured | met
//
// which BENCHMARKS.md's reliability table is made from:
//
//	go test -run TestReliability -v ./stack/
//
// Demand and capacities are reduced (20–30 req/s engines, 16 output
// tokens) so that two shared cores run each scenario in about 20 s.

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/live"
	"github.com/switchyard-dev/switchyard/services/enginesim"
	"github.com/switchyard-dev/switchyard/services/optimizersvc"
	"github.com/switchyard-dev/switchyard/stack"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestReliabilityOneEngineFails: one engine of six fails every request under
// steady load (50% of capacity). At least 99.9% of client requests succeed,
// its weight in every router's snapshot falls below 0.02 within 2 s, and
// after it recovers its traffic returns gradually: its planned share of all
// clusters' demand rises over several snapshots, and it serves at least
// half its fair share of the requests by the end.
func TestReliabilityOneEngineFails(t *testing.T) {
	relSkipUnderRace(t)
	const scenario = "one engine of six fails"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := relFile([]stack.Cluster{{Name: "A", Region: "r1"}, {Name: "B", Region: "r1"}}, relEngines(6, "r1", 30))
	// Penalty schedule shortened from the defaults (5 s, slow start 10 s) to
	// keep the scenario within ~20 s; the mechanism is the same.
	opt := optimizersvc.Options{Penalties: optimizersvc.PenaltyOptions{Base: 3 * time.Second, SlowStart: 6 * time.Second}}
	s := relStart(t, ctx, f, opt, false)
	capacity := relCapacity(s)
	rate := 0.5 * capacity / 2 // per cluster: 50% load in all
	const (
		onset   = 2 * time.Second
		recover = onset + 2500*time.Millisecond
		end     = 14 * time.Second
	)
	bad := s.Engines()[0]
	client := relClient()
	var loads []relLoad
	for i, r := range s.Routers() {
		loads = append(loads, relLoad{URL: "http://" + r.Addr(), Rate: rate, To: end, Seed: uint64(10 + i)})
	}
	relWarm(t, ctx, s, client, 6*time.Second, slices.Clone(loads)...)
	origin := time.Now()
	sm := relStartSampler(ctx, s.Routers(), origin)
	go func() {
		time.Sleep(time.Until(origin.Add(onset)))
		_ = bad.SetFailure(enginesim.Failure{ErrorRate: 1})
		time.Sleep(time.Until(origin.Add(recover)))
		_ = bad.SetFailure(enginesim.Failure{})
	}()
	rs := relRun(ctx, client, origin, loads...)
	sm.stop()
	relLogRouters(t, s)
	t.Logf("shed per second: %s", relPerSecond(rs, end, relResult.shed))
	t.Logf("failed per second: %s", relPerSecond(rs, end, func(r relResult) bool { return !r.ok() && !r.shed() }))
	all := relSummarise(rs)
	during := relSummarise(relWindow(rs, onset, end))
	t.Logf("capacity %.0f req/s, load %.0f req/s; measured %d requests: %d ok, %d failed, %d shed, %d unsent; errors %v",
		capacity, 2*rate, all.sent, all.ok, all.failed, all.shed, all.unsent, all.errs)
	relFigure(t, scenario, "client success >= 99.9%", fmt.Sprintf("%s (%d of %d; from onset %s of %d)",
		relPctStr(all.ok, all.sent), all.ok, all.sent, relPctStr(during.ok, during.sent), during.sent),
		all.sent > 1000 && float64(all.ok) >= 0.999*float64(all.sent))

	// The weight falls to about zero in every router within 2 s.
	worst := time.Duration(0)
	for i := range s.Routers() {
		at := sm.firstBelow(i, []string{bad.Name()}, 0.02, onset, recover)
		d := at - onset
		if at < 0 {
			d = recover - onset + time.Second // never within the failure
		}
		t.Logf("router %s: %s's weight below 0.02 %v after the onset", s.Routers()[i].Name(), bad.Name(), d.Round(time.Millisecond))
		worst = max(worst, d)
	}
	relFigure(t, scenario, "weight < 0.02 in every router within 2 s", fmt.Sprintf("%v (slowest router)", worst.Round(10*time.Millisecond)),
		worst <= 2*time.Second)

	// Recovery: the engine's planned share of the fleet's traffic (its
	// weight in each cluster's snapshot times the cluster's demand, summed)
	// climbs over several snapshots. How the optimizer splits the returning
	// capacity between the clusters (same region, same cost) is its choice,
	// so each router's weight is logged, not judged.
	for i, r := range s.Routers() {
		var trail []string
		last := -1.0
		for _, smp := range sm.of(i) {
			if w := smp.weights[bad.Name()]; smp.at >= recover && w != last {
				trail = append(trail, fmt.Sprintf("g%d@%.1fs:%.3f", smp.generation, (smp.at-recover).Seconds(), w))
				last = w
			}
		}
		t.Logf("router %s: %s's weight after recovery: %v", r.Name(), bad.Name(), trail)
	}
	var steps []float64
	var trail []string
	last := -1.0
	for _, sh := range sm.plannedShare(bad.Name(), recover) {
		if math.Abs(sh.share-last) > 1e-9 {
			steps = append(steps, sh.share)
			trail = append(trail, fmt.Sprintf("%.1fs:%.3f", (sh.at-recover).Seconds(), sh.share))
			last = sh.share
		}
	}
	final := 0.0
	if len(steps) > 0 {
		final = slices.Max(steps)
	}
	// Distinct planned shares between "about zero" and 90% of the final
	// share, and the largest single rise as a share of the final one.
	mid, maxStep := 0, 0.0
	for k, w := range steps {
		if w > 0.02 && w < 0.9*final {
			mid++
		}
		if k > 0 {
			maxStep = max(maxStep, w-steps[k-1])
		}
	}
	t.Logf("%s's planned share of the fleet's traffic after recovery: %v", bad.Name(), trail)
	relFigure(t, scenario, "traffic returns gradually (planned share of all clusters' demand)",
		fmt.Sprintf("%d intermediate levels, largest step %.0f%% of final share %.3f", mid, 100*maxStep/max(final, 1e-9), final),
		final > 0.1 && mid >= 3 && maxStep <= 0.5*final)
	if p, err := relPenalty(ctx, s, bad.Name()); err != nil {
		t.Logf("penalty record of %s: %v", bad.Name(), err)
	} else {
		t.Logf("penalty record of %s: phase %s, reason %s (%s), multiplier %.2f, since onset%+.1fs until onset%+.1fs, slow start until onset%+.1fs, strikes %d",
			bad.Name(), p.Phase, p.Reason, p.Detail, p.Multiplier, relSince(origin, onset, p.Since), relSince(origin, onset, p.Until), relSince(origin, onset, p.RecoverUntil), p.Strikes)
	}
	// The engine's share of client traffic per second after recovery.
	var shares []string
	for sec := recover; sec < end; sec += time.Second {
		w := relWindow(rs, sec, sec+time.Second)
		n, k := 0, 0
		for _, r := range w {
			if r.ok() {
				n++
				if r.engine == bad.Name() {
					k++
				}
			}
		}
		shares = append(shares, relPctStr(k, n))
	}
	t.Logf("%s's share of successful requests per second after recovery: %v", bad.Name(), shares)
	// Its traffic came back: over the last 2 s, at least half its fair
	// share (one of six engines) of the successful requests.
	n, k := 0, 0
	for _, r := range relWindow(rs, end-2*time.Second, end) {
		if r.ok() {
			n++
			if r.engine == bad.Name() {
				k++
			}
		}
	}
	relFigure(t, scenario, "traffic returns (share of successes in the last 2 s >= 1/12)",
		fmt.Sprintf("%s (%d of %d)", relPctStr(k, n), k, n), n > 0 && 12*k >= n)
}

// TestReliabilityHalfFailAtHighLoad: at 90% load, half the engines start
// failing every request. Retry amplification (upstream attempts per client
// request the routers admitted) stays at or below 1.1: no retry storm.
func TestReliabilityHalfFailAtHighLoad(t *testing.T) {
	relSkipUnderRace(t)
	const scenario = "half the engines fail at 90% load"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := relFile([]stack.Cluster{{Name: "A", Region: "r1"}, {Name: "B", Region: "r1"}}, relEngines(6, "r1", 20))
	s := relStart(t, ctx, f, optimizersvc.Options{}, false)
	capacity := relCapacity(s)
	rate := 0.9 * capacity / 2
	const (
		onset = time.Second
		end   = 10 * time.Second
	)
	client := relClient()
	var loads []relLoad
	for i, r := range s.Routers() {
		loads = append(loads, relLoad{URL: "http://" + r.Addr(), Rate: rate, To: end, Seed: uint64(20 + i)})
	}
	relWarm(t, ctx, s, client, 6*time.Second, slices.Clone(loads)...)
	attempts0 := 0.0
	for _, r := range s.Routers() {
		attempts0 += testenv.MetricSum(t, r.Handler().Metrics(), "switchyard_router_upstream_attempts_total", nil)
	}
	arrived0 := relArrived(s)
	origin := time.Now()
	var arrivedAtOnset uint64
	go func() {
		time.Sleep(time.Until(origin.Add(onset)))
		arrivedAtOnset = relArrived(s)
		for _, e := range s.Engines()[:3] {
			_ = e.SetFailure(enginesim.Failure{ErrorRate: 1})
		}
	}()
	// Engine arrivals per second, to see any burst of retries.
	perSec := make(chan []uint64, 1)
	go func() {
		var out []uint64
		last := arrived0
		for sec := time.Second; sec <= end+time.Second; sec += time.Second {
			time.Sleep(time.Until(origin.Add(sec)))
			n := relArrived(s)
			out = append(out, n-last)
			last = n
		}
		perSec <- out
	}()
	rs := relRun(ctx, client, origin, loads...)
	arrived := relArrived(s) - arrived0
	attempts := -attempts0
	ampGauge := 0.0
	for _, r := range s.Routers() {
		attempts += testenv.MetricSum(t, r.Handler().Metrics(), "switchyard_router_upstream_attempts_total", nil)
		ampGauge = max(ampGauge, testenv.MetricSum(t, r.Handler().Metrics(), "switchyard_router_retry_amplification", nil))
	}
	relLogRouters(t, s)
	st := relSummarise(rs)
	admitted := st.sent - st.shed
	after := relSummarise(relWindow(rs, onset, end))
	t.Logf("capacity %.0f req/s, load %.0f req/s (90%%); then 3 of 6 engines fail: %d requests, %d ok, %d failed, %d shed (%d admitted); errors %v",
		capacity, 2*rate, st.sent, st.ok, st.failed, st.shed, admitted, st.errs)
	t.Logf("after the onset: %d requests, %d ok (%s), %d failed, %d shed", after.sent, after.ok, relPctStr(after.ok, after.sent), after.failed, after.shed)
	t.Logf("engine arrivals per second: %v (client requests offered per second ≈ %.0f); arrivals before the onset %d",
		<-perSec, 2*rate, arrivedAtOnset-arrived0)
	ampEngines := float64(arrived) / float64(admitted)
	ampRouters := attempts / float64(admitted)
	relFigure(t, scenario, "retry amplification <= 1.1 (engine arrivals / admitted client requests)",
		fmt.Sprintf("%.3f (%d arrivals / %d admitted); routers' attempts %.3f; router gauge (10 s) max %.3f", ampEngines, arrived, admitted, ampRouters, ampGauge),
		admitted > 500 && ampEngines <= 1.1 && ampRouters <= 1.1)
}

// TestReliabilityOverload: demand at 150% of capacity, a mix of critical
// (20%), standard (40%) and sheddable (40%) requests. Served throughput is at
// least 95% of capacity, about a third is shed, shed answers come in under
// 5 ms at p99, admitted requests' TTFT p99 is within 2× the unloaded p99, and
// no critical request is shed while sheddable traffic is being served.
func TestReliabilityOverload(t *testing.T) {
	relSkipUnderRace(t)
	const scenario = "demand at 150% of capacity"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Two engines of 64 batch slots with 100 ms decode steps (36 req/s
	// each), as a large model's engine runs under a vLLM-like scheduler:
	// decode memory-bound, so a step barely lengthens with a fuller batch,
	// and a full batch finishes 4.3 of its 16-token answers a step. The
	// shape decides whether the overload rows can be met together at all:
	// a request joins a batch at a step boundary, so serving 95% of
	// capacity needs requests queued at the engines for the slots each
	// boundary frees, and a queued request (critical ones are never shed,
	// so they queue when the slots are full) waits for a completion. On
	// 4 engines of 20 slots at 60 ms steps (1.3 completions a step) even an
	// oracle that knows every engine's state and never lags gets 95.0%
	// served at 2.06x the unloaded TTFT p99 at best, so no router meets
	// both rows there (go run ./bench/slotmodel -critical 0.2);
	// on these engines the oracle has 95.6% at 1.26x and 96.8% at 1.58x
	// (-engines 2 -batch 64 -tbt 100). SWITCHYARD_RELIABILITY_SMALL_ENGINES=1
	// runs the 20-slot shape, for comparison (BENCHMARKS.md, reliability).
	f := relFile([]stack.Cluster{{Name: "A", Region: "r1"}}, relEngines(2, "r1", 36))
	f.Sim.BaseTBTMs, f.Sim.TBTGrowthMs = 100, 0.2
	if os.Getenv("SWITCHYARD_RELIABILITY_SMALL_ENGINES") == "1" {
		f.Engines = relEngines(4, "r1", 20)
		f.Sim.BaseTBTMs = 60
	}
	s := relStart(t, ctx, f, optimizersvc.Options{}, true)
	// The cluster's router runs with its default protections: the rows this
	// test enforces are judged on the router every deployment runs. Its
	// capacity allotment (router.CapacityAllotment) holds the admitted TTFT
	// p99 to 1.5-1.8x the unloaded p99 with served throughput over a point
	// above its row.
	rt := relRouter(t, ctx, s, live.ProtectionOptions{})
	relWaitReady(t, s, []*router.Service{rt})
	capacity := relCapacity(s)
	url := "http://" + rt.Addr()
	client := relClient()

	// Unloaded: 25% of capacity, after a warm-up at the same rate; 8 s, so
	// that its p99 rests on ~160 requests rather than ~80.
	relWarm(t, ctx, s, client, 3*time.Second, relLoad{URL: url, Rate: 0.25 * capacity, Seed: 30})
	base := relRun(ctx, client, time.Now(), relLoad{URL: url, Rate: 0.25 * capacity, To: 8 * time.Second, Seed: 31})
	var baseTTFT []time.Duration
	for _, r := range base {
		if r.ok() {
			baseTTFT = append(baseTTFT, r.ttft)
		}
	}
	bst := relSummarise(base)
	unloadedP99 := relPct(baseTTFT, 0.99)
	t.Logf("unloaded (25%% of %.0f req/s): %d requests, %d ok, %d shed, %d failed; TTFT p50 %v p99 %v",
		capacity, bst.sent, bst.ok, bst.shed, bst.failed, relPct(baseTTFT, 0.5), unloadedP99)

	// Overload: 150%, measured after 4 s, when the demand estimate has caught up.
	const (
		settle = 4 * time.Second
		end    = 12 * time.Second
	)
	demand := 1.5 * capacity
	origin := time.Now()
	rs := relRun(ctx, client, origin,
		relLoad{URL: url, Rate: 0.2 * demand, To: end, Priority: "critical", Seed: 32},
		relLoad{URL: url, Rate: 0.4 * demand, To: end, Priority: "standard", Seed: 33},
		relLoad{URL: url, Rate: 0.4 * demand, To: end, Priority: "sheddable", Seed: 34})
	relLogRouter(t, rt)
	t.Logf("shed per second: %s", relPerSecond(rs, end, relResult.shed))
	m := relWindow(rs, settle, end)
	st := relSummarise(m)
	span := (end - settle).Seconds()
	byPrio := map[string]*relStats{}
	var shedLat, ttft []time.Duration
	for _, p := range []string{"critical", "standard", "sheddable"} {
		var w []relResult
		for _, r := range m {
			if r.prio == p {
				w = append(w, r)
			}
		}
		ps := relSummarise(w)
		byPrio[p] = &ps
	}
	for _, r := range m {
		switch {
		case r.shed():
			shedLat = append(shedLat, r.head)
		case r.ok():
			ttft = append(ttft, r.ttft)
		}
	}
	t.Logf("overload %.0f req/s over capacity %.0f req/s, measured %v..%v: %d requests, %d ok, %d shed, %d failed, %d unsent; errors %v",
		demand, capacity, settle, end, st.sent, st.ok, st.shed, st.failed, st.unsent, st.errs)
	for _, p := range []string{"critical", "standard", "sheddable"} {
		ps := byPrio[p]
		var pt []time.Duration
		for _, r := range m {
			if r.prio == p && r.ok() {
				pt = append(pt, r.ttft)
			}
		}
		t.Logf("  %-9s sent %4d ok %4d shed %4d (%s) failed %d; TTFT p50 %v p90 %v p99 %v", p, ps.sent, ps.ok, ps.shed, relPctStr(ps.shed, ps.sent), ps.failed,
			relPct(pt, 0.5), relPct(pt, 0.9), relPct(pt, 0.99))
	}
	served := float64(st.ok) / span
	relFigure(t, scenario, "served throughput >= 95% of capacity",
		fmt.Sprintf("%.1f req/s = %.1f%% of %.1f req/s", served, 100*served/capacity, capacity), served >= 0.95*capacity)
	shedShare := float64(st.shed) / float64(max(st.sent, 1))
	relFigure(t, scenario, "about a third shed (0.25..0.42)", fmt.Sprintf("%.3f (%d of %d)", shedShare, st.shed, st.sent),
		shedShare >= 0.25 && shedShare <= 0.42)
	relFigure(t, scenario, "shed answers p99 < 5 ms (client side)",
		fmt.Sprintf("p50 %v p99 %v over %d", relPct(shedLat, 0.5).Round(10*time.Microsecond), relPct(shedLat, 0.99).Round(10*time.Microsecond), len(shedLat)),
		len(shedLat) > 0 && relPct(shedLat, 0.99) < 5*time.Millisecond)
	relFigure(t, scenario, "admitted TTFT p99 <= 2x unloaded p99",
		fmt.Sprintf("p99 %v vs unloaded %v (%.2fx); p50 %v", relPct(ttft, 0.99).Round(time.Millisecond), unloadedP99.Round(time.Millisecond),
			float64(relPct(ttft, 0.99))/float64(max(unloadedP99, 1)), relPct(ttft, 0.5).Round(time.Millisecond)),
		relPct(ttft, 0.99) <= 2*unloadedP99)
	// Critical requests shed in a second in which a sheddable one was served.
	violations, criticalShed := 0, 0
	for sec := time.Duration(0); sec < end; sec += time.Second {
		var critShed, sheddableOK int
		for _, r := range relWindow(rs, sec, sec+time.Second) {
			if r.prio == "critical" && r.shed() {
				critShed++
			}
			if r.prio == "sheddable" && r.ok() {
				sheddableOK++
			}
		}
		criticalShed += critShed
		if critShed > 0 && sheddableOK > 0 {
			violations += critShed
		}
	}
	relFigure(t, scenario, "no critical shed while sheddable served",
		fmt.Sprintf("%d critical shed in seconds with sheddable served (%d critical shed in all, whole run incl. settling)", violations, criticalShed),
		violations == 0)
}

// TestReliabilityHangingEngine: an engine accepts requests and never
// answers. The router's per-attempt first-byte deadline (500 ms here) fires,
// the request is retried on another engine and succeeds, and the engine is
// penalised (weight about zero, a penalty record in sy_engines).
func TestReliabilityHangingEngine(t *testing.T) {
	relSkipUnderRace(t)
	const scenario = "an engine hangs"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := relFile([]stack.Cluster{{Name: "A", Region: "r1"}}, relEngines(3, "r1", 30))
	s := relStart(t, ctx, f, optimizersvc.Options{}, true)
	const deadline = 500 * time.Millisecond
	rt := relRouter(t, ctx, s, live.ProtectionOptions{FirstByteTimeout: deadline})
	relWaitReady(t, s, []*router.Service{rt})

	capacity := relCapacity(s)
	rate := 0.4 * capacity
	const (
		onset = time.Second
		end   = 8 * time.Second
	)
	url := "http://" + rt.Addr()
	client := relClient()
	relWarm(t, ctx, s, client, 5*time.Second, relLoad{URL: url, Rate: rate, Seed: 40})
	bad := s.Engines()[0]
	origin := time.Now()
	sm := relStartSampler(ctx, []*router.Service{rt}, origin)
	go func() {
		time.Sleep(time.Until(origin.Add(onset)))
		// Silent: the engine keeps signalling health 1, as a wedged
		// process whose signal loop still runs would. (A hang the engine
		// reports itself drops its weight to 0 from the signal alone, within
		// one signal interval, before any request meets the deadline.)
		_ = bad.SetFailure(enginesim.Failure{Hang: true, Silent: true})
	}()
	rs := relRun(ctx, client, origin, relLoad{URL: url, Rate: rate, To: end, Seed: 41})
	sm.stop()
	relLogRouter(t, rt)
	reg := rt.Handler().Metrics()
	timeouts := testenv.MetricSum(t, reg, "switchyard_router_retries_total", map[string]string{"reason": "timeout"})
	engTimeouts := testenv.MetricSum(t, reg, "switchyard_router_engine_requests_total", map[string]string{"engine": bad.Name(), "code": "timeout"})
	st := relSummarise(rs)
	retried := 0 // successes that waited out the deadline: retried after a timeout
	for _, r := range rs {
		if r.ok() && r.ttft >= deadline && r.engine != bad.Name() {
			retried++
		}
	}
	t.Logf("capacity %.0f req/s, load %.0f req/s: %d requests, %d ok, %d failed, %d shed; errors %v",
		capacity, rate, st.sent, st.ok, st.failed, st.shed, st.errs)
	relFigure(t, scenario, "per-attempt deadline fires",
		fmt.Sprintf("%.0f attempts to %s timed out after %v", engTimeouts, bad.Name(), deadline), engTimeouts >= 1)
	relFigure(t, scenario, "retried elsewhere and succeeds",
		fmt.Sprintf("%.0f retries after a timeout; %d successes on other engines with TTFT >= %v; client success %s (%d of %d)",
			timeouts, retried, deadline, relPctStr(st.ok, st.sent), st.ok, st.sent),
		timeouts >= 1 && retried >= 1 && st.failed == 0)
	// Until the first penalty (5 s) ends: the engine, still hung, then gets
	// slow-start traffic again and is penalised again, for longer.
	at := sm.firstBelow(0, []string{bad.Name()}, 0.02, onset, onset+4*time.Second)
	var trail []string
	last := -1.0
	for _, smp := range sm.of(0) {
		if w := smp.weights[bad.Name()]; w != last {
			trail = append(trail, fmt.Sprintf("g%d@%+.1fs:%.3f", smp.generation, (smp.at-onset).Seconds(), w))
			last = w
		}
	}
	t.Logf("%s's weight (time from the onset): %v", bad.Name(), trail)
	var pen string
	penOK := false
	for wait := time.Now().Add(3 * time.Second); time.Now().Before(wait); time.Sleep(100 * time.Millisecond) {
		p, err := relPenalty(ctx, s, bad.Name())
		if err != nil {
			pen = "penalty record: " + err.Error()
			continue
		}
		pen = fmt.Sprintf("penalty %s, reason %s (%s), multiplier %.2f, %.1fs after the onset", p.Phase, p.Reason, p.Detail, p.Multiplier, relSince(origin, onset, p.Since))
		penOK = true
		break
	}
	relFigure(t, scenario, "engine penalised (weight < 0.02, penalty record)",
		fmt.Sprintf("weight < 0.02 %v after the onset; %s", (at-onset).Round(10*time.Millisecond), pen), at >= 0 && penOK)
}

// TestReliabilityRegionFails: both engines of region r2 fail every request.
// Cluster B's (region r2) traffic moves to the other regions within 2 s and
// nothing is dropped that the remaining capacity could serve.
func TestReliabilityRegionFails(t *testing.T) {
	relSkipUnderRace(t)
	const scenario = "a region's engines all fail"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var engines []stack.Engine
	for _, r := range []string{"r1", "r2", "r3"} {
		for i := 1; i <= 2; i++ {
			engines = append(engines, stack.Engine{Name: fmt.Sprintf("%s-e%d", r, i), Region: r, CapacityRPS: 30})
		}
	}
	f := relFile([]stack.Cluster{{Name: "A", Region: "r1"}, {Name: "B", Region: "r2"}, {Name: "C", Region: "r3"}}, engines)
	s := relStart(t, ctx, f, optimizersvc.Options{}, false)
	capacity := relCapacity(s)
	rate := 0.5 * capacity / 3 // 50% of the fleet; 75% of what is left after r2 fails
	const (
		onset = time.Second
		end   = 9 * time.Second
	)
	client := relClient()
	var loads []relLoad
	for i, r := range s.Routers() {
		loads = append(loads, relLoad{URL: "http://" + r.Addr(), Rate: rate, To: end, Seed: uint64(50 + i)})
	}
	relWarm(t, ctx, s, client, 6*time.Second, slices.Clone(loads)...)
	r2 := []string{"r2-e1", "r2-e2"}
	b := 1 // cluster B's router
	snap, _ := s.Routers()[b].Store().Snapshot(relModel)
	t.Logf("cluster B's weights before: %s", relFmtWeights(snap.Weights))
	origin := time.Now()
	sm := relStartSampler(ctx, s.Routers(), origin)
	go func() {
		time.Sleep(time.Until(origin.Add(onset)))
		for _, e := range s.Engines() {
			if slices.Contains(r2, e.Name()) {
				_ = e.SetFailure(enginesim.Failure{ErrorRate: 1})
			}
		}
	}()
	// Each cluster's results, told apart by their load's URL.
	results := make([][]relResult, len(loads))
	done := make(chan struct{})
	for i := range loads {
		go func() {
			results[i] = relRun(ctx, client, origin, loads[i])
			done <- struct{}{}
		}()
	}
	for range loads {
		<-done
	}
	sm.stop()
	relLogRouters(t, s)
	snap, _ = s.Routers()[b].Store().Snapshot(relModel)
	t.Logf("cluster B's weights after: %s", relFmtWeights(snap.Weights))
	moved := sm.firstBelow(b, r2, 0.02, onset, end)
	relFigure(t, scenario, "cluster B's traffic leaves r2 within 2 s (snapshot weight on r2 < 0.02)",
		fmt.Sprintf("%v after the onset", (moved-onset).Round(10*time.Millisecond)), moved >= 0 && moved-onset <= 2*time.Second)
	for i, c := range f.Clusters {
		st := relSummarise(relWindow(results[i], onset, end))
		lastFail := time.Duration(-1)
		inR2 := 0
		for _, r := range relWindow(results[i], onset, end) {
			if !r.ok() {
				lastFail = r.at
			}
			if r.ok() && slices.Contains(r2, r.engine) {
				inR2++
			}
		}
		window := "none"
		if lastFail >= 0 {
			window = fmt.Sprintf("last failure sent %v after the onset", (lastFail - onset).Round(time.Millisecond))
		}
		t.Logf("cluster %s after the onset: %d requests, %d ok, %d failed, %d shed; %s; errors %v", c.Name, st.sent, st.ok, st.failed, st.shed, window, st.errs)
		relFigure(t, scenario, "cluster "+c.Name+" client success >= 99% after the onset",
			fmt.Sprintf("%s (%d of %d; %d shed, %d failed; transition: %s)", relPctStr(st.ok, st.sent), st.ok, st.sent, st.shed, st.failed, window),
			st.sent > 100 && float64(st.ok) >= 0.99*float64(st.sent))
	}
}
