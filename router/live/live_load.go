package live

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/guard"
)

// engineLoad is what a router knows of one engine's load: the requests
// queued and running in the engine's newest signal that other routers sent
// (the signal's count minus this router's in-flight requests when it
// arrived), and the engine's batch slots. The router's own share is its
// in-flight count now, exact; only the other routers' share is up to a
// signal period old. (Counting this router's sends since the signal
// instead, blind to their completions, overstates most the engines this
// router loads most, and so pulls its traffic off the weights.)
type engineLoad struct {
	others atomic.Int64  // outstanding at the newest signal that are not this router's
	slots  atomic.Uint64 // math.Float64bits of the engine's batch slots; 0 before any signal
	// slotSec and stepSec are math.Float64bits of the engine's slot time
	// and decode step, seconds (see slotTime); 0 while unknown.
	slotSec atomic.Uint64
	stepSec atomic.Uint64
}

// slotTime returns how long one request holds a batch slot of an engine
// serving at its capacity, seconds — by Little's law its batch slots over
// its capacity in req/s — and its decode step (the signal's time between
// tokens), seconds; each 0 when the signal does not tell.
func slotTime(sig *messages.EngineSignal) (slot, step float64) {
	if s := BatchSlots(sig); s > 0 && sig.CapacityRPS > 0 && !math.IsInf(sig.CapacityRPS, 0) {
		slot = s / sig.CapacityRPS
	}
	if sig.TBTMs > 0 && !math.IsInf(sig.TBTMs, 0) {
		step = sig.TBTMs / 1000
	}
	return slot, step
}

// load returns the load per batch slot given this router's in-flight
// requests on the engine now, NaN when unknown.
func (l *engineLoad) load(inflight int64) float64 {
	slots := math.Float64frombits(l.slots.Load())
	if slots <= 0 {
		return math.NaN()
	}
	return float64(l.others.Load()+max(0, inflight)) / slots
}

// observe folds in a signal, given this router's in-flight requests on the
// engine as it arrives.
func (l *engineLoad) observe(sig *messages.EngineSignal, inflight int64) {
	l.others.Store(max(0, int64(sig.Queue)+int64(sig.Running)-max(0, inflight)))
	l.slots.Store(math.Float64bits(BatchSlots(sig)))
	slot, step := slotTime(sig)
	l.slotSec.Store(math.Float64bits(slot))
	l.stepSec.Store(math.Float64bits(step))
}

// BatchSlots returns how many requests an engine runs at once, as its
// signal tells: MaxRunning when the engine reports it; otherwise, by
// Little's law, its capacity in req/s times its idle latency in seconds
// (the requests in flight when it serves its capacity), at least 1, when
// it reports both; otherwise 0, unknown.
func BatchSlots(sig *messages.EngineSignal) float64 {
	if sig.MaxRunning > 0 {
		return float64(sig.MaxRunning)
	}
	if s := sig.CapacityRPS * sig.BaseLatencyMs / 1000; s > 0 {
		return max(1, s)
	}
	return 0
}

// ObserveSignal folds an engine's newest signal into the live state of the
// engine it names, for Bound.Load. The caller keeps ownership of sig.
func (s *LiveSet) ObserveSignal(sig *messages.EngineSignal) {
	e := s.Engine(sig.Engine)
	e.load.observe(sig, e.inflight.Load())
}

// Load returns engine i's load per batch slot as this router sees it: the
// requests queued and running in the engine's newest signal that other
// routers sent, plus this router's in-flight requests on it now, over the
// engine's batch slots (BatchSlots). It is NaN while the load is unknown —
// before the engine's first signal, or when its signal gives no batch size
// — and a NaN load never wins a comparison, so PickTwo keeps its first, weighted candidate:
// without load signals the weights alone decide. Load makes a Bound a
// LoadGuard for Table.PickTwo and Table.PickRecent; it takes no lock and
// does not allocate.
func (b *Bound) Load(i int) float64 {
	e := b.engines[i]
	return e.load.load(e.inflight.Load())
}

// slotTimes is Bound.SlotTimes' answer at a time.
type slotTimes struct {
	at         time.Time
	slot, step float64
}

// slotTimesEvery is how long Bound.SlotTimes reuses an answer: the weights
// are fixed for the bound's life and an engine signals a few times a
// second, so a request does not walk every engine of a large table.
const slotTimesEvery = 100 * time.Millisecond

// SlotTimes returns the weight-averaged slot time and decode step, seconds,
// of the bound's engines of positive weight (see slotTime), over the
// engines whose signals tell them; ok is false when those engines carry
// less than half the table's weight. An answer is reused for
// slotTimesEvery.
func (b *Bound) SlotTimes() (slot, step float64, ok bool) {
	now := b.set.now()
	if c := b.times.Load(); c != nil && now.Sub(c.at) < slotTimesEvery && now.Sub(c.at) >= 0 {
		return c.slot, c.step, c.slot > 0
	}
	var ws, ss, wt, st float64
	for _, i := range b.table.Active() {
		w := b.table.Engine(int(i)).Weight
		l := &b.engines[i].load
		if v := math.Float64frombits(l.slotSec.Load()); v > 0 {
			ws += w
			ss += w * v
		}
		if v := math.Float64frombits(l.stepSec.Load()); v > 0 {
			wt += w
			st += w * v
		}
	}
	c := &slotTimes{at: now}
	if ws > 0 && ws >= b.table.Weight()/2 {
		c.slot = ss / ws
		if wt > 0 {
			c.step = st / wt
		}
	}
	b.times.Store(c)
	return c.slot, c.step, c.slot > 0
}

// slotWait returns how long a request sent to engine i now waits for a
// batch slot, seconds, as this router sees the engine: 0 while its batch
// has a free slot, else the requests queued ahead of it plus itself over
// the engine's completion rate at capacity (one request every slot time
// over batch slots), and false while the load or slot time is unknown.
func (b *Bound) slotWait(i int) (float64, bool) {
	l := &b.engines[i].load
	slots := math.Float64frombits(l.slots.Load())
	slot := math.Float64frombits(l.slotSec.Load())
	load := b.Load(i)
	if !(slots > 0) || !(slot > 0) || math.IsNaN(load) {
		return 0, false
	}
	if load < 1 {
		return 0, true
	}
	queued := math.Max(0, load*slots-slots)
	return (math.Floor(queued) + 1) * slot / slots, true
}

// Overflow returns where a request without affinity that PickTwo placed
// on engine i goes instead when i's batch is full: the first of the
// snapshot's spare engines (f.Spare, weight zero, nearest first) that is
// not skipped, has a free batch slot, and whose predicted latency
// (f.EngineLatency, network plus engine-side) exceeds engine i's by less
// than the wait for a slot on i (slotWait). ok is false — keep i — while
// i has a free slot, its load is unknown, or no spare engine qualifies.
//
// The plan sends a cluster's traffic to the engines it weights and keeps
// them below capacity on average, but a burst above the planned demand
// fills their batches until the next snapshot follows it (or for its
// whole length, when the plan holds its demand against noise); PickTwo
// then compares full engines among themselves, and every request queues.
// An engine the plan does not weight for this cluster but that has a free
// slot serves the request at once, at its extra network and engine-side
// latency; the request goes there when that is less than its wait. A
// request with affinity stays with its cache.
func (b *Bound) Overflow(i int, f *guard.Figures) (int, bool) {
	if f == nil || len(f.Spare) == 0 {
		return i, false
	}
	wait, ok := b.slotWait(i)
	if !ok || wait == 0 {
		return i, false
	}
	base, ok := f.EngineLatency(b.table.Engine(i).Name)
	if !ok {
		return i, false
	}
	for _, name := range f.Spare {
		j, in := b.table.Index(name)
		if !in || j == i {
			continue
		}
		lat, ok := f.EngineLatency(name)
		if !ok || (lat-base).Seconds() >= wait {
			// Spare is ordered by predicted latency: the later ones cost more still.
			return i, false
		}
		if w, ok := b.slotWait(j); ok && w == 0 && !b.Down(j) {
			return j, true
		}
	}
	return i, false
}
