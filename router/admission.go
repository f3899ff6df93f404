package router

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
)

// Slot admission (ProtectionOptions.SlotAdmission, off by default): while
// the fleet is past its capacity and the engines are full by their own
// signals (see slotsEnforced) a router holds at most its share of an
// engine's batch slots plus an allowance that waits in the engine's queue
// for the next step boundary (about half of the requests this router's
// share finishes in a decode step, at least one: slotHold.allowance), so
// that no request waits long in an engine's queue
// (where a backlog, once built, does not drain while the snapshot sheds
// down to capacity). A request is admitted where a slot is free: on the
// key's first engine or one of its other candidates. When every one is
// taken it waits in a small router-side queue — by priority, then arrival —
// for the next slot freed on one of its candidates, but only when the wait
// this router predicts for it is short (ProtectionOptions.SlotQueueWait);
// otherwise a sheddable or standard request is shed at once, so a shed
// answer stays fast and an admitted request's time to first token stays
// near the unloaded one. Critical requests, and requests whose wait ran
// out, are not shed by the bound but sent to the candidate this router
// exceeds least, which queues them.
//
// The router's share of an engine is its batch slots (BatchSlots, from the
// engine's newest signal) minus what others hold there: the requests queued
// and running in that signal that are not this router's own. It is live for
// this router's own requests (counted on admission and release) and as
// stale as the signal for the others' (a signal older than slotSignalFresh
// counts none).

// Defaults of ProtectionOptions' slot admission.
const (
	// DefaultSlotQueueWait is ProtectionOptions.SlotQueueWait's default.
	DefaultSlotQueueWait = 25 * time.Millisecond
	// DefaultSlotReserve is ProtectionOptions.SlotReserve's default.
	DefaultSlotReserve = 0.05
	// DefaultSlotHeadroom is ProtectionOptions.SlotHeadroom's default.
	DefaultSlotHeadroom = 0.25
)

// slotTimeoutFactor is how many times its class's predicted-wait bound a
// queued request waits at most before it is sent to its engine anyway.
const slotTimeoutFactor = 2

// RelaxedShed returns the shed fraction a router enforces for a snapshot's
// shed fraction s when it bounds its requests to the engines' batch slots:
// it lets through 1+headroom times the share 1−s the snapshot serves,
//
//	max(0, 1 − (1+headroom)·(1−s)),
//
// so that at 150% of capacity (s = 1/3) and headroom 0.25 it sheds 1/6 of
// the demand by key and the slot bound the rest.
func RelaxedShed(s, headroom float64) float64 {
	s = clamp01(s)
	if s == 0 || !(headroom > 0) {
		return s
	}
	return shedClamp(1 - (1+headroom)*(1-s))
}

// slotOverloadShare is the share of a model's requests, over the last
// windows, that found every candidate engine's slots taken, and every one
// queueing requests by its newest signal, from which the
// router enforces the slot bound although the snapshot sheds nothing: a
// share no burst at a fleet below its capacity reaches (requests find
// every candidate full a few percent of the time at 90% utilisation with
// 4–6 slot engines), while demand above capacity reaches it within a
// second of its onset.
const slotOverloadShare = 0.2

// slotOverloadMin is the least number of such requests in the windows
// that turns enforcement on.
const slotOverloadMin = 10

// slotWindow is the length of one window of the slot counts; rates and
// shares span the current and the previous window.
const slotWindow = time.Second

// slotHold is a router's slot bookkeeping of one engine, in EngineLive.
type slotHold struct {
	held     atomic.Int64  // this router's admitted requests whose first engine this is, not yet released
	others   atomic.Int64  // requests queued or running on the engine that are not this router's, at its newest signal
	slots    atomic.Uint64 // math.Float64bits of BatchSlots; 0 while unknown
	fullAt   atomic.Int64  // Unix ms of the arrival of the engine's last signal that showed it full (slotHold.observe); 0: never
	released atomic.Int64  // this router's slots released on the engine, ever
	allow    atomic.Int64  // requests beyond its share of the slots this router may hold (slotAllowance); 0 before the first signal

	sent     atomic.Int64 // requests this router sent to the engine holding a slot there, ever
	engBound atomic.Int64 // the engine's queued and running requests at its newest signal minus sent before it; see occupancy
	engKnown atomic.Bool  // engBound is set

	mu      sync.Mutex // guards the release rate's estimate and the history of sent, updated per signal
	rateAt  time.Time  // when the estimate last advanced
	rateRel int64      // released at rateAt
	rate    float64    // this router's releases on the engine per second (moving average)
	hist    [slotHistory]sentAt
	histN   int          // entries of hist written, ever (hist[histN%slotHistory] is the next)
	noteAt  atomic.Int64 // Unix ms of the newest entry of hist
}

// sentAt is slotHold.sent at a time, Unix ms.
type sentAt struct{ at, sent int64 }

// slotHistory is how many notes of the count of sent requests a slotHold
// keeps: taken at most every slotNoteEvery on the send path and at each
// signal's arrival, enough to find the count at the time a signal was
// taken when it arrives a second late (as under the race detector).
const slotHistory = 64

// slotNoteEvery is the least time between two notes of the count of sent
// requests taken on the send path.
const slotNoteEvery = 20 * time.Millisecond

// excess returns how many of n held requests occupancy does not count.
func (s *slotHold) excess(n int64) int64 {
	if !s.engKnown.Load() {
		return 0
	}
	return max(0, n-max(0, s.engBound.Load()+s.sent.Load()))
}

// hold counts a request sent, at now, to the engine holding a slot there.
func (s *slotHold) hold(now time.Time) {
	s.held.Add(1)
	s.sentOne(now)
}

// sentOne counts a request sent to the engine at now, and notes the count
// when the newest note is slotNoteEvery old.
func (s *slotHold) sentOne(now time.Time) {
	n := s.sent.Add(1)
	ms := now.UnixMilli()
	if ms-s.noteAt.Load() < slotNoteEvery.Milliseconds() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ms-s.noteAt.Load() >= slotNoteEvery.Milliseconds() {
		s.noteLocked(ms, n)
	}
}

// noteLocked appends a note of the count of sent requests.
func (s *slotHold) noteLocked(ms, sent int64) {
	s.hist[s.histN%slotHistory] = sentAt{at: ms, sent: sent}
	s.histN++
	s.noteAt.Store(ms)
}

// occupancy returns how many of the engine's batch slots this router's
// requests take, as far as it can tell: the requests it holds there
// (admitted, not yet released), or, when fewer, the engine's own count of
// queued and running requests at its newest signal plus what this router
// sent since. The two differ by the requests on their way to the engine
// and those the engine has finished whose answer the router is still
// relaying — a few on a quiet host, hundreds on a slow one (under the race
// detector the end-to-end case study's routers held three times what the
// engines ran), where counting them would shed requests the engines have
// room for.
func (s *slotHold) occupancy() int64 {
	h := s.held.Load()
	if s.engKnown.Load() {
		h = min(h, max(0, s.engBound.Load()+s.sent.Load()))
	}
	return h
}

// recordSent notes the count of sent requests at now and sets the engine's
// bound from sig: its queued and running requests plus what this router
// sent since the signal was taken — counted from the newest note at or
// before the signal's time, so possibly a few more, never fewer. Without
// such a note (a signal without a time, or older than the history) the
// bound is unknown and occupancy is what this router holds.
func (s *slotHold) recordSentLocked(sig *messages.EngineSignal, now time.Time) {
	sent := s.sent.Load()
	var base int64
	found := false
	for k := 1; k <= min(s.histN, slotHistory); k++ {
		e := s.hist[(s.histN-k)%slotHistory]
		if sig.Time > 0 && e.at <= sig.Time {
			base, found = e.sent, true
			break
		}
	}
	s.noteLocked(now.UnixMilli(), sent)
	if found {
		s.engBound.Store(int64(sig.Queue+sig.Running) - base)
	}
	s.engKnown.Store(found)
}

// slotSignalFresh is how old an engine's signal may be, when it arrives,
// for its count of queued and running requests to tell what others hold
// there: the count is compared with this router's own at arrival, and the
// requests of this router that ended in between would count as others'.
const slotSignalFresh = 30 * time.Millisecond

// observe folds in the engine's newest signal, arrived at now. A signal
// older than slotSignalFresh (or without a time) leaves others at zero:
// what this router holds is all it counts.
func (s *slotHold) observe(sig *messages.EngineSignal, now time.Time) {
	s.slots.Store(math.Float64bits(BatchSlots(sig)))
	s.allow.Store(s.allowance(sig, now))
	if slots := BatchSlots(sig); sig.Queue > 0 && slots > 0 && float64(sig.Queue+sig.Running) >= slots {
		s.fullAt.Store(now.UnixMilli())
	}
	others := int64(0)
	if age := now.UnixMilli() - sig.Time; sig.Time > 0 && age <= slotSignalFresh.Milliseconds() {
		others = max(0, int64(sig.Queue)+int64(sig.Running)-s.held.Load())
	}
	s.others.Store(others)
}

// slotAllowance is the least number of requests a router may hold on an
// engine beyond its share of the batch slots: requests that wait in the
// engine's queue for the next step boundary, where running requests finish.
// Without them a slot freed at a step stays empty until the request that
// refills it arrives and the next step begins, which costs a few percent of
// capacity per slot. An engine that finishes more requests per step gets
// more (slotHold.allowance): slotQueueSteps of the requests this router's
// share of it finishes in a decode step.
const slotAllowance = 1

// slotRateTau is the time constant of the moving average of a router's
// release rate on an engine.
const slotRateTau = time.Second

// allowance advances the estimate of this router's release rate on the
// engine to now and returns the requests it may hold beyond its share of
// the slots: slotQueueSteps of its completions per decode step there — its
// releases per second times the engine's step time stepMs (the signal's
// time between tokens) — rounded, and at least slotAllowance. A queued
// request waits for a completion at a step boundary: an allowance of about
// half a step's completions refills the slots at each boundary while a
// queued request seldom waits more than a step (see bench/slotmodel).
func (s *slotHold) allowance(sig *messages.EngineSignal, now time.Time) int64 {
	stepMs := sig.TBTMs
	s.mu.Lock()
	defer s.mu.Unlock()
	rel := s.released.Load()
	s.recordSentLocked(sig, now)
	if dt := now.Sub(s.rateAt).Seconds(); s.rateAt.IsZero() || dt > 10*slotRateTau.Seconds() {
		s.rateAt, s.rateRel, s.rate = now, rel, 0
	} else if dt > 0 {
		a := 1 - math.Exp(-dt/slotRateTau.Seconds())
		s.rate += a * (float64(rel-s.rateRel)/dt - s.rate)
		s.rateAt, s.rateRel = now, rel
	}
	n := int64(math.Round(slotQueueSteps * s.rate * stepMs / 1000))
	if !(stepMs > 0) || n < slotAllowance {
		return slotAllowance
	}
	return n
}

// slotQueueSteps is the share of a decode step's completions (this
// router's, on one engine) that the router may keep queued there.
const slotQueueSteps = 0.5

// limit returns how many requests this router may hold on the engine, and
// false while the engine's batch slots are unknown.
func (s *slotHold) limit() (float64, bool) {
	slots := math.Float64frombits(s.slots.Load())
	if !(slots > 0) {
		return 0, false
	}
	return slots + float64(max(slotAllowance, s.allow.Load())) - float64(s.others.Load()), true
}

// reserveFor returns the slots a request of class p leaves free on an
// engine whose limit is lim: sheddable requests leave share of them.
func reserveFor(p Priority, lim, share float64) float64 {
	if p == PrioritySheddable && share > 0 {
		return math.Ceil(share * lim)
	}
	return 0
}

// tryHold takes a slot for a request of class p when one is free beyond the
// class's reserve, or when the engine's slots are unknown.
func (s *slotHold) tryHold(p Priority, share float64, now time.Time) bool {
	lim, known := s.limit()
	if !known {
		s.hold(now)
		return true
	}
	need := lim - reserveFor(p, lim, share)
	for {
		n := s.held.Load()
		if float64(n-s.excess(n))+1 > need {
			return false
		}
		if s.held.CompareAndSwap(n, n+1) {
			s.sentOne(now)
			return true
		}
	}
}

// slotWaiter is a request waiting for a free slot on one of its candidates.
type slotWaiter struct {
	prio  Priority
	cands []*EngineLive
	idx   []int
	got   chan int // receives the index of the engine held for it
	done  bool     // assigned or gone; under slotQueue.mu
}

// slotQueue is one model's requests waiting for slots, by priority then
// arrival, and the counts of the last windows: requests, requests that
// found every candidate full, and slots released.
type slotQueue struct {
	mu      sync.Mutex
	waiting []*slotWaiter
	n       atomic.Int64 // len(waiting), read without the lock on release

	start               time.Time
	full, all, released [2]int  // current and previous window
	hold                float64 // mean time a request holds its slot, seconds (moving average; 0 before any)
}

// holdWeight is the weight of the newest request in slotQueue.hold.
const holdWeight = 0.02

// rollLocked starts a new window when the current one is over.
func (q *slotQueue) rollLocked(now time.Time) {
	switch d := now.Sub(q.start); {
	case q.start.IsZero() || d >= 2*slotWindow:
		q.full, q.all, q.released, q.start = [2]int{}, [2]int{}, [2]int{}, now
	case d >= slotWindow:
		q.full[1], q.all[1], q.released[1] = q.full[0], q.all[0], q.released[0]
		q.full[0], q.all[0], q.released[0] = 0, 0, 0
		q.start = q.start.Add(slotWindow)
	}
}

// count records a request at now, full when it found no free slot, and
// reports whether the share of full ones over the window calls for
// enforcing the slot bound.
func (q *slotQueue) count(now time.Time, full bool) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.rollLocked(now)
	q.all[0]++
	if full {
		q.full[0]++
	}
	f, a := q.full[0]+q.full[1], q.all[0]+q.all[1]
	return f >= slotOverloadMin && float64(f) >= slotOverloadShare*float64(a)
}

// join queues w when the wait predicted for it is within limit: its place
// in the queue (behind every waiter of its class or a higher one) plus one,
// over the rate at which its candidates release slots — by Little's law,
// the slots this router holds on them, held, over the mean time a request
// holds one — or the rate at which this model's slots were released in the
// last windows, whichever is larger (the first follows a step in demand at
// once, the second covers candidates that share the queue's slots). It
// reports whether w was queued.
func (q *slotQueue) join(w *slotWaiter, now time.Time, limit time.Duration, held int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.rollLocked(now)
	span := math.Max(now.Sub(q.start).Seconds()+slotWindow.Seconds(), 1e-3)
	rate := float64(q.released[0]+q.released[1]) / span
	if q.hold > 0 {
		rate = math.Max(rate, float64(held)/q.hold)
	}
	at := len(q.waiting)
	for at > 0 && q.waiting[at-1].prio < w.prio {
		at--
	}
	if !(rate > 0) || float64(at+1)/rate > limit.Seconds() {
		return false
	}
	q.waiting = append(q.waiting, nil)
	copy(q.waiting[at+1:], q.waiting[at:])
	q.waiting[at] = w
	q.n.Store(int64(len(q.waiting)))
	return true
}

// leave removes w when it is still waiting and reports whether it was.
func (q *slotQueue) leave(w *slotWaiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if w.done {
		return false
	}
	w.done = true
	for i, x := range q.waiting {
		if x == w {
			q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
			break
		}
	}
	q.n.Store(int64(len(q.waiting)))
	return true
}

// release gives back a slot of e, held for d, at now: it passes to the
// first waiter that has e among its candidates, if any, without ever being
// free (so that a request arriving at that moment cannot take it first).
func (q *slotQueue) release(e *EngineLive, d time.Duration, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.rollLocked(now)
	q.released[0]++
	e.slot.released.Add(1)
	if q.hold == 0 {
		q.hold = d.Seconds()
	} else {
		q.hold += holdWeight * (d.Seconds() - q.hold)
	}
	lim, known := e.slot.limit()
	if !known || float64(e.slot.occupancy()) <= lim {
		for i, w := range q.waiting {
			for k, c := range w.cands {
				if c == e {
					e.slot.sentOne(now) // the slot passes to the waiter, which is sent there
					w.done = true
					w.got <- w.idx[k]
					q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
					q.n.Store(int64(len(q.waiting)))
					return
				}
			}
		}
	}
	e.slot.held.Add(-1)
}

// slotsEnforced reports whether the slot bound is enforced for a request
// under f that found every candidate's slots taken for this router: only
// when the engines' own signals show them full (enginesFull: every
// candidate's queued and running requests reached its batch slots, with
// some waiting, in the last slotFullHold), and then when the snapshot
// sheds (the fleet is past its capacity) or when this router recently
// found every candidate's slots taken for a large share of its requests
// (localOverload) — the snapshot lags a step in demand by a few seconds.
// Otherwise the request is queued by its engine, not shed: an engine that
// is not full by its own count has room this router's count of its
// requests there does not see (on a slow host, as under the race
// detector, requests on their way to and from the engine count for
// hundreds of milliseconds), and a fleet that sheds a little by the
// snapshot's plan while its engines keep up needs no bound.
func slotsEnforced(f *Figures, localOverload, enginesFull bool) bool {
	if !enginesFull {
		return false
	}
	if f != nil && (f.ShedFraction > 0 || f.HasShedByPriority) {
		return true
	}
	return localOverload
}

// slotFullHold is how long an engine counts as full (slotsEnforced) after
// a signal showed it full: several signal intervals, since under the bound
// an engine's queue comes and goes from one step to the next.
const slotFullHold = 2 * time.Second

// full reports whether the engine's signals showed it full within
// slotFullHold of now.
func (s *slotHold) full(now time.Time) bool {
	at := s.fullAt.Load()
	return at > 0 && now.UnixMilli()-at <= slotFullHold.Milliseconds()
}

// admitSlot takes a batch slot for rt, whose pick is idx: on idx, else —
// while every candidate engine is full by its own signals — on the first of
// the key's other candidates (not down) with a slot free. When none is free
// and the bound is enforced (slotsEnforced), the request waits for a slot
// freed on one of its candidates if its predicted wait is short enough for
// its class (ProtectionOptions.SlotQueueWait), and is otherwise shed (429),
// or, when critical or when no slot came in time, sent beyond the bound to
// the candidate this router exceeds least. When the bound is not enforced
// the request holds a slot on idx anyway (the engine queues it). It returns
// the engine to send the request to.
func (h *Handler) admitSlot(ctx context.Context, rt *routed, idx int, f *Figures) (int, *APIError) {
	if !h.prot.SlotAdmission {
		return idx, nil
	}
	share := h.prot.SlotReserve
	var cbuf [8]int
	cands := append(cbuf[:0], idx)
	if !rt.fallback {
		var more [8]int
		for _, j := range rt.table.Candidates(rt.key, more[:0]) {
			if j != idx && !rt.bound.Down(j) {
				cands = append(cands, j)
			}
		}
	}
	now := h.opts.Now()
	// While requests wait for slots, a new one takes a free slot only when
	// it is critical (waiters are critical or standard).
	queued := rt.ms.slotq.n.Load() > 0 && rt.prio != PriorityCritical
	take := func(j int) bool {
		if e := rt.bound.Live(j); !queued && e.slot.tryHold(rt.prio, share, now) {
			rt.hold, rt.heldAt = e, now
			rt.ms.slotq.count(now, false)
			h.slotAdmitted(slotFree, rt.prio)
			return true
		}
		return false
	}
	if take(idx) {
		return idx, nil
	}
	// The pick is full for this router; are the engines full by their own
	// signals too? (With several routers sharing small engines, one
	// router's share is often full while the engines keep up; on a slow
	// host its count runs ahead of the engines'.) If not, the request goes
	// to its pick, as the weights say, and the engine queues it.
	engineFull := true
	for _, j := range cands {
		engineFull = engineFull && rt.bound.Live(j).slot.full(now)
	}
	if engineFull {
		for _, j := range cands[1:] {
			if take(j) {
				return j, nil
			}
		}
	}
	lo := rt.ms.slotq.count(now, engineFull)
	if !slotsEnforced(f, lo, engineFull) {
		h.slotAdmitted(slotUnbound, rt.prio)
		return h.forceSlot(rt, idx), nil
	}
	if limit := h.prot.slotWait(rt.prio); limit > 0 {
		w := &slotWaiter{prio: rt.prio, got: make(chan int, 1)}
		var held int64
		for _, j := range cands {
			e := rt.bound.Live(j)
			w.cands = append(w.cands, e)
			w.idx = append(w.idx, j)
			held += e.slot.held.Load()
		}
		if rt.ms.slotq.join(w, now, limit, held) {
			timer := time.NewTimer(slotTimeoutFactor * limit)
			defer timer.Stop()
			select {
			case j := <-w.got:
				rt.hold, rt.heldAt = rt.bound.Live(j), h.opts.Now()
				h.slotAdmitted(slotWaited, rt.prio)
				return j, nil
			case <-timer.C:
			case <-ctx.Done():
			}
			if !rt.ms.slotq.leave(w) {
				j := <-w.got // assigned as the wait ended
				rt.hold, rt.heldAt = rt.bound.Live(j), h.opts.Now()
				h.slotAdmitted(slotWaited, rt.prio)
				return j, nil
			}
			// No slot came in time: a request that waited is not shed (a
			// shed answer must come at once) but queued by its engine.
			h.slotAdmitted(slotTimeout, rt.prio)
			return h.forceSlot(rt, roomiest(rt.bound, cands)), nil
		}
	}
	if rt.prio == PriorityCritical {
		// Critical requests are shed only by the snapshot's plan, after
		// every other class; here they are queued by their engine.
		h.slotAdmitted(slotCritical, rt.prio)
		return h.forceSlot(rt, roomiest(rt.bound, cands)), nil
	}
	return -1, h.shedError(rt.model, rt.prio, ShedSlots, fmt.Sprintf("no free batch slot on its %d candidate engines", len(cands)))
}

// How a request was admitted by slot admission (the how label of
// switchyard_router_slot_admitted_total).
const (
	slotFree     = "free"
	slotWaited   = "waited"
	slotUnbound  = "unbound"
	slotCritical = "critical"
	slotTimeout  = "timeout"
)

// slotAdmitted counts a request admitted by slot admission.
func (h *Handler) slotAdmitted(how string, p Priority) {
	h.metrics.slotAdmitted.WithLabelValues(how, p.String()).Inc()
}

// roomiest returns the candidate (cands[0] is the request's pick) whose
// limit this router exceeds least, so that a request sent beyond the bound
// joins the shortest queue; the pick while no limit is known.
func roomiest(b *Bound, cands []int) int {
	best, room := cands[0], math.Inf(-1)
	for _, j := range cands {
		s := &b.Live(j).slot
		lim, known := s.limit()
		if !known {
			continue
		}
		if r := lim - float64(s.occupancy()); r > room {
			best, room = j, r
		}
	}
	return best
}

// forceSlot holds a slot on engine idx for rt beyond the bound (the engine
// queues the request) and returns idx.
func (h *Handler) forceSlot(rt *routed, idx int) int {
	e := rt.bound.Live(idx)
	now := h.opts.Now()
	e.slot.hold(now)
	rt.hold, rt.heldAt = e, now
	return idx
}

// slotsKnown reports whether an engine of b's table has told its batch
// slots, so that the slot bound can shed what the engines cannot take.
func (b *Bound) slotsKnown() bool {
	for _, e := range b.engines {
		if e.slot.slots.Load() != 0 {
			return true
		}
	}
	return false
}
