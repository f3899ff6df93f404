package stack_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/guard"
	"github.com/switchyard-dev/switchyard/router/live"
	"github.com/switchyard-dev/switchyard/services/aggregator"
	"github.com/switchyard-dev/switchyard/services/optimizersvc"
	"github.com/switchyard-dev/switchyard/stack"
	"github.com/switchyard-dev/switchyard/testenv"
)

// relModel is the model of the reliability stacks.
const relModel = "llama"

// relOutputTokens is the output length of every reliability request: short,
// so that the two shared cores of CI can run the load.
const relOutputTokens = 16

// relFile returns a stack file with the reduced simulator parameters of the
// reliability scenarios: 16 output tokens, 64-token prompts, 10 ms between
// tokens, so that an engine of 20–30 req/s needs a batch of 4–5.
func relFile(clusters []stack.Cluster, engines []stack.Engine) *stack.File {
	return &stack.File{
		Model:    relModel,
		Network:  stack.Network{IntraRegionMs: 1, InterRegionMs: 5},
		Sim:      stack.Sim{OutputTokens: relOutputTokens, PromptTokens: 64, BaseTBTMs: 10, TBTGrowthMs: 0.05, PrefillMsPerToken: 0.02},
		Clusters: clusters,
		Engines:  engines,
	}
}

// relEngines returns n engines e1..en in region with capacity rps each.
func relEngines(n int, region string, rps float64) []stack.Engine {
	out := make([]stack.Engine, n)
	for i := range out {
		out[i] = stack.Engine{Name: fmt.Sprintf("e%d", i+1), Region: region, CapacityRPS: rps}
	}
	return out
}

// relRoles is how many of a deployment's separate processes share the
// reliability tests' one process on a request's path: the clients, the
// router and the engines.
const relRoles = 3

// relProcs gives the test process relRoles times its Ps (GOMAXPROCS, by
// default the host's cores or its CPU quota) until the test ends. In a
// deployment the clients, the router and the engines are separate
// processes, each with its own Ps, and the kernel interleaves their
// threads; in one process with the host's Ps they share Go's run queues, so
// that a router goroutine woken for a new request waits behind every
// goroutine made runnable before it — at each decode step, one engine's 64
// token writes, the router's 64 relays and the clients' 64 reads. On the
// 2-core host that put the overload scenario's shed answers' p99 at
// 1.0–3.9 ms (5.15 ms in one CI run), against 0.6–1.6 ms with 6 Ps
// (BENCHMARKS.md, reliability): queueing that comes from sharing a process with engines
// and clients, which no deployed router does. The cores stay the host's:
// the roles still compete for them, through the kernel's scheduler, as
// separate processes do.
func relProcs(t *testing.T) {
	prev := runtime.GOMAXPROCS(0)
	runtime.GOMAXPROCS(relRoles * prev)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
}

// relStart starts a stack for a reliability scenario with fast signals (200
// ms), a fast aggregator and the given optimizer options, and waits until
// every router holds a snapshot naming every engine that is up.
func relStart(t *testing.T, ctx context.Context, f *stack.File, opt optimizersvc.Options, noRouters bool) *stack.Stack {
	t.Helper()
	relProcs(t)
	s, err := stack.Start(ctx, stack.Options{File: f, DataDir: t.TempDir(), NATSPort: -1, RouterAddr: "127.0.0.1:0",
		SignalInterval: 200 * time.Millisecond, NoRouters: noRouters, Logger: zerolog.Nop(), Optimizer: opt,
		Aggregator: aggregator.Options{StaleAfter: time.Second, DownAfter: 3 * time.Second, WriteInterval: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if !noRouters {
		relWaitReady(t, s, s.Routers())
	}
	return s
}

// relRouter runs cluster A's router on the stack's NATS connection
// with the given protection options, which stack.Options does not expose;
// it stops when the test ends.
func relRouter(t *testing.T, ctx context.Context, s *stack.Stack, prot live.ProtectionOptions) *router.Service {
	t.Helper()
	rt, err := router.NewService(router.ServiceOptions{Conn: s.Conn(), Cluster: "A", Router: "A-1", HTTPAddr: "127.0.0.1:0", Protection: prot})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rt.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })
	return rt
}

// relWaitReady waits until every router holds a snapshot and knows every
// engine's endpoints (before that, a router may pick an engine it cannot
// reach yet: a start-up transient the scenarios do not measure).
func relWaitReady(t *testing.T, s *stack.Stack, rs []*router.Service) {
	t.Helper()
	testenv.WaitFor(t, 15*time.Second, "every router holds a snapshot and every engine's endpoints", func() bool {
		for _, r := range rs {
			if _, ok := r.Store().Snapshot(relModel); !ok {
				return false
			}
			for _, e := range s.Engines() {
				if ep, ok := r.Signals().Endpoints(relModel, e.Name()); !ok || ep.URL == "" {
					return false
				}
			}
		}
		return true
	})
}

// relCapacity is the sum of the engines' real capacities (the simulator's,
// at or a little above the stack file's figures).
func relCapacity(s *stack.Stack) float64 {
	c := 0.0
	for _, e := range s.Engines() {
		c += e.Capacity()
	}
	return c
}

// relResult is one client request of a reliability run.
type relResult struct {
	at     time.Duration // when it was sent, from the run's origin
	prio   string
	status int           // HTTP status; 0 for a transport error, -1 when not sent (client bound)
	head   time.Duration // to the response headers
	ttft   time.Duration // to the first SSE data line (successes)
	e2e    time.Duration
	engine string
	err    string
}

func (r relResult) ok() bool   { return r.status == http.StatusOK && r.err == "" }
func (r relResult) shed() bool { return r.status == http.StatusTooManyRequests }

// relLoad is one open-loop Poisson stream of streamed chat completions to a router.
type relLoad struct {
	URL      string
	Rate     float64 // req/s
	From, To time.Duration
	Priority string // x-switchyard-priority; empty sends none
	Seed     uint64
}

// relClient is the HTTP client of the reliability runs.
func relClient() *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConns: 2048, MaxIdleConnsPerHost: 1024,
		IdleConnTimeout: 30 * time.Second}}
}

// relMaxInFlight bounds each load's concurrent requests.
const relMaxInFlight = 600

// relRun sends every load concurrently, each from origin+From to origin+To,
// and returns every request's result once all have ended. Arrivals are
// Poisson; each request carries a fresh session id so that keys spread.
func relRun(ctx context.Context, client *http.Client, origin time.Time, loads ...relLoad) []relResult {
	var mu sync.Mutex
	var out []relResult
	var wg sync.WaitGroup
	prompt := strings.Repeat("x", 256) // 64 prompt tokens
	for li, l := range loads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(l.Seed, uint64(li)+1))
			slots := make(chan struct{}, relMaxInFlight)
			var rw sync.WaitGroup
			defer rw.Wait()
			next := l.From
			for n := 0; ; n++ {
				next += time.Duration(rng.ExpFloat64() / l.Rate * float64(time.Second))
				if next >= l.To {
					return
				}
				if wait := time.Until(origin.Add(next)); wait > 0 {
					tm := time.NewTimer(wait)
					select {
					case <-ctx.Done():
						tm.Stop()
						return
					case <-tm.C:
					}
				}
				at := next
				select {
				case slots <- struct{}{}:
				default:
					mu.Lock()
					out = append(out, relResult{at: at, prio: l.Priority, status: -1, err: "client in-flight bound"})
					mu.Unlock()
					continue
				}
				session := fmt.Sprintf("s-%d-%d-%d", l.Seed, li, n)
				rw.Add(1)
				go func() {
					defer rw.Done()
					defer func() { <-slots }()
					r := relSend(ctx, client, l.URL, session, l.Priority, prompt)
					r.at = at
					mu.Lock()
					out = append(out, r)
					mu.Unlock()
				}()
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b relResult) int { return int(a.at - b.at) })
	return out
}

// relSend sends one streamed chat completion and reads it to the end.
func relSend(ctx context.Context, client *http.Client, base, session, prio, prompt string) relResult {
	res := relResult{prio: prio}
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, relModel, relOutputTokens, prompt)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		res.err = err.Error()
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-Id", session)
	if prio != "" {
		req.Header.Set(messages.HeaderPriority, prio)
	}
	start := time.Now()
	resp, err := client.Do(req)
	res.head = time.Since(start)
	if err != nil {
		res.err = err.Error()
		return res
	}
	defer resp.Body.Close()
	res.status = resp.StatusCode
	res.engine = resp.Header.Get("X-Switchyard-Engine")
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		res.err = fmt.Sprintf("status %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
		res.e2e = time.Since(start)
		return res
	}
	br := bufio.NewReader(resp.Body)
	done := false
	for {
		line, err := br.ReadBytes('\n')
		if bytes.HasPrefix(line, []byte("data:")) {
			if res.ttft == 0 {
				res.ttft = time.Since(start)
			}
			if bytes.Contains(line, []byte("[DONE]")) {
				done = true
			}
		}
		if err != nil {
			if err != io.EOF {
				res.err = "stream: " + err.Error()
			} else if !done {
				res.err = "stream ended without [DONE]"
			}
			break
		}
	}
	res.e2e = time.Since(start)
	return res
}

// relStats summarises results.
type relStats struct {
	sent, ok, shed, failed, unsent int
	errs                           []string
}

func relSummarise(rs []relResult) relStats {
	var s relStats
	seen := map[string]bool{}
	for _, r := range rs {
		switch {
		case r.status == -1:
			s.unsent++
			continue
		case r.ok():
			s.ok++
		case r.shed():
			s.shed++
		default:
			s.failed++
			if k := relErrKey(r.err); !seen[k] && len(s.errs) < 4 {
				seen[k] = true
				s.errs = append(s.errs, r.err)
			}
		}
		s.sent++
	}
	return s
}

func relErrKey(e string) string {
	if len(e) > 40 {
		return e[:40]
	}
	return e
}

// relWindow returns the results sent in [from, to).
func relWindow(rs []relResult, from, to time.Duration) []relResult {
	var out []relResult
	for _, r := range rs {
		if r.at >= from && r.at < to {
			out = append(out, r)
		}
	}
	return out
}

// relPct returns the q-quantile of ds (0 when empty).
func relPct(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(math.Ceil(q*float64(len(ds))))-1)]
}

// relSample is one router's snapshot at one time.
type relSample struct {
	at         time.Duration
	generation uint64
	weights    map[string]float64
	shed       float64
	demand     float64 // the snapshot's demand, req/s
}

// relSampler records every router's installed snapshot every 20 ms.
type relSampler struct {
	mu      sync.Mutex
	samples [][]relSample // by router
	stop    func()
}

func relStartSampler(ctx context.Context, rs []*router.Service, origin time.Time) *relSampler {
	sm := &relSampler{samples: make([][]relSample, len(rs))}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	sm.stop = func() { cancel(); <-done }
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			at := time.Since(origin)
			sm.mu.Lock()
			for i, r := range rs {
				snap, ok := r.Store().Snapshot(relModel)
				if !ok {
					continue
				}
				sm.samples[i] = append(sm.samples[i], relSample{at: at, generation: snap.Generation, weights: snap.Weights, shed: snap.ShedFraction,
					demand: snap.DemandRPS})
			}
			sm.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return sm
}

// of returns router i's samples.
func (sm *relSampler) of(i int) []relSample {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return slices.Clone(sm.samples[i])
}

// firstBelow returns when, at or after from, router i's summed weight of
// engines first fell below limit and stayed there until until; -1 if never.
// relShare is the share of the fleet's demand the routers' snapshots plan
// for one engine at one sample time.
type relShare struct {
	at    time.Duration
	share float64
}

// plannedShare returns, for every sample time from from on at which every
// router held a snapshot, Σ weight × demand / Σ demand of engine over the
// routers' snapshots: the share of all clusters' traffic planned for it.
func (sm *relSampler) plannedShare(engine string, from time.Duration) []relShare {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	type acc struct {
		n         int
		rate, dem float64
	}
	by := map[time.Duration]*acc{}
	for _, rs := range sm.samples {
		for _, s := range rs {
			if s.at < from {
				continue
			}
			a := by[s.at]
			if a == nil {
				a = &acc{}
				by[s.at] = a
			}
			a.n++
			a.rate += s.weights[engine] * s.demand
			a.dem += s.demand
		}
	}
	var out []relShare
	for at, a := range by {
		if a.n == len(sm.samples) && a.dem > 0 {
			out = append(out, relShare{at: at, share: a.rate / a.dem})
		}
	}
	slices.SortFunc(out, func(a, b relShare) int { return cmp.Compare(a.at, b.at) })
	return out
}

func (sm *relSampler) firstBelow(i int, engines []string, limit float64, from, until time.Duration) time.Duration {
	found := time.Duration(-1)
	for _, s := range sm.of(i) {
		if s.at < from || s.at > until {
			continue
		}
		w := 0.0
		for _, e := range engines {
			w += s.weights[e]
		}
		switch {
		case w < limit && found < 0:
			found = s.at
		case w >= limit:
			found = -1
		}
	}
	return found
}

// relArrived sums the requests the engines received.
func relArrived(s *stack.Stack) uint64 {
	var n uint64
	for _, e := range s.Engines() {
		n += e.Stats().Arrived
	}
	return n
}

// relPenalty reads penalty.<model>.<engine> from sy_engines.
func relPenalty(ctx context.Context, s *stack.Stack, engine string) (*messages.Penalty, error) {
	kv, err := relKV(ctx, s)
	if err != nil {
		return nil, err
	}
	e, err := kv.Get(ctx, "penalty."+relModel+"."+engine)
	if err != nil {
		return nil, err
	}
	var p messages.Penalty
	if err := messages.DecodeInto(e.Value(), &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// relKV opens sy_engines.
func relKV(ctx context.Context, s *stack.Stack) (jetstream.KeyValue, error) {
	js, err := jetstream.New(s.Conn())
	if err != nil {
		return nil, err
	}
	return js.KeyValue(ctx, "sy_engines")
}

// relFmtWeights formats weights in engine order.
func relFmtWeights(w map[string]float64) string {
	ks := make([]string, 0, len(w))
	for k := range w {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	var b strings.Builder
	for _, k := range ks {
		fmt.Fprintf(&b, "%s=%.3f ", k, w[k])
	}
	return strings.TrimSpace(b.String())
}

// relMet returns "met" or "NOT met".
func relMet(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// relFigure logs one row of the reliability table in a fixed form and
// fails the test when the criterion was not met.
func relFigure(t *testing.T, scenario, criterion, measured string, ok bool) {
	t.Helper()
	t.Logf("RELIABILITY | %s | %s | %s | %s", scenario, criterion, measured, relMet(ok))
	if !ok {
		t.Errorf("%s: %s: measured %s", scenario, criterion, measured)
	}
}

func relPctStr(num, den int) string {
	if den == 0 {
		return "n/a"
	}
	return strconv.FormatFloat(100*float64(num)/float64(den), 'f', 2, 64) + "%"
}

// relSince returns Unix ms ms as seconds after origin+at.
func relSince(origin time.Time, at time.Duration, ms int64) float64 {
	return time.UnixMilli(ms).Sub(origin.Add(at)).Seconds()
}

// relLogRouters logs each router's installed snapshot figures and shed counts.
func relLogRouters(t *testing.T, s *stack.Stack) {
	t.Helper()
	for _, r := range s.Routers() {
		relLogRouter(t, r)
	}
}

func relLogRouter(t *testing.T, r *router.Service) {
	t.Helper()
	snap, _ := r.Store().Snapshot(relModel)
	reg := r.Handler().Metrics()
	t.Logf("router %s: snapshot g%d demand %.1f req/s shed %.3f by priority %v; shed by admission %.0f, by snapshot %.0f; attempts %.0f, retries %.0f, suppressed %.0f, amplification (10 s) %.3f",
		r.Name(), snap.Generation, snap.DemandRPS, snap.ShedFraction, snap.ShedByPriority,
		testenv.MetricSum(t, reg, "switchyard_router_shed_total", map[string]string{"reason": "admission"}),
		testenv.MetricSum(t, reg, "switchyard_router_shed_total", map[string]string{"reason": "snapshot"}),
		testenv.MetricSum(t, reg, "switchyard_router_upstream_attempts_total", nil),
		testenv.MetricSum(t, reg, "switchyard_router_retries_total", nil),
		testenv.MetricSum(t, reg, "switchyard_router_retries_suppressed_total", nil),
		testenv.MetricSum(t, reg, "switchyard_router_retry_amplification", nil))
	f := guard.FiguresOf(&snap)
	t.Logf("router %s: predicted latency %v, utilisation %.2f, latency allotment (while the snapshot sheds nothing) %.1f in flight; latency by engine %v; utilisation by engine %v",
		r.Name(), f.Latency, f.Utilisation, guard.Allotment(f, 1, live.DefaultAdmissionSlack, live.DefaultMinInFlight),
		relFmtWeights(snap.LatencyMs), relFmtWeights(snap.Utilisation))
}

// relPerSecond formats, per second of the run, the count of results matching pick.
func relPerSecond(rs []relResult, end time.Duration, pick func(relResult) bool) string {
	var b strings.Builder
	for sec := time.Duration(0); sec < end; sec += time.Second {
		n := 0
		for _, r := range relWindow(rs, sec, sec+time.Second) {
			if pick(r) {
				n++
			}
		}
		fmt.Fprintf(&b, "%d ", n)
	}
	return strings.TrimSpace(b.String())
}

// relWarm drives loads (their From/To ignored) for d so that demand
// estimates, snapshots and admission allotments settle, and logs what the
// warm-up saw: a cold stack sheds by admission control for its first
// seconds, while the snapshots' demand catches up.
func relWarm(t *testing.T, ctx context.Context, s *stack.Stack, client *http.Client, d time.Duration, loads ...relLoad) {
	t.Helper()
	for i := range loads {
		loads[i].From, loads[i].To, loads[i].Seed = 0, d, loads[i].Seed+1000
	}
	rs := relRun(ctx, client, time.Now(), loads...)
	st := relSummarise(rs)
	t.Logf("warm-up (not measured) %v: %d requests, %d ok, %d failed, %d shed; shed per second %s",
		d, st.sent, st.ok, st.failed, st.shed, relPerSecond(rs, d, relResult.shed))
}

// relSkipUnderRace skips a reliability scenario under the race detector: its
// criteria are real-time figures (milliseconds, requests per second) that the
// detector's slowdown distorts. .ci/run runs them again without -race.
func relSkipUnderRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("real-time reliability figures; run without -race: go test -count=1 -run TestReliability ./stack/")
	}
}
