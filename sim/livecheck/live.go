package livecheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/enginesim"
	"github.com/switchyard-dev/switchyard/services/loadgen"
	"github.com/switchyard-dev/switchyard/services/optimizersvc"
	"github.com/switchyard-dev/switchyard/sim"
	"github.com/switchyard-dev/switchyard/sim/scenario"
	"github.com/switchyard-dev/switchyard/stack"
	"github.com/switchyard-dev/switchyard/workload"
)

// liveScenario is the built-in scenario of the live check. Its max_batch
// values are what the engine simulator needs for 51.2 and 40.3 req/s with
// these token lengths and step times (enginesim.BatchForCapacity).
const liveScenario = `name: live-case-study
description: the case study at half scale, small enough to run live on two busy cores
duration_s: 40
warmup_s: 10
drain_s: 30
seed: 1
slo: {ttft_ms: 500, tbt_ms: 60}
engine_types:
  - {name: big, max_batch: 24, prefill_ms_per_token: 0.02, tbt_base_ms: 10, tbt_per_request_ms: 0.05, kv_blocks: 100000}
  - {name: small, max_batch: 17, prefill_ms_per_token: 0.02, tbt_base_ms: 10, tbt_per_request_ms: 0.05, kv_blocks: 100000}
engines:
  - {name: engine-a, region: r1, type: big}
  - {name: engine-b, region: r2, type: big}
  - {name: engine-c, region: r3, type: small}
clusters:
  - {name: A, region: r1, poisson: {rate: 45}, prompt_tokens: 256, output_tokens: 32}
  - {name: B, region: r2, poisson: {rate: 60}, prompt_tokens: 256, output_tokens: 32}
  - {name: C, region: r3, poisson: {rate: 20}, prompt_tokens: 256, output_tokens: 32}
network:
  local_ms: 1
  remote_ms: 5
`

// LiveScenario returns the live check's built-in scenario: the case study at
// half scale (demand 45, 60 and 20 req/s onto engines of about 51, 51 and 40
// req/s), 10 s of warm-up and 30 s measured.
func LiveScenario() *scenario.Scenario {
	sc, err := scenario.ParseScenario("(built-in live scenario)", []byte(liveScenario))
	if err != nil {
		panic("built-in live scenario does not parse: " + err.Error())
	}
	return sc
}

// LiveModel is the model name the live stack serves.
const LiveModel = "llama"

// LiveTolerance is how far the live run may be from the simulator and still
// agree. Relative tolerances are fractions of the simulator's value.
type LiveTolerance struct {
	// E2EMean, E2EP50 and E2EP99 bound the relative differences of the
	// end-to-end latency's mean, median and 99th percentile.
	E2EMean float64 `json:"e2e_mean"`
	E2EP50  float64 `json:"e2e_p50"`
	E2EP99  float64 `json:"e2e_p99"`
	// TTFTP50 bounds the relative difference of the median TTFT, which also
	// passes when within TTFTP50AbsMs: a TTFT of a few ms is mostly timer and
	// HTTP overhead, where a relative bound means nothing.
	TTFTP50      float64 `json:"ttft_p50"`
	TTFTP50AbsMs float64 `json:"ttft_p50_abs_ms"`
	// SharePoints bounds the difference, in share points (0.10 is 10 points),
	// of every cluster's share of requests served by every engine.
	SharePoints float64 `json:"share_points"`
	// ShedPoints bounds the difference of the shares of requests shed.
	ShedPoints float64 `json:"shed_points"`
	// Failures bounds the share of live requests that failed or were
	// dropped by the load generator.
	Failures float64 `json:"failures"`
}

// DefaultLiveTolerance returns the tolerances docs/simulation.md states and explains.
func DefaultLiveTolerance() LiveTolerance {
	return LiveTolerance{E2EMean: 0.15, E2EP50: 0.15, E2EP99: 0.30, TTFTP50: 0.30, TTFTP50AbsMs: 5, SharePoints: 0.10, ShedPoints: 0.03, Failures: 0.01}
}

// LiveOptions configures RunLive.
type LiveOptions struct {
	// Seed replaces the scenario's seed when SeedSet.
	Seed    uint64
	SeedSet bool
	// CalibrationRequests is the simulator's calibration effort (see
	// Options); 0 means 4000.
	CalibrationRequests int
	// Tolerance is what agreement means; the zero value means DefaultLiveTolerance().
	Tolerance LiveTolerance
	// DataDir holds the embedded NATS server's store; empty means a
	// temporary directory, removed afterwards.
	DataDir string
	// Progress, when set, receives a line every 5 s of the live run.
	Progress io.Writer
	// Logger receives the live services' log.
	Logger zerolog.Logger
}

// LiveRow is one compared quantity.
type LiveRow struct {
	Metric string  `json:"metric"`
	Live   float64 `json:"live"`
	Sim    float64 `json:"sim"`
	// Diff is live − sim: relative (a fraction) for latencies, in share
	// points for shares, absolute otherwise.
	Diff float64 `json:"diff"`
	// Relative tells how Diff is expressed.
	Relative bool `json:"relative"`
	// Tolerance is the bound on |Diff| (0: informational, not checked).
	Tolerance float64 `json:"tolerance"`
	// OK is false when the row is checked and out of tolerance.
	OK bool `json:"ok"`
	// Note explains a pass by another bound.
	Note string `json:"note,omitempty"`
}

// LiveComparison is the outcome of the live check.
type LiveComparison struct {
	Scenario  string        `json:"scenario"`
	Seed      uint64        `json:"seed"`
	WarmupS   float64       `json:"warmup_s"`
	MeasuredS float64       `json:"measured_s"`
	WallS     float64       `json:"wall_s"`
	Tolerance LiveTolerance `json:"tolerance"`
	Live      sim.LiveSide  `json:"live"`
	Sim       sim.LiveSide  `json:"sim"`
	Rows      []LiveRow     `json:"rows"`
	// OK is true when every checked row is within tolerance.
	OK bool `json:"ok"`
	// Clusters and Engines give the order of the shares.
	Clusters []string `json:"clusters"`
	Engines  []string `json:"engines"`
}

// ErrLiveScenario is wrapped by errors about a scenario the live check cannot run.
var ErrLiveScenario = errors.New("sim: scenario not fit for the live check")

func liveErr(field string, v any, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %v: %s", ErrLiveScenario, field, v, fmt.Sprintf(format, args...))
}

// liveTokens returns the prompt and output lengths every request of a
// scenario fit for the live check has.
func liveTokens(sc *scenario.Scenario) (prompt, output int) {
	return sc.Clusters[0].PromptTokens, sc.Clusters[0].OutputTokens
}

// LiveStackFile derives the stack that runs a scenario live: one simulated
// engine per engine, one router per cluster, the same network. The live
// engines (services/enginesim) model what the simulator's engines model
// without a KV cache that binds, with one speed for the whole stack, and
// with requests of one size, so the scenario must have: no events; Poisson
// or burst arrivals with fixed token lengths, the same in every cluster, and
// no sessions; engine types that differ only in max_batch, with no
// tbt_per_ktoken_ms and a KV cache that holds max_batch requests; and no
// per-pair network latencies. Each engine's capacity_rps is the engine
// simulator's capacity at its type's max_batch, so that the stack derives
// that batch size back.
func LiveStackFile(sc *scenario.Scenario) (*stack.File, error) {
	if len(sc.Events) > 0 {
		return nil, liveErr("events", len(sc.Events), "want none: the live stack runs no timed events")
	}
	if len(sc.Network.Between) > 0 {
		return nil, liveErr("network.between", len(sc.Network.Between), "want none: the live stack has one latency within and one between regions")
	}
	for i := range sc.Clusters {
		c := &sc.Clusters[i]
		field := fmt.Sprintf("clusters[%d]", i)
		switch {
		case c.Trace != nil:
			return nil, liveErr(field+".trace", c.Trace.File, "want Poisson or burst arrivals: the live engines serve one request size")
		case c.Sessions != 0:
			return nil, liveErr(field+".sessions", c.Sessions, "want 0: the live engines have no prefix cache")
		case c.TokenDist == "exponential":
			return nil, liveErr(field+".token_dist", c.TokenDist, "want fixed: the live engines' capacity assumes one request size")
		case c.PromptTokens != sc.Clusters[0].PromptTokens || c.OutputTokens != sc.Clusters[0].OutputTokens:
			return nil, liveErr(field, fmt.Sprintf("prompt %d output %d", c.PromptTokens, c.OutputTokens), "want the same token lengths as clusters[0]")
		case c.PromptTokens < 5 || c.PromptTokens > 2048:
			return nil, liveErr(field+".prompt_tokens", c.PromptTokens, "want 5..2048 (the load generator's prompt sizes)")
		case !messages.ValidName(c.Name) || !messages.ValidName(c.Region):
			return nil, liveErr(field+".name", c.Name, "want names of A-Z a-z 0-9 _ - (NATS tokens)")
		}
	}
	prompt, output := liveTokens(sc)
	types := map[string]*scenario.EngineType{}
	for k := range sc.EngineTypes {
		t := &sc.EngineTypes[k]
		t0 := &sc.EngineTypes[0]
		field := fmt.Sprintf("engine_types[%d]", k)
		switch {
		case t.TBTPerKTokenMs != 0:
			return nil, liveErr(field+".tbt_per_ktoken_ms", t.TBTPerKTokenMs, "want 0: the live engines' step time does not grow with the context")
		case t.PrefillMsPerToken != t0.PrefillMsPerToken || t.TBTBaseMs != t0.TBTBaseMs || t.TBTPerRequestMs != t0.TBTPerRequestMs:
			return nil, liveErr(field, t.Name, "want the prefill and decode times of engine_types[0]: the live stack has one speed")
		case t.KVBlocks < t.MaxBatch*((prompt+output+511)/512):
			return nil, liveErr(field+".kv_blocks", t.KVBlocks, "want at least max_batch × %d blocks: the live engines' KV cache never binds before the batch", (prompt+output+511)/512)
		}
		types[t.Name] = t
	}
	t0 := &sc.EngineTypes[0]
	f := &stack.File{
		Model:   LiveModel,
		Network: stack.Network{IntraRegionMs: sc.Network.LocalMs, InterRegionMs: sc.Network.RemoteMs},
		Sim: stack.Sim{OutputTokens: output, PromptTokens: prompt, BaseTBTMs: t0.TBTBaseMs,
			TBTGrowthMs: t0.TBTPerRequestMs, PrefillMsPerToken: t0.PrefillMsPerToken},
	}
	for _, c := range sc.Clusters {
		rate := 0.0
		switch {
		case c.Poisson != nil:
			rate = c.Poisson.Rate
		case c.Bursts != nil:
			b := c.Bursts
			rate = (b.BurstRate*b.BurstS + b.Rate*(b.EveryS-b.BurstS)) / b.EveryS
		}
		f.Clusters = append(f.Clusters, stack.Cluster{Name: c.Name, Region: c.Region, DemandRPS: rate, Router: "127.0.0.1:0"})
	}
	for k := range sc.Engines {
		e := &sc.Engines[k]
		t := types[e.Type]
		eo := liveEngineOptions(f, t.MaxBatch)
		capRPS := enginesim.Capacity(eo)
		eo.MaxBatch = 0
		if b, err := enginesim.BatchForCapacity(eo, capRPS); err != nil || b != t.MaxBatch {
			return nil, liveErr(fmt.Sprintf("engines[%d]", k), e.Name, "the engine simulator derives batch %d, not %d, from capacity %.3f req/s (%v)", b, t.MaxBatch, capRPS, err)
		}
		for _, n := range e.Names() {
			if !messages.ValidName(n) || !messages.ValidName(e.Region) {
				return nil, liveErr(fmt.Sprintf("engines[%d].name", k), n, "want names of A-Z a-z 0-9 _ - (NATS tokens)")
			}
			f.Engines = append(f.Engines, stack.Engine{Name: n, Region: e.Region, CapacityRPS: capRPS})
		}
	}
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("%w: derived stack: %v", ErrLiveScenario, err)
	}
	return f, nil
}

// liveEngineOptions are the engine simulator options the stack builds from f
// for an engine of batch b.
func liveEngineOptions(f *stack.File, b int) enginesim.Options {
	return enginesim.Options{Name: "e", Model: f.Model, MaxBatch: b, OutputTokens: f.Sim.OutputTokens,
		PromptTokens: f.Sim.PromptTokens, BaseTBTMs: f.Sim.BaseTBTMs, TBTGrowthMs: f.Sim.TBTGrowthMs,
		PrefillMsPerToken: f.Sim.PrefillMsPerToken}
}

// loadgenPromptTokens is the PromptTokens to give the load generator so that
// the engine simulator counts p prompt tokens: the load generator sends
// 4 bytes per token of user content (16 at least), the engine counts
// ⌈(len("user") + content bytes) / 4⌉ tokens.
func loadgenPromptTokens(p int) int { return max(4, p-1) }

// RunLive runs the live check on sc: the live stack and the simulator on
// the same arrivals, compared with the tolerances of opts.
func RunLive(ctx context.Context, sc *scenario.Scenario, opts LiveOptions) (*LiveComparison, error) {
	file, err := LiveStackFile(sc)
	if err != nil {
		return nil, err
	}
	seed := sc.Seed
	if opts.SeedSet {
		seed = opts.Seed
	}
	if opts.Tolerance == (LiveTolerance{}) {
		opts.Tolerance = DefaultLiveTolerance()
	}
	if opts.CalibrationRequests == 0 {
		opts.CalibrationRequests = 4000
	}
	arrivals, err := sc.Arrivals(seed)
	if err != nil {
		return nil, err
	}
	if len(arrivals) == 0 {
		return nil, fmt.Errorf("sim: scenario %s generates no requests", sc.Name)
	}
	simSide, err := sim.RunLiveSide(ctx, sc, arrivals, seed, opts.CalibrationRequests)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	liveSide, err := runLiveSide(ctx, sc, file, arrivals, seed, opts)
	if err != nil {
		return nil, err
	}
	cmp := &LiveComparison{Scenario: sc.Name, Seed: seed, WarmupS: sc.WarmupS, Tolerance: opts.Tolerance,
		Live: *liveSide, Sim: *simSide, WallS: time.Since(start).Seconds()}
	f, err := sim.Layout(sc, arrivals)
	if err != nil {
		return nil, err
	}
	cmp.MeasuredS = (f.MeasureToMs - f.MeasureFromMs) / 1000
	cmp.Clusters = append(cmp.Clusters, f.Clusters...)
	cmp.Engines = append(cmp.Engines, f.Engines...)
	cmp.compare()
	return cmp, nil
}

// liveRecord is one request as the live client saw it.
type liveRecord struct {
	sent         time.Time
	headers, end time.Time
	status       int
	engine       string
	err          bool
	ended, done  bool
}

// recorder is an http.RoundTripper that times every request the load
// generator sends: the response headers (which the engine simulator sends
// with the first token of a stream) and the end of the body.
type recorder struct {
	base http.RoundTripper
	mu   sync.Mutex
	recs []*liveRecord
	done atomic.Int64
}

func (rc *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	rec := &liveRecord{sent: time.Now()}
	rc.mu.Lock()
	rc.recs = append(rc.recs, rec)
	rc.mu.Unlock()
	resp, err := rc.base.RoundTrip(req)
	now := time.Now()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if err != nil {
		rec.err, rec.done = true, true
		rc.done.Add(1)
		return nil, err
	}
	rec.headers, rec.status, rec.engine = now, resp.StatusCode, resp.Header.Get("x-switchyard-engine")
	resp.Body = &recordedBody{ReadCloser: resp.Body, rc: rc, rec: rec}
	return resp, nil
}

// recordedBody marks its record done at the body's end (EOF or Close).
type recordedBody struct {
	io.ReadCloser
	rc  *recorder
	rec *liveRecord
}

func (b *recordedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.finish(err == io.EOF)
	}
	return n, err
}

func (b *recordedBody) Close() error {
	b.finish(false)
	return b.ReadCloser.Close()
}

func (b *recordedBody) finish(eof bool) {
	b.rc.mu.Lock()
	defer b.rc.mu.Unlock()
	if b.rec.done {
		return
	}
	b.rec.done, b.rec.ended, b.rec.end = true, eof, time.Now()
	b.rc.done.Add(1)
}

// runLiveSide starts the stack, sends each cluster's arrivals through its
// router and measures what came back.
func runLiveSide(ctx context.Context, sc *scenario.Scenario, file *stack.File, arrivals []scenario.Arrival, seed uint64, opts LiveOptions) (*sim.LiveSide, error) {
	dir := opts.DataDir
	if dir == "" {
		d, err := os.MkdirTemp("", "switchyard-live-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	// The optimizer plans to the switchyard policy's target utilisation, and
	// an engine type's own where it has one, as the simulator's control loop
	// does.
	var engineTU map[string]float64
	for k := range sc.Engines {
		e := &sc.Engines[k]
		for t := range sc.EngineTypes {
			if tu := sc.EngineTypes[t].TargetUtilisation; sc.EngineTypes[t].Name == e.Type && tu > 0 {
				if engineTU == nil {
					engineTU = map[string]float64{}
				}
				for _, n := range e.Names() {
					engineTU[n] = tu
				}
			}
		}
	}
	st, err := stack.Start(ctx, stack.Options{File: file, DataDir: dir, NATSPort: -1, RouterAddr: "127.0.0.1:0",
		SignalInterval: time.Duration(sc.SignalPeriodMs * float64(time.Millisecond)), Logger: opts.Logger,
		Optimizer: optimizersvc.Options{TargetUtilisation: sc.Policies.Switchyard.TargetUtilisation, EngineTargetUtilisation: engineTU}})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	side := &sim.LiveSide{Shares: map[string]map[string]float64{}, CapacityRPS: map[string]float64{}}
	for _, e := range file.Engines {
		side.CapacityRPS[e.Name] = e.CapacityRPS
	}
	// Wait until every router listens and holds a snapshot, as a deployed
	// stack would before taking traffic.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ready := true
		for _, r := range st.Routers() {
			if _, ok := r.Store().Snapshot(file.Model); !ok || r.Addr() == "" {
				ready = false
			}
		}
		if ready {
			break
		}
		if time.Now().After(deadline) {
			return nil, errors.New("sim: live check: the routers hold no snapshot after 30 s")
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case err := <-st.Errors():
			return nil, err
		case <-time.After(50 * time.Millisecond):
		}
	}

	nc := len(sc.Clusters)
	reqs := make([][]workload.Request, nc)
	prompt, _ := liveTokens(sc)
	for q := range arrivals {
		a := &arrivals[q]
		// A distinct session per request: the requests' bodies are alike, and
		// the router would otherwise give them all one affinity key; the
		// simulator spreads keyless requests the same way.
		reqs[a.Cluster] = append(reqs[a.Cluster], workload.Request{At: time.Duration(a.AtMs * float64(time.Millisecond)),
			PromptTokens: loadgenPromptTokens(prompt), OutputTokens: int(a.Output), Session: uint64(q + 1)})
	}
	recs := make([]*recorder, nc)
	sums := make([]*loadgen.Summary, nc)
	errs := make([]error, nc)
	start := time.Now()
	stopProgress := liveProgress(opts.Progress, start, sc.DurationS, recs)
	stopProbe := timerProbe()
	var wg sync.WaitGroup
	for c := range nc {
		recs[c] = &recorder{base: &http.Transport{MaxIdleConnsPerHost: 1024, IdleConnTimeout: 30 * time.Second}}
		client := &http.Client{Timeout: 2 * time.Minute, Transport: recs[c]}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer client.CloseIdleConnections()
			sums[c], errs[c] = loadgen.Run(ctx, loadgen.Options{URL: "http://" + st.Routers()[c].Addr(), Model: file.Model,
				Requests: reqs[c], StreamFraction: 1, Seed: seed + uint64(c), Client: client, MaxInFlight: 4000})
		}()
	}
	wg.Wait()
	late := stopProbe()
	stopProgress()
	side.EngineTTFTMs, side.EngineTBTMs = map[string]float64{}, map[string]float64{}
	for _, e := range st.Engines() {
		es := e.Stats()
		side.EngineTTFTMs[e.Name()] = float64(es.MeanTTFT) / float64(time.Millisecond)
		side.EngineTBTMs[e.Name()] = float64(es.MeanTBT) / float64(time.Millisecond)
	}
	side.TimerLateP50Ms, side.TimerLateP99Ms = quantile64(late, 0.5), quantile64(late, 0.99)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("sim: live check: %w", ctx.Err())
	}

	from, to := sc.WarmupS*1000, math.Inf(1)
	if sc.DurationS > 0 {
		to = sc.DurationS * 1000
	}
	var e2e, ttft []float64
	f, err := sim.Layout(sc, arrivals)
	if err != nil {
		return nil, err
	}
	engIdx := map[string]int{}
	for j, name := range f.Engines {
		engIdx[name] = j
	}
	for c := range nc {
		counts := map[string]int{}
		served := 0
		for _, rec := range recs[c].recs {
			at := float64(rec.sent.Sub(start)) / float64(time.Millisecond)
			if at < from || at >= to {
				continue
			}
			side.Requests++
			j, known := engIdx[rec.engine]
			switch {
			case rec.status == http.StatusTooManyRequests:
				side.Shed++
			case rec.err || rec.status != http.StatusOK || !rec.ended || !known:
				side.Failed++
			default:
				// The live stack runs on one machine: the modelled network
				// round trip is added as the simulator adds it.
				rtt := 2 * f.OneWayMs[c][j]
				e2e = append(e2e, float64(rec.end.Sub(rec.sent))/float64(time.Millisecond)+rtt)
				ttft = append(ttft, float64(rec.headers.Sub(rec.sent))/float64(time.Millisecond)+rtt)
				counts[rec.engine]++
				served++
				side.OK++
			}
		}
		// Requests the generator dropped never reached the transport.
		side.Failed += sums[c].Dropped
		side.Requests += sums[c].Dropped
		row := map[string]float64{}
		for _, name := range f.Engines {
			if served > 0 {
				row[name] = float64(counts[name]) / float64(served)
			}
		}
		side.Shares[f.Clusters[c]] = row
	}
	slices.Sort(e2e)
	slices.Sort(ttft)
	side.E2EMeanMs = mean(e2e)
	side.E2EP50Ms, side.E2EP99Ms = quantile64(e2e, 0.5), quantile64(e2e, 0.99)
	side.TTFTP50Ms, side.TTFTP99Ms = quantile64(ttft, 0.5), quantile64(ttft, 0.99)
	return side, nil
}

// timerProbe measures, until the returned function is called, how late
// 1 ms sleeps wake up; it returns the sorted lateness in ms.
func timerProbe() func() []float64 {
	stop := make(chan struct{})
	out := make(chan []float64, 1)
	go func() {
		var late []float64
		for {
			select {
			case <-stop:
				slices.Sort(late)
				out <- late
				return
			default:
			}
			t := time.Now()
			time.Sleep(time.Millisecond)
			late = append(late, float64(time.Since(t)-time.Millisecond)/float64(time.Millisecond))
		}
	}()
	return func() []float64 { close(stop); return <-out }
}

func liveProgress(w io.Writer, start time.Time, durationS float64, recs []*recorder) func() {
	if w == nil {
		return func() {}
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			sent, finished := 0, int64(0)
			for _, rc := range recs {
				if rc == nil {
					continue
				}
				rc.mu.Lock()
				sent += len(rc.recs)
				rc.mu.Unlock()
				finished += rc.done.Load()
			}
			fmt.Fprintf(w, "live: %3.0f s of %.0f s: %d requests sent, %d finished\n", time.Since(start).Seconds(), durationS, sent, finished)
		}
	}()
	return func() { close(stop); <-done }
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// quantile64 is quantile on sorted float64s.
func quantile64(s []float64, q float64) float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	k := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(k, len(s)-1))]
}

// compare fills the rows and the verdict.
func (c *LiveComparison) compare() {
	tol := c.Tolerance
	c.OK = true
	add := func(row LiveRow) {
		if row.Tolerance > 0 && !row.OK {
			c.OK = false
		}
		c.Rows = append(c.Rows, row)
	}
	rel := func(metric string, live, sim, tolerance float64) LiveRow {
		d := live/sim - 1
		return LiveRow{Metric: metric, Live: live, Sim: sim, Diff: d, Relative: true, Tolerance: tolerance, OK: math.Abs(d) <= tolerance}
	}
	add(rel("e2e mean ms", c.Live.E2EMeanMs, c.Sim.E2EMeanMs, tol.E2EMean))
	add(rel("e2e p50 ms", c.Live.E2EP50Ms, c.Sim.E2EP50Ms, tol.E2EP50))
	add(rel("e2e p99 ms", c.Live.E2EP99Ms, c.Sim.E2EP99Ms, tol.E2EP99))
	tt := rel("TTFT p50 ms", c.Live.TTFTP50Ms, c.Sim.TTFTP50Ms, tol.TTFTP50)
	if !tt.OK && math.Abs(c.Live.TTFTP50Ms-c.Sim.TTFTP50Ms) <= tol.TTFTP50AbsMs {
		tt.OK, tt.Note = true, fmt.Sprintf("within %g ms", tol.TTFTP50AbsMs)
	}
	add(tt)
	p99 := rel("TTFT p99 ms", c.Live.TTFTP99Ms, c.Sim.TTFTP99Ms, 0)
	p99.OK = true
	add(p99)
	frac := func(n, of int) float64 {
		if of == 0 {
			return 0
		}
		return float64(n) / float64(of)
	}
	add(LiveRow{Metric: "requests", Live: float64(c.Live.Requests), Sim: float64(c.Sim.Requests),
		Diff: float64(c.Live.Requests - c.Sim.Requests), OK: true})
	ls, ss := frac(c.Live.Shed, c.Live.Requests), frac(c.Sim.Shed, c.Sim.Requests)
	add(LiveRow{Metric: "shed share", Live: ls, Sim: ss, Diff: ls - ss, Tolerance: tol.ShedPoints, OK: math.Abs(ls-ss) <= tol.ShedPoints})
	lf, sf := frac(c.Live.Failed, c.Live.Requests), frac(c.Sim.Failed, c.Sim.Requests)
	add(LiveRow{Metric: "failed share", Live: lf, Sim: sf, Diff: lf - sf, Tolerance: tol.Failures, OK: lf <= tol.Failures})
	for _, cl := range c.Clusters {
		for _, e := range c.Engines {
			l, s := c.Live.Shares[cl][e], c.Sim.Shares[cl][e]
			add(LiveRow{Metric: "share " + cl + "→" + e, Live: l, Sim: s, Diff: l - s, Tolerance: tol.SharePoints, OK: math.Abs(l-s) <= tol.SharePoints})
		}
	}
}

// busyHostMs is the timer lateness p99 above which WriteTable warns that the
// host was too busy: the engine simulator absorbs up to 2 ms of lateness per
// step without drifting.
const busyHostMs = 2.0

// WriteTable prints the comparison for people.
func (c *LiveComparison) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "live check: scenario %s, seed %d: %.0f s measured after %.0f s of warm-up (live run %.0f s wall)\n",
		c.Scenario, c.Seed, c.MeasuredS, c.WarmupS, c.WallS)
	b.WriteString("engine capacity, req/s (sim: calibrated; live: signalled):")
	for _, e := range c.Engines {
		fmt.Fprintf(&b, "  %s %.1f / %.1f", e, c.Sim.CapacityRPS[e], c.Live.CapacityRPS[e])
	}
	b.WriteString("\n\n")
	fmt.Fprintf(&b, "%-22s %10s %10s %10s %12s  %s\n", "metric", "live", "sim", "diff", "tolerance", "")
	for _, r := range c.Rows {
		var lv, sv, dv, tv string
		switch {
		case strings.HasPrefix(r.Metric, "share") || strings.HasSuffix(r.Metric, "share"):
			lv, sv = fmt.Sprintf("%.1f%%", 100*r.Live), fmt.Sprintf("%.1f%%", 100*r.Sim)
			dv = fmt.Sprintf("%+.1f pt", 100*r.Diff)
			tv = fmt.Sprintf("±%.0f pt", 100*r.Tolerance)
			if strings.HasSuffix(r.Metric, "share") {
				tv = fmt.Sprintf("%.0f pt", 100*r.Tolerance)
			}
		case r.Relative:
			lv, sv = fmt.Sprintf("%.1f", r.Live), fmt.Sprintf("%.1f", r.Sim)
			dv = fmt.Sprintf("%+.1f%%", 100*r.Diff)
			tv = fmt.Sprintf("±%.0f%%", 100*r.Tolerance)
		default:
			lv, sv, dv = fmt.Sprintf("%.0f", r.Live), fmt.Sprintf("%.0f", r.Sim), fmt.Sprintf("%+.0f", r.Diff)
		}
		verdict := "ok"
		switch {
		case r.Tolerance == 0:
			tv, verdict = "-", ""
		case !r.OK:
			verdict = "OUT"
		case r.Note != "":
			verdict = "ok (" + r.Note + ")"
		}
		fmt.Fprintf(&b, "%-22s %10s %10s %10s %12s  %s\n", r.Metric, lv, sv, dv, tv, verdict)
	}
	b.WriteString("\nlive engines' own means over the whole run (no router, HTTP or network):")
	for _, e := range c.Engines {
		fmt.Fprintf(&b, "  %s TTFT %.1f ms TBT %.2f ms", e, c.Live.EngineTTFTMs[e], c.Live.EngineTBTMs[e])
	}
	fmt.Fprintf(&b, "\nhost scheduling delay during the live run (a 1 ms sleep woke late by): p50 %.2f ms, p99 %.2f ms\n",
		c.Live.TimerLateP50Ms, c.Live.TimerLateP99Ms)
	if c.Live.TimerLateP99Ms > busyHostMs {
		fmt.Fprintf(&b, "warning: the host was busy (p99 above %g ms): every engine step and proxied token was delayed as much, so the live latencies are inflated\n", busyHostMs)
	}
	if c.OK {
		b.WriteString("\nverdict: the live stack agrees with the simulator within tolerance\n")
	} else {
		b.WriteString("\nverdict: OUT OF TOLERANCE: " + strings.Join(c.Failures(), "; ") + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Failures lists the checked rows out of tolerance.
func (c *LiveComparison) Failures() []string {
	var out []string
	for _, r := range c.Rows {
		if r.Tolerance > 0 && !r.OK {
			out = append(out, r.Metric)
		}
	}
	return out
}

// WriteJSON writes the comparison as indented JSON.
func (c *LiveComparison) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	cp := *c
	cp.Rows = slices.Clone(c.Rows)
	for k := range cp.Rows {
		for _, p := range []*float64{&cp.Rows[k].Live, &cp.Rows[k].Sim, &cp.Rows[k].Diff} {
			if math.IsNaN(*p) || math.IsInf(*p, 0) {
				*p = -1
			}
		}
	}
	for _, s := range []*sim.LiveSide{&cp.Live, &cp.Sim} {
		for _, p := range []*float64{&s.E2EMeanMs, &s.E2EP50Ms, &s.E2EP99Ms, &s.TTFTP50Ms, &s.TTFTP99Ms} {
			if math.IsNaN(*p) {
				*p = -1
			}
		}
	}
	return enc.Encode(&cp)
}
