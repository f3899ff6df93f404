package router

import (
	"math"
	"sync/atomic"

	"github.com/switchyard-dev/switchyard/messages"
)

// engineLoad is what a router knows of one engine's load: the requests
// queued and running in the engine's newest signal plus those this router
// has sent the engine since, and the engine's batch slots. It is blind to
// the completions between two signals, like any view built on them.
type engineLoad struct {
	sent  atomic.Int64  // requests this router has sent the engine, ever
	base  atomic.Int64  // sent when the newest signal arrived, minus its queued and running
	slots atomic.Uint64 // math.Float64bits of the engine's batch slots; 0 before any signal
}

// load returns the load per batch slot, NaN when unknown.
func (l *engineLoad) load() float64 {
	slots := math.Float64frombits(l.slots.Load())
	if slots <= 0 {
		return math.NaN()
	}
	return float64(max(0, l.sent.Load()-l.base.Load())) / slots
}

// observe folds in a signal: the outstanding requests it reports become the
// base that this router's later sends add to.
func (l *engineLoad) observe(sig *messages.EngineSignal) {
	l.base.Store(l.sent.Load() - int64(sig.Queue) - int64(sig.Running))
	l.slots.Store(math.Float64bits(BatchSlots(sig)))
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
	e.load.observe(sig)
	e.slot.observe(sig, s.now())
}

// Load returns engine i's load per batch slot as this router sees it: the
// requests queued and running in the engine's newest signal plus the
// requests this router has sent it since, over the engine's batch slots
// (BatchSlots). It is NaN while the load is unknown — before the engine's
// first signal, or when its signal gives no batch size — and a NaN load
// never wins a comparison, so PickTwo keeps its first, weighted candidate:
// without load signals the weights alone decide. Load makes a Bound a
// LoadGuard for Table.PickTwo and Table.PickRecent; it takes no lock and
// does not allocate.
func (b *Bound) Load(i int) float64 { return b.engines[i].load.load() }

// ObserveSignal folds an engine's signal into the live state of its model
// (see LiveSet.ObserveSignal); the router service calls it for every signal
// it accepts.
func (h *Handler) ObserveSignal(sig *messages.EngineSignal) {
	h.Live(sig.Model).ObserveSignal(sig)
}
