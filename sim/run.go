package sim

import (
	"context"
	"math"
	"math/rand/v2"

	"github.com/switchyard-dev/switchyard/batching"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/sim/kvcache"
	"github.com/switchyard-dev/switchyard/sim/scenario"
)

// Event kinds of the heap.
const (
	evArrive  uint8 = iota // request a.req reaches engine a.x
	evStep                 // engine a.x finishes its step a.gen
	evBounce               // request a.req returns to its router (refused or requeued)
	evSignal               // engines publish signals; the aggregator folds them in
	evControl              // policies recompute weights
	evSample               // close a time-series window
	evTimed                // scenario event a.x
)

type event struct {
	t    float64
	seq  uint64
	kind uint8
	x    int32
	req  int32
	gen  uint32
}

// eventHeap is a binary min-heap on (t, seq).
type eventHeap []event

func (h eventHeap) less(a, b int) bool {
	if h[a].t != h[b].t {
		return h[a].t < h[b].t
	}
	return h[a].seq < h[b].seq
}

func (h *eventHeap) push(e event) {
	*h = append(*h, e)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *eventHeap) pop() event {
	s := *h
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	s = s[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && s.less(r, l) {
			m = r
		}
		if !s.less(m, i) {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

// Request states.
const (
	rsPending uint8 = iota // at a router or on the wire
	rsQueued
	rsRunning
	rsDone
	rsShed
	rsFailed
)

type reqRun struct {
	engine   int32
	state    uint8
	tries    uint8
	hitTok   int32
	atEngine float64
	first    float64
}

// engine is one engine's live state in a run.
type engine struct {
	d     *engineDesc
	speed float64
	up    bool
	// batch is the engine's queue and running batch (arrival indexes).
	batch *batching.Batch[int32]
	gen   uint32
	kv    *kvcache.Cache
	// admit, first and done are the batch's callbacks for this engine.
	admit       func(q int32, alone bool) (batching.Admission, bool)
	first, done func(q int32)

	// signal accumulators since the last signal
	sArrived, sDone   int
	sTTFT, sTBT, sOut float64
	sTBTn             int
	window, measured  int64 // dispatched in the current sample window; after warmup
	latSum            float64
	latN              int64
}

// ewma is one of the aggregator's windows and whether it has a sample yet.
type ewma struct {
	messages.Window
	init bool
}

// add folds in v, observed dt seconds after the previous sample.
func (w *ewma) add(s messages.Smoother, v, dt float64) {
	s.Update(&w.Window, v, dt, !w.init)
	w.init = true
}

// routerDemand is the aggregator's view of a cluster's one router, folded
// from its counts every signal period as the aggregator folds a report.
type routerDemand struct {
	messages.RouterDemand
	init bool
}

// engineSignal is the aggregator's view of one engine.
type engineSignal struct {
	up              bool
	capacity        float64 // req/s, effective
	load, ttft, tbt ewma
	out, lat        ewma
	outstanding     int // queue + running at the last signal
	lastLat         float64
	lastLatValid    bool
	idleMs          float64
}

// run is one policy's simulation over the shared arrivals.
type run struct {
	f        *fleet
	arrivals []scenario.Arrival
	pol      policy
	rng      *rand.Rand
	now      float64
	seq      uint64
	heap     eventHeap
	next     int // next arrival
	reqs     []reqRun
	engines  []engine
	active   int
	progress func(float64)
	onFinish func(t float64) // calibration hook
	onSignal func(r *run)    // test hook, after each signal
	hitFloor []int32         // [arrival] cached prompt tokens at least (the bound's perfect cache)
	ctx      context.Context

	// router views
	inflight  [][]int32 // [cluster][engine] this router's requests in flight
	totalIn   []int32   // [cluster]
	localDown [][]bool  // [cluster][engine] learnt from a refusal
	sentSince [][]int32 // [cluster][engine] dispatched since the last signal
	// inflightAtSig is [cluster][engine] in flight when the last signal arrived
	inflightAtSig [][]int32
	spreadSeq     []uint64 // [cluster] keyless request counter
	routing       int32    // the request route is asking the policy for an engine

	// aggregator
	sig    []engineSignal
	demand []routerDemand // [cluster]
	// dReport is [cluster] the router's counts since the last signal: its
	// requests and their prompt tokens, as the router counts them at
	// admission (it counts no output tokens, as the router does not).
	dReport   []messages.RouterReport
	smooth    messages.Smoother
	sigPeriod float64

	m *metrics
}

func (r *run) push(e event) {
	r.seq++
	e.seq = r.seq
	r.heap.push(e)
}

// newRun prepares a run of pol over arrivals.
func newRun(f *fleet, arrivals []scenario.Arrival, pol policy, seed uint64) *run {
	r := &run{f: f, arrivals: arrivals, pol: pol, rng: rand.New(rand.NewPCG(seed, 0x5eed_5117))}
	r.reqs = make([]reqRun, len(arrivals))
	r.engines = make([]engine, len(f.engines))
	for j := range r.engines {
		d := &f.engines[j]
		r.engines[j] = engine{d: d, speed: 1, up: true, kv: kvcache.New(d.typ.KVBlocks),
			batch: batching.New[int32](engineCost(d.typ), d.typ.MaxBatch)}
		r.bindEngine(j)
	}
	nc, ne := len(f.clusters), len(f.engines)
	r.inflight = grid[int32](nc, ne)
	r.sentSince = grid[int32](nc, ne)
	r.inflightAtSig = grid[int32](nc, ne)
	r.localDown = grid[bool](nc, ne)
	r.totalIn = make([]int32, nc)
	r.spreadSeq = make([]uint64, nc)
	r.sig = make([]engineSignal, ne)
	for j := range r.sig {
		r.sig[j] = engineSignal{up: true, capacity: f.engines[j].capacity, idleMs: f.engines[j].idleMs}
	}
	r.demand = make([]routerDemand, nc)
	r.dReport = make([]messages.RouterReport, nc)
	r.sigPeriod = f.sc.SignalPeriodMs
	r.smooth = messages.DefaultSmoother()
	r.m = newMetrics(f)
	return r
}

func grid[T any](n, m int) [][]T {
	flat := make([]T, n*m)
	out := make([][]T, n)
	for i := range out {
		out[i] = flat[i*m : (i+1)*m : (i+1)*m]
	}
	return out
}

// down reports whether cluster c's router considers engine j unavailable.
func (r *run) down(c, j int) bool { return !r.sig[j].up || r.localDown[c][j] }

// simulate runs the event loop to the end.
func (r *run) simulate(periodic bool) {
	f := r.f
	if periodic {
		r.push(event{t: r.sigPeriod, kind: evSignal})
		r.push(event{t: f.sc.ControlPeriodMs, kind: evControl})
		r.push(event{t: f.sc.SamplePeriodMs, kind: evSample})
	}
	for k, te := range f.events {
		if te.kind != tDemand {
			r.push(event{t: te.at, kind: evTimed, x: int32(k)})
		}
	}
	r.pol.init(r)
	var count uint64
	for {
		var e event
		if r.next < len(r.arrivals) && (len(r.heap) == 0 || r.arrivals[r.next].AtMs <= r.heap[0].t) {
			a := r.next
			r.next++
			r.now = r.arrivals[a].AtMs
			if r.now > f.horizon {
				break
			}
			r.arrive(a)
		} else {
			if len(r.heap) == 0 {
				break
			}
			e = r.heap.pop()
			if e.t > f.horizon {
				break
			}
			r.now = e.t
			switch e.kind {
			case evArrive:
				r.engineArrive(int(e.x), e.req)
			case evStep:
				eng := &r.engines[e.x]
				if eng.gen == e.gen {
					r.stepEnd(int(e.x))
				}
			case evBounce:
				r.route(e.req)
			case evSignal:
				r.signal()
				if r.onSignal != nil {
					r.onSignal(r)
				}
				r.push(event{t: r.now + r.sigPeriod, kind: evSignal})
			case evControl:
				r.pol.control(r)
				r.push(event{t: r.now + f.sc.ControlPeriodMs, kind: evControl})
			case evSample:
				r.m.sample(r)
				r.push(event{t: r.now + f.sc.SamplePeriodMs, kind: evSample})
			case evTimed:
				r.timed(&f.events[e.x])
			}
		}
		if r.next >= len(r.arrivals) && r.active == 0 && r.now >= f.measureTo {
			break
		}
		count++
		if count&0xFFFF == 0 {
			if r.progress != nil {
				r.progress(math.Min(1, r.now/f.horizon))
			}
			if r.ctx != nil && r.ctx.Err() != nil {
				break
			}
		}
	}
	// Requests still in the system at the end are counted as failed.
	for i := range r.reqs {
		if s := r.reqs[i].state; s == rsPending || s == rsQueued || s == rsRunning {
			r.m.fail(r, int32(i))
		}
	}
	if periodic {
		r.m.sample(r)
	}
	if r.progress != nil {
		r.progress(1)
	}
}

// arrive handles a new request at its frontend cluster.
func (r *run) arrive(a int) {
	r.active++
	c := r.arrivals[a].Cluster
	r.dReport[c].Requests++
	r.dReport[c].PromptTokens += int64(r.arrivals[a].Prompt)
	r.m.arrived(r, int32(a))
	r.route(int32(a))
}

// route asks the policy for an engine and sends the request there.
func (r *run) route(q int32) {
	a := &r.arrivals[q]
	c := int(a.Cluster)
	rq := &r.reqs[q]
	r.routing = q
	j := r.pol.pick(r, c, a)
	if j < 0 {
		rq.state = rsShed
		r.active--
		r.m.shed(r, q)
		return
	}
	rq.engine = int32(j)
	rq.state = rsPending
	r.inflight[c][j]++
	r.totalIn[c]++
	r.sentSince[c][j]++
	r.push(event{t: r.now + r.f.oneWay[c][j], kind: evArrive, x: int32(j), req: q})
}

// Outcomes of an attempt, for guardedPolicy.attemptEnded.
const (
	attemptOK      uint8 = iota // the request finished on the engine
	attemptBroken               // the engine failed while the request ran
	attemptRefused              // the engine refused the request before its first token
)

// guardedPolicy is a policy whose routers keep state per request and per
// signal of their own (the router's guards): it hears of every signal and
// of the end of every attempt it routed, and decides whether a refused
// request is retried (at most 3 tries otherwise).
type guardedPolicy interface {
	policy
	signalled(r *run)
	attemptEnded(r *run, q int32, outcome uint8) (retry bool)
}

// release drops request q from its router's in-flight counts at the end of
// its attempt, and reports whether a refused request is retried.
func (r *run) release(q int32, outcome uint8) bool {
	c := r.arrivals[q].Cluster
	j := r.reqs[q].engine
	r.inflight[c][j]--
	r.totalIn[c]--
	if g, ok := r.pol.(guardedPolicy); ok {
		return g.attemptEnded(r, q, outcome)
	}
	return r.reqs[q].tries+1 < 3
}

// bounce sends a request that never got a token back to its router, which
// learns that the engine is down and routes it again while it retries.
func (r *run) bounce(q int32) {
	rq := &r.reqs[q]
	c := int(r.arrivals[q].Cluster)
	j := int(rq.engine)
	retry := r.release(q, attemptRefused)
	r.localDown[c][j] = true
	rq.tries++
	if !retry {
		rq.state = rsFailed
		r.active--
		r.m.fail(r, q)
		return
	}
	rq.state = rsPending
	r.push(event{t: r.now + r.f.oneWay[c][j], kind: evBounce, req: q})
}

// engineArrive queues request q on engine j (or refuses it when j is down).
func (r *run) engineArrive(j int, q int32) {
	e := &r.engines[j]
	if !e.up {
		r.bounce(q)
		return
	}
	rq := &r.reqs[q]
	rq.state = rsQueued
	rq.atEngine = r.now
	e.sArrived++
	e.window++
	if r.arrivals[q].AtMs >= r.f.measureFrom && r.arrivals[q].AtMs < r.f.measureTo {
		e.measured++
	}
	e.batch.Enqueue(q)
	if e.batch.Phase() == batching.Idle {
		r.startStep(j)
	}
}

// bindEngine makes engine j's batch callbacks: admission holds the
// request's blocks in the KV cache (a prefix hit costs no prefill, but the
// last prompt token is always computed), a prefill gives the first token,
// and a request's last token retires it.
func (r *run) bindEngine(j int) {
	e := &r.engines[j]
	e.admit = func(q int32, alone bool) (batching.Admission, bool) {
		a := &r.arrivals[q]
		hit, ok := e.kv.Acquire(a.Blocks, anonBlocks(a), alone)
		if !ok {
			return batching.Admission{}, false
		}
		rq := &r.reqs[q]
		rq.state = rsRunning
		cached := max(0, min(hit*512, int(a.Prompt)-1))
		if r.hitFloor != nil {
			cached = max(cached, int(r.hitFloor[q]))
		}
		rq.hitTok = int32(cached)
		return batching.Admission{Prefill: int(a.Prompt) - cached, Prompt: int(a.Prompt), Output: int(a.Output)}, true
	}
	e.first = func(q int32) { r.reqs[q].first = r.now }
	e.done = func(q int32) { r.finish(j, q) }
}

// startStep begins engine j's next step (see package batching), or leaves
// it idle.
func (r *run) startStep(j int) {
	e := &r.engines[j]
	st := e.batch.Start(e.admit)
	if st.Phase == batching.Idle {
		return
	}
	e.gen++
	r.push(event{t: r.now + st.Ms/e.speed, kind: evStep, x: int32(j), gen: e.gen})
}

// stepEnd completes engine j's current step and starts the next.
func (r *run) stepEnd(j int) {
	r.engines[j].batch.End(r.engines[j].first, r.engines[j].done)
	r.startStep(j)
}

// finish retires request q on engine j.
func (r *run) finish(j int, q int32) {
	e := &r.engines[j]
	a := &r.arrivals[q]
	rq := &r.reqs[q]
	e.kv.Release(a.Blocks, anonBlocks(a))
	rq.state = rsDone
	r.active--
	r.release(q, attemptOK)
	ttft := rq.first - rq.atEngine
	var tbt float64
	if a.Output > 1 {
		tbt = (r.now - rq.first) / float64(a.Output-1)
	}
	e.sDone++
	e.sTTFT += ttft
	e.sOut += float64(a.Output)
	if a.Output > 1 {
		e.sTBT += tbt
		e.sTBTn++
	}
	e.latSum += r.now - rq.atEngine
	e.latN++
	r.m.done(r, q, tbt)
	if r.onFinish != nil {
		r.onFinish(r.now)
	}
}

// signal publishes every engine's signals and folds them, and the routers'
// demand, into the aggregator's windows.
func (r *run) signal() {
	per := r.sigPeriod / 1000
	for j := range r.engines {
		e := &r.engines[j]
		s := &r.sig[j]
		s.up = e.up
		s.capacity = e.d.capacity * e.speed
		s.idleMs = e.d.idleMs / e.speed // as an engine simulator reports it
		if !e.up {
			s.capacity = 0
		}
		s.outstanding = e.batch.Queued() + e.batch.Running()
		s.load.add(r.smooth, float64(e.sArrived)/per, per)
		s.lastLatValid = false
		if e.sDone > 0 {
			n := float64(e.sDone)
			ttft, out := e.sTTFT/n, e.sOut/n
			tbt := 0.0
			if e.sTBTn > 0 {
				tbt = e.sTBT / float64(e.sTBTn)
			}
			s.ttft.add(r.smooth, ttft, per)
			s.out.add(r.smooth, out, per)
			s.tbt.add(r.smooth, tbt, per)
			s.lastLat = ttft + (out-1)*tbt
			s.lastLatValid = true
			s.lat.add(r.smooth, s.lastLat, per)
		}
		e.sArrived, e.sDone, e.sTTFT, e.sTBT, e.sOut, e.sTBTn = 0, 0, 0, 0, 0, 0
		for c := range r.f.clusters {
			r.sentSince[c][j] = 0
			r.inflightAtSig[c][j] = int32(r.inflight[c][j])
			if e.up {
				r.localDown[c][j] = false
			}
		}
	}
	for c := range r.demand {
		d := &r.demand[c]
		rep := &r.dReport[c]
		rep.IntervalS = per
		d.Fold(r.smooth, rep, per, !d.init)
		d.init = true
		*rep = messages.RouterReport{}
	}
	if g, ok := r.pol.(guardedPolicy); ok {
		g.signalled(r)
	}
}

// timed applies a scenario event.
func (r *run) timed(te *timedEvent) {
	for _, j := range te.engines {
		e := &r.engines[j]
		switch te.kind {
		case tFail:
			if !e.up {
				continue
			}
			e.up = false
			e.gen++ // cancels the step in progress
			e.batch.Clear(func(q int32, started bool) {
				if started {
					r.lose(j, q)
				} else {
					r.bounce(q) // no token yet: the router may retry it
				}
			})
			e.kv.Reset()
		case tRecover:
			e.up = true
		case tCapacity:
			e.speed = te.factor
		}
	}
}

// lose fails request q that was running on engine j when it failed (its
// first token may have reached the client, so it is not retried).
func (r *run) lose(j int, q int32) {
	r.reqs[q].state = rsFailed
	r.active--
	r.release(q, attemptBroken)
	r.m.fail(r, q)
	_ = j
}
