package live

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/selection"
)

// EngineLive is a router's live state of one engine for one model: its
// in-flight request count at this router, whether it is marked down, and
// its local ejection after consecutive failures.
type EngineLive struct {
	inflight atomic.Int64
	down     atomic.Bool
	silent   atomic.Bool
	lastOK   atomic.Int64 // Unix ns of this router's newest success on the engine
	addr     atomic.Bool  // an endpoint is known from the engine's signals (LiveSet.SetEndpoints)
	eject    ejectState
	load     engineLoad
}

// InFlight returns the engine's in-flight requests at this router.
func (e *EngineLive) InFlight() int64 { return e.inflight.Load() }

// Down reports whether the engine is marked down.
func (e *EngineLive) Down() bool { return e.down.Load() }

// SilentServe is how recent this router's last success on an engine whose
// signals went silent must be for the engine to stay usable: the signal
// freshness a router asks by default (DefaultDownAfter), so that the
// router's own answers stand in for the signals at the same rate.
const SilentServe = control.DefaultDownAfter

// Silent reports whether the engine's signals went silent.
func (e *EngineLive) Silent() bool { return e.silent.Load() }

// silentSkip reports whether Pick skips the engine for its silence: silent,
// and no success from it at this router within SilentServe. An engine whose
// signals stopped is unknown, not down: while this router's requests to it
// succeed it keeps serving (a control plane that lost its signal stream
// does not take healthy engines out), and one that stopped answering is
// skipped once its last success is older than that, or ejected by its
// failures first.
func (e *EngineLive) silentSkip(now func() time.Time) bool {
	return e.silent.Load() && now().UnixNano()-e.lastOK.Load() > int64(SilentServe)
}

// Addressed reports whether the engine's signals gave it an endpoint.
func (e *EngineLive) Addressed() bool { return e.addr.Load() }

// Ejected reports whether the engine is ejected by the router's fast local
// skip (skipped, or half-open and waiting for its probe's result).
func (e *EngineLive) Ejected() bool { return e.eject.ejected.Load() }

// LiveSet holds the live state of the engines of one model at one router,
// by engine name, so that it survives the installation of new tables. It is
// safe for concurrent use.
type LiveSet struct {
	mu     sync.Mutex
	byName map[string]*EngineLive
	total  atomic.Int64
	now    func() time.Time
	// resolve, when set, gives engines' live endpoints: an engine is then
	// selectable only with an address, from its table entry or from its
	// signals (see SetEndpoints). Nil: every engine of a table is.
	resolve control.EndpointResolver
	model   string
}

// NewLiveSet returns an empty live set reading the clock now (nil:
// time.Now), for silence and ejection timing; a simulator passes its own.
func NewLiveSet(now func() time.Time) *LiveSet {
	if now == nil {
		now = time.Now
	}
	return &LiveSet{byName: make(map[string]*EngineLive), now: now}
}

// NewLiveSetFor returns an empty live set of model whose engines are
// selectable only with an address, from their table entry or from
// resolve's endpoints (see SetEndpoints); nil resolve: every engine of a
// table is, as in NewLiveSet's. now is the clock, as for NewLiveSet.
func NewLiveSetFor(model string, resolve control.EndpointResolver, now func() time.Time) *LiveSet {
	s := NewLiveSet(now)
	s.resolve, s.model = resolve, model
	return s
}

// Engine returns the live state of the named engine, creating it if needed.
func (s *LiveSet) Engine(name string) *EngineLive {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.engineLocked(name)
}

func (s *LiveSet) engineLocked(name string) *EngineLive {
	e, ok := s.byName[name]
	if !ok {
		e = &EngineLive{}
		s.byName[name] = e
	}
	return e
}

// SetDown marks the named engine down (skipped at once by Pick) or up.
func (s *LiveSet) SetDown(name string, down bool) { s.Engine(name).down.Store(down) }

// SetSilent marks the named engine's signals silent or fresh. A silent
// engine is skipped by Pick only while this router has had no success from
// it within SilentServe (see EngineLive.silentSkip).
func (s *LiveSet) SetSilent(name string, silent bool) { s.Engine(name).silent.Store(silent) }

// SetEndpoints records whether the named engine's signals give it an
// endpoint. Under the set's lock, as Bind's own reading of the resolver,
// so that the newest call wins whatever the interleaving.
func (s *LiveSet) SetEndpoints(name string, ep control.Endpoints) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.engineLocked(name).addr.Store(ep.URL != "" || ep.Subject != "")
}

// TotalInFlight returns this router's in-flight requests on all engines of
// the set.
func (s *LiveSet) TotalInFlight() int64 { return s.total.Load() }

// Bind returns a Guard for table t over this set's engine states.
func (s *LiveSet) Bind(t *selection.Table) *Bound {
	b := &Bound{set: s, table: t, engines: make([]*EngineLive, t.Len())}
	if s.resolve != nil {
		b.static = make([]bool, t.Len())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range b.engines {
		eng := t.Engine(i)
		e := s.engineLocked(eng.Name)
		b.engines[i] = e
		if s.resolve != nil {
			b.static[i] = eng.URL != "" || eng.Subject != ""
			if ep, ok := s.resolve.Endpoints(s.model, eng.Name); ok && (ep.URL != "" || ep.Subject != "") {
				e.addr.Store(true)
			}
		}
	}
	return b
}

// Bound is a LiveSet bound to one table: a Guard indexed like the table,
// with the counters a request updates around its forwarding.
type Bound struct {
	set     *LiveSet
	table   *selection.Table
	engines []*EngineLive
	static  []bool                    // the table gives engine i an address; nil when every engine is addressable
	times   atomic.Pointer[slotTimes] // SlotTimes' newest answer
}

// Table returns the table b is bound to.
func (b *Bound) Table() *selection.Table { return b.table }

// Down reports whether engine i of the table must be skipped: marked down,
// without an address (see Reachable), ejected by the fast local skip (see
// EjectOptions), or silent without a recent success here.
func (b *Bound) Down(i int) bool {
	e := b.engines[i]
	return e.down.Load() || !b.Reachable(i) || e.eject.skipped(b.set.now) || e.silentSkip(b.set.now)
}

// Reachable reports whether the router has an address for engine i: from
// the table, or from the engine's signals. An engine without one (named by
// a snapshot stored before this router started, or by one naming an engine
// that is gone) is not selectable, but nothing counts against it: it is
// neither ejected nor reported, and it becomes selectable as soon as its
// signals give an address.
func (b *Bound) Reachable(i int) bool {
	return b.static == nil || b.static[i] || b.engines[i].addr.Load()
}

// Live returns the live state of engine i.
func (b *Bound) Live(i int) *EngineLive { return b.engines[i] }

// hardDown is a Guard over a Bound that ignores ejections and silence: when
// every engine is ejected or silent, requests still go somewhere rather than
// fail.
type hardDown struct{ *Bound }

// Down reports whether engine i is marked down or has no address.
func (g hardDown) Down(i int) bool { return g.engines[i].down.Load() || !g.Reachable(i) }

// PickFallback picks for key when every engine the table weights is
// skipped: the first of spare (the snapshot's engines of weight zero,
// nearest first) not skipped, else Table.Pick ignoring ejections and
// silence (fallback: the attempt goes even to an ejected engine), so that
// requests still go somewhere rather than fail.
func (b *Bound) PickFallback(key uint64, spare []string) (idx int, fallback, ok bool) {
	if idx, ok = spareEngine(b.table, spare, func(j int) bool { return !b.Down(j) }); ok {
		return idx, false, true
	}
	idx, ok = b.table.Pick(key, hardDown{b})
	return idx, true, ok
}

// InFlight returns this router's in-flight requests on engine i.
func (b *Bound) InFlight(i int) int64 { return b.engines[i].inflight.Load() }

// TotalInFlight returns this router's in-flight requests on the model.
func (b *Bound) TotalInFlight() int64 { return b.set.total.Load() }

// Acquire counts one more in-flight request on engine i; pair it with
// Release on the same Bound.
func (b *Bound) Acquire(i int) {
	b.engines[i].inflight.Add(1)
	b.set.total.Add(1)
}

// Release counts the end of an in-flight request on engine i.
func (b *Bound) Release(i int) {
	b.engines[i].inflight.Add(-1)
	b.set.total.Add(-1)
}
