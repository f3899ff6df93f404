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
// the fleet is past its capacity (see slotsEnforced)
// a router holds at most its share of an engine's batch slots plus one
// (slotAllowance), so that no request waits long in an engine's queue
// (where a backlog, once built, does not drain while the snapshot sheds
// down to capacity). A request is admitted where a slot is free: on the
// key's first engine or one of its other candidates. When every one is
// taken it waits in a small router-side queue — by priority, then arrival —
// for the next slot freed on one of its candidates, but only when the wait
// this router predicts for it is short (ProtectionOptions.SlotQueueWait);
// otherwise a sheddable or standard request is shed at once, so a shed
// answer stays fast and an admitted request's time to first token stays
// near the unloaded one. Critical requests, and requests whose wait ran
// out, are not shed by the bound but sent to their engine, which queues
// them.
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
	held   atomic.Int64  // this router's admitted requests whose first engine this is, not yet released
	others atomic.Int64  // requests queued or running on the engine that are not this router's, at its newest signal
	slots  atomic.Uint64 // math.Float64bits of BatchSlots; 0 while unknown
	queued atomic.Bool   // the engine's newest signal shows requests waiting for a slot
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
	s.queued.Store(sig.Queue > 0)
	others := int64(0)
	if age := now.UnixMilli() - sig.Time; sig.Time > 0 && age <= slotSignalFresh.Milliseconds() {
		others = max(0, int64(sig.Queue)+int64(sig.Running)-s.held.Load())
	}
	s.others.Store(others)
}

// slotAllowance is how many requests a router may hold on an engine beyond
// its share of the batch slots: one, which waits in the engine's queue for
// the next step boundary, where a running request finishes (an engine of
// many slots finishes about one per step at its capacity). Without it a
// slot freed at a step stays empty until the request that refills it
// arrives and the next step begins, which costs a few percent of capacity.
const slotAllowance = 1

// limit returns how many requests this router may hold on the engine, and
// false while the engine's batch slots are unknown.
func (s *slotHold) limit() (float64, bool) {
	slots := math.Float64frombits(s.slots.Load())
	if !(slots > 0) {
		return 0, false
	}
	return slots + slotAllowance - float64(s.others.Load()), true
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
func (s *slotHold) tryHold(p Priority, share float64) bool {
	lim, known := s.limit()
	if !known {
		s.held.Add(1)
		return true
	}
	need := lim - reserveFor(p, lim, share)
	for {
		n := s.held.Load()
		if float64(n)+1 > need {
			return false
		}
		if s.held.CompareAndSwap(n, n+1) {
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
	if q.hold == 0 {
		q.hold = d.Seconds()
	} else {
		q.hold += holdWeight * (d.Seconds() - q.hold)
	}
	lim, known := e.slot.limit()
	if !known || float64(e.slot.held.Load()) <= lim {
		for i, w := range q.waiting {
			for k, c := range w.cands {
				if c == e {
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
// under f: when the snapshot sheds (the fleet is past its capacity), or
// when this router recently found every candidate's slots taken for a
// large share of its requests (localOverload) — the snapshot lags a step
// in demand by a few seconds. Below capacity a request that finds the
// slots taken is queued by its engine, not shed.
func slotsEnforced(f *Figures, localOverload bool) bool {
	if f != nil && (f.ShedFraction > 0 || f.HasShedByPriority) {
		return true
	}
	return localOverload
}

// admitSlot takes a batch slot for rt, whose pick is idx: on idx, else on
// the first of the key's other candidates (not down) with a slot free.
// When none is free and the bound is enforced (slotsEnforced), the request
// waits for a slot freed on one of its candidates if its predicted wait is
// short enough for its class (ProtectionOptions.SlotQueueWait), and is
// otherwise, or when none came in time, shed (429). When the bound is not
// enforced the request holds a slot on idx anyway (the engine queues it).
// It returns the engine to send the request to.
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
	for _, j := range cands {
		if queued {
			break
		}
		if e := rt.bound.Live(j); e.slot.tryHold(rt.prio, share) {
			rt.hold, rt.heldAt = e, now
			rt.ms.slotq.count(now, false)
			return j, nil
		}
	}
	// Local evidence of overload: every candidate is full for this router
	// and queues requests by its newest signal (with several routers
	// sharing small engines, one router's share is often full while the
	// engines keep up).
	engineFull := true
	for _, j := range cands {
		engineFull = engineFull && rt.bound.Live(j).slot.queued.Load()
	}
	if !slotsEnforced(f, rt.ms.slotq.count(now, engineFull)) {
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
				return j, nil
			case <-timer.C:
			case <-ctx.Done():
			}
			if !rt.ms.slotq.leave(w) {
				j := <-w.got // assigned as the wait ended
				rt.hold, rt.heldAt = rt.bound.Live(j), h.opts.Now()
				return j, nil
			}
			// No slot came in time: a request that waited is not shed (a
			// shed answer must come at once) but queued by its engine.
			return h.forceSlot(rt, idx), nil
		}
	}
	if rt.prio == PriorityCritical {
		// Critical requests are shed only by the snapshot's plan, after
		// every other class; here they are queued by their engine.
		return h.forceSlot(rt, idx), nil
	}
	return -1, h.shedError(rt.model, rt.prio, ShedSlots, fmt.Sprintf("no free batch slot on its %d candidate engines", len(cands)))
}

// forceSlot holds a slot on engine idx for rt beyond the bound (the engine
// queues the request) and returns idx.
func (h *Handler) forceSlot(rt *routed, idx int) int {
	e := rt.bound.Live(idx)
	e.slot.held.Add(1)
	rt.hold, rt.heldAt = e, h.opts.Now()
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
