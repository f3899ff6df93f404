package router

import (
	"math"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
)

func TestRelaxedShed(t *testing.T) {
	for _, tc := range []struct{ s, h, want float64 }{
		{0, 0.25, 0},
		{1.0 / 3, 0.25, 1.0 / 6},
		{0.1, 0.25, 0},   // 1.25 × 0.9 > 1: nothing shed by key
		{0.5, 0, 0.5},    // no headroom: as planned
		{1, 0.25, 1},     // nothing served stays nothing served
		{0.6, 0.5, 0.4},  // 1 − 1.5 × 0.4
		{-1, 0.25, 0},    // clamped
		{0.9, -0.5, 0.9}, // negative headroom: none
	} {
		if got := RelaxedShed(tc.s, tc.h); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("RelaxedShed(%v, %v) = %v, want %v", tc.s, tc.h, got, tc.want)
		}
	}
}

// observeSlots gives every engine of f a signal with maxRunning batch slots
// and nothing queued or running.
func (f *pfront) observeSlots(maxRunning int) {
	for _, e := range f.engines {
		f.h.ObserveSignal(&messages.EngineSignal{Model: "m", Engine: e.name, MaxRunning: maxRunning, Time: time.Now().UnixMilli()})
	}
}

// observeFull gives every engine of f a signal with maxRunning batch slots,
// all running and one request queued — the engine is full by its own
// count — taken a second ago, so that its requests do not count as other
// routers' (slotSignalFresh).
func (f *pfront) observeFull(maxRunning int) {
	for _, e := range f.engines {
		f.h.ObserveSignal(&messages.EngineSignal{Model: "m", Engine: e.name, MaxRunning: maxRunning, Running: maxRunning, Queue: 1,
			Time: time.Now().Add(-time.Second).UnixMilli()})
	}
}

// allReachEngine sends n requests with headers hdr at once to a front of
// one holding engine, fails the test unless all of them reach it, and then
// lets the engine answer them.
func (f *pfront) allReachEngine(t *testing.T, n int, hdr map[string]string) {
	t.Helper()
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); f.do(streamBody("x"), hdr) }()
	}
	e := f.engines[0]
	ok := poll(5*time.Second, func() bool { return e.inflight.Load() == int64(n) })
	reached := e.inflight.Load()
	close(e.release)
	wg.Wait()
	if !ok {
		t.Fatalf("%d of %d requests reached the engine", reached, n)
	}
}

// TestSlotBoundSheds fills two engines of two batch slots each (three
// requests each with the allowance) while the snapshot plans the fleet near
// its limit: further sheddable and standard requests are shed at once with
// reason "slots" (no slot was ever released, so no wait is predicted short),
// and a critical one is not shed but sent to its engine.
func TestSlotBoundSheds(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind ServerKind) {
		figs := &Figures{ShedFraction: 0.01} // sheds: the bound is on; no demand: the allotment sets no limit
		f := newPFront(t, kind, []int32{modeHold, modeHold}, []float64{0.5, 0.5}, figs, Options{Protection: ProtectionOptions{SlotAdmission: true}})
		f.observeFull(2)
		limit := 2 * (2 + slotAllowance)
		inflight := func() int64 { return f.engines[0].inflight.Load() + f.engines[1].inflight.Load() }
		var wg sync.WaitGroup
		codes := make(chan int, limit+1)
		send := func(prio string) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				codes <- f.do(streamBody("x"), map[string]string{HeaderPriority: prio}).status
			}()
		}
		release := func() {
			for _, e := range f.engines {
				close(e.release)
			}
		}
		for i := 0; i < limit; i++ {
			send("standard")
		}
		if !poll(5*time.Second, func() bool { return inflight() == int64(limit) }) {
			release()
			wg.Wait()
			t.Fatalf("%d of %d requests reached the engines", inflight(), limit)
		}
		for _, prio := range []string{"sheddable", "standard"} {
			r := f.do(streamBody("y"), map[string]string{HeaderPriority: prio})
			if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" {
				t.Errorf("%s request with every slot taken: status %d, Retry-After %q", prio, r.status, r.header.Get("Retry-After"))
			}
			if n := metricValue(f.h.metrics.shed.WithLabelValues(string(ShedSlots), prio)); n != 1 {
				t.Errorf("%s shed for slots: %v, want 1", prio, n)
			}
		}
		send("critical")
		ok := poll(5*time.Second, func() bool { return inflight() == int64(limit)+1 })
		release()
		wg.Wait()
		close(codes)
		if !ok {
			t.Fatalf("the critical request did not reach an engine (%d in flight)", inflight())
		}
		for c := range codes {
			if c != http.StatusOK {
				t.Errorf("an admitted request answered %d", c)
			}
		}
	})
}

// TestSlotBoundNotEnforcedWithHeadroom: with a snapshot that plans headroom
// and no sign of local overload, a request that finds every slot taken is
// still sent to its engine (the engine's queue absorbs a burst).
func TestSlotBoundNotEnforcedWithHeadroom(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind ServerKind) {
		figs := &Figures{Utilisation: 0.5}
		f := newPFront(t, kind, []int32{modeHold}, []float64{1}, figs, Options{Protection: ProtectionOptions{SlotAdmission: true}})
		f.observeSlots(1)
		f.allReachEngine(t, 1+slotAllowance+2, nil) // two over the bound: fewer than slotOverloadMin
		if s := metricValue(f.h.metrics.shed.WithLabelValues(string(ShedSlots), "standard")); s != 0 {
			t.Fatalf("%v requests shed for slots with headroom planned", s)
		}
	})
}

// TestSlotQueueHandsOverReleasedSlot checks the router-side queue: a waiter
// joins only when its predicted wait is within its limit, critical waiters
// go ahead of standard ones, and a released slot passes to the first waiter
// that can use it without being free in between.
func TestSlotQueueHandsOverReleasedSlot(t *testing.T) {
	var q slotQueue
	a, b := &EngineLive{}, &EngineLive{}
	for _, e := range []*EngineLive{a, b} {
		e.slot.observe(&messages.EngineSignal{MaxRunning: 1}, time.Now())
		for e.slot.tryHold(PriorityStandard, 0, time.Now()) {
		}
	}
	if got := a.slot.held.Load(); got != 1+slotAllowance {
		t.Fatalf("held %d, want %d", got, 1+slotAllowance)
	}
	now := time.Now()
	// No release seen yet: no rate, no wait predicted short enough.
	std := &slotWaiter{prio: PriorityStandard, cands: []*EngineLive{a}, idx: []int{0}, got: make(chan int, 1)}
	if q.join(std, now, time.Second, 4) {
		t.Fatal("joined without a release rate")
	}
	// One release (held 2 s) gives a mean hold of 2 s; with 4 held the
	// slots free at 2/s: the first place waits 0.5 s, the second 1 s.
	q.release(b, 2*time.Second, now)
	if got := b.slot.held.Load(); got != slotAllowance {
		t.Fatalf("a release without waiters left %d held, want %d", got, slotAllowance)
	}
	if !q.join(std, now, 600*time.Millisecond, 4) {
		t.Fatal("standard waiter refused at a predicted 0.5 s within 0.6 s")
	}
	std2 := &slotWaiter{prio: PriorityStandard, cands: []*EngineLive{a}, idx: []int{0}, got: make(chan int, 1)}
	if q.join(std2, now, 600*time.Millisecond, 4) {
		t.Fatal("second standard waiter joined at a predicted 1 s over 0.6 s")
	}
	crit := &slotWaiter{prio: PriorityCritical, cands: []*EngineLive{b, a}, idx: []int{1, 0}, got: make(chan int, 1)}
	if !q.join(crit, now, 600*time.Millisecond, 4) {
		t.Fatal("critical waiter refused: it goes ahead of the standard one")
	}
	q.release(a, time.Second, now)
	select {
	case j := <-crit.got:
		if j != 0 {
			t.Fatalf("critical waiter got engine %d, want 0", j)
		}
	default:
		t.Fatal("the released slot did not go to the critical waiter")
	}
	if got := a.slot.held.Load(); got != 1+slotAllowance {
		t.Fatalf("slot passed over but held is %d, want %d", got, 1+slotAllowance)
	}
	if !q.leave(std) {
		t.Fatal("the standard waiter was no longer queued")
	}
	if q.leave(crit) {
		t.Fatal("an assigned waiter left the queue as if still waiting")
	}
	if n := q.n.Load(); n != 0 {
		t.Fatalf("%d waiters left", n)
	}
}

// TestSlotOverloadDetection: the bound turns on locally when enough of the
// recent requests found every slot taken.
func TestSlotOverloadDetection(t *testing.T) {
	var q slotQueue
	now := time.Now()
	for i := 0; i < 100; i++ {
		q.count(now, false)
	}
	for i := 1; i <= slotOverloadMin; i++ {
		if on := q.count(now, true); on != (i >= slotOverloadMin && float64(i) >= slotOverloadShare*float64(100+i)) {
			t.Fatalf("after %d full of %d: enforced %v", i, 100+i, on)
		}
	}
	for i := 0; i < 30; i++ {
		q.count(now, true)
	}
	if !q.count(now, true) {
		t.Fatal("not enforced with 35 of 135 requests finding every slot taken")
	}
	// Two windows later the counts are gone.
	if q.count(now.Add(3*slotWindow), true) {
		t.Fatal("still enforced after the windows passed")
	}
	for _, tc := range []struct {
		f           *Figures
		local, full bool
		want        bool
	}{
		{&Figures{ShedFraction: 0.1}, false, true, true},
		{&Figures{ShedFraction: 0.1}, true, false, false}, // the engines keep up by their own signals
		{&Figures{Utilisation: 0.95}, false, true, false},
		{nil, true, true, true},
		{nil, true, false, false},
	} {
		if got := slotsEnforced(tc.f, tc.local, tc.full); got != tc.want {
			t.Errorf("slotsEnforced(%+v, local %v, full %v) = %v, want %v", tc.f, tc.local, tc.full, got, tc.want)
		}
	}
}

// TestSlotOthersFromFreshSignals: a fresh signal's queued and running
// requests beyond this router's own count as others' and shrink its limit;
// a stale one (or one without a time) counts nothing as others'.
func TestSlotOthersFromFreshSignals(t *testing.T) {
	var s slotHold
	s.held.Store(3)
	now := time.Now()
	sig := &messages.EngineSignal{MaxRunning: 10, Running: 8, Queue: 1, Time: now.UnixMilli()}
	s.observe(sig, now)
	if lim, _ := s.limit(); lim != 10+slotAllowance-6 {
		t.Fatalf("fresh signal: limit %v, want %v", lim, 10+slotAllowance-6)
	}
	s.observe(sig, now.Add(time.Second))
	if lim, _ := s.limit(); lim != 10+slotAllowance {
		t.Fatalf("stale signal: limit %v, want %v", lim, 10+slotAllowance)
	}
	sig.Time = 0
	s.observe(sig, now)
	if lim, _ := s.limit(); lim != 10+slotAllowance {
		t.Fatalf("signal without a time: limit %v, want %v", lim, 10+slotAllowance)
	}
}

// TestSlotHoldMovesWithRetry: a retry to another engine moves the request's
// slot there, and the slot it leaves goes to a request waiting for it.
func TestSlotHoldMovesWithRetry(t *testing.T) {
	table := mustTable(t, []Engine{{Name: "a", Weight: 0.5}, {Name: "b", Weight: 0.5}}, TableOptions{})
	set := NewLiveSet()
	b := set.Bind(table)
	ms := &modelState{live: set}
	ia, _ := table.Index("a")
	ib, _ := table.Index("b")
	ea, eb := b.Live(ia), b.Live(ib)
	ea.slot.observe(&messages.EngineSignal{MaxRunning: 1}, time.Now())
	for ea.slot.tryHold(PriorityStandard, 0, time.Now()) {
	}
	rt := &routed{bound: b, ms: ms, hold: ea, heldAt: time.Now(), now: time.Now}
	w := &slotWaiter{prio: PriorityStandard, cands: []*EngineLive{ea}, idx: []int{ia}, got: make(chan int, 1)}
	ms.slotq.hold = 1
	if !ms.slotq.join(w, time.Now(), time.Hour, ea.slot.held.Load()) {
		t.Fatal("waiter refused")
	}
	rt.moveHold(ib)
	if rt.hold != eb || eb.slot.held.Load() != 1 {
		t.Fatalf("hold not moved to b (b holds %d)", eb.slot.held.Load())
	}
	select {
	case j := <-w.got:
		if j != ia {
			t.Fatalf("waiter got engine %d, want %d", j, ia)
		}
	default:
		t.Fatal("the slot left on a did not go to the waiter")
	}
	rt.moveHold(ib) // already there: nothing changes
	rt.release()
	if eb.slot.held.Load() != 0 {
		t.Fatalf("b holds %d after the release", eb.slot.held.Load())
	}
}

// TestSlotBoundNotEnforcedWhileEnginesKeepUp: the snapshot sheds, every
// slot is taken by this router's count, but the engines' own signals show
// room (as when a slow host keeps requests on their way to and from the
// engine for long): further requests are sent to their engines, not shed.
func TestSlotBoundNotEnforcedWhileEnginesKeepUp(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind ServerKind) {
		figs := &Figures{ShedFraction: 0.05}
		f := newPFront(t, kind, []int32{modeHold}, []float64{1}, figs, Options{Protection: ProtectionOptions{SlotAdmission: true}})
		f.observeSlots(1)
		f.allReachEngine(t, 1+slotAllowance+3, map[string]string{HeaderPriority: "sheddable"})
		if s := metricValue(f.h.metrics.shed.WithLabelValues(string(ShedSlots), "sheddable")); s != 0 {
			t.Fatalf("%v requests shed for slots while the engine's signal shows room", s)
		}
	})
}

// TestSlotAllowanceFollowsCompletions: the requests a router may hold
// beyond an engine's batch slots follow its completions per decode step
// there — its release rate times the signal's time between tokens, times
// slotQueueSteps — and are at least slotAllowance.
func TestSlotAllowanceFollowsCompletions(t *testing.T) {
	var s slotHold
	now := time.Now()
	sig := &messages.EngineSignal{MaxRunning: 64, TBTMs: 100}
	s.observe(sig, now)
	if got := s.allow.Load(); got != slotAllowance {
		t.Fatalf("before any release: allowance %d, want %d", got, slotAllowance)
	}
	// 100 releases a second for 10 s: 10 completions per 100 ms step, of
	// which slotQueueSteps may wait in the engine's queue.
	for i := 1; i <= 100; i++ {
		s.released.Add(10)
		s.observe(sig, now.Add(time.Duration(i)*100*time.Millisecond))
	}
	want := int64(math.Round(slotQueueSteps * 10))
	if got := s.allow.Load(); got != want {
		t.Fatalf("at 10 completions a step: allowance %d, want %d", got, want)
	}
	if lim, _ := s.limit(); lim != float64(64+want) {
		t.Fatalf("limit %v, want %v", lim, 64+want)
	}
	// Releases stop: the rate decays and the allowance returns to its floor.
	for i := 101; i <= 200; i++ {
		s.observe(sig, now.Add(time.Duration(i)*100*time.Millisecond))
	}
	if got := s.allow.Load(); got != slotAllowance {
		t.Fatalf("after the releases stopped: allowance %d, want %d", got, slotAllowance)
	}
	// A signal without a step time keeps the floor.
	s.released.Add(1000)
	s.observe(&messages.EngineSignal{MaxRunning: 64}, now.Add(201*100*time.Millisecond))
	if got := s.allow.Load(); got != slotAllowance {
		t.Fatalf("without a step time: allowance %d, want %d", got, slotAllowance)
	}
}

// TestSlotOccupancyFromEngineCount: requests this router holds but the
// engine no longer counts (answers still being relayed, on a slow host)
// do not take its slots: occupancy is the engine's own count at its
// newest signal plus what the router sent since, when that is fewer.
func TestSlotOccupancyFromEngineCount(t *testing.T) {
	var s slotHold
	t0 := time.Now()
	sig := func(at time.Time, running int) *messages.EngineSignal {
		return &messages.EngineSignal{MaxRunning: 4, Running: running, Time: at.UnixMilli()}
	}
	s.observe(sig(t0.Add(-time.Second), 0), t0) // older than any note: no bound yet
	for i := 0; i < 4; i++ {
		if !s.tryHold(PriorityStandard, 0, t0) {
			t.Fatalf("slot %d refused", i)
		}
	}
	if got := s.occupancy(); got != 4 {
		t.Fatalf("occupancy %d without an engine count, want the 4 held", got)
	}
	// A note of the 4 sent at t0+5ms; then two more are sent, and a signal
	// taken at t0+10ms shows the engine running 2: the 2 sent since the
	// note count on top.
	s.observe(sig(t0.Add(-time.Second), 0), t0.Add(5*time.Millisecond))
	s.hold(t0.Add(6 * time.Millisecond))
	s.hold(t0.Add(6 * time.Millisecond))
	s.observe(sig(t0.Add(10*time.Millisecond), 2), t0.Add(500*time.Millisecond))
	if got := s.occupancy(); got != 2+2 {
		t.Fatalf("occupancy %d, want the engine's 2 plus the 2 sent since (of %d held)", got, s.held.Load())
	}
	// Room again for this router although it holds 6 of 4+1.
	if !s.tryHold(PriorityStandard, 0, t0.Add(500*time.Millisecond)) {
		t.Fatal("refused a slot the engine has room for")
	}
	if got := s.occupancy(); got != 5 {
		t.Fatalf("occupancy %d after one more, want 5", got)
	}
	// Sends note the count on the way: a signal taken after a note made
	// on the send path counts only what was sent after that note.
	s.hold(t0.Add(530 * time.Millisecond)) // a note: 8 sent at t0+530ms
	s.hold(t0.Add(540 * time.Millisecond)) // within 20 ms of it: no note
	s.observe(sig(t0.Add(535*time.Millisecond), 3), t0.Add(545*time.Millisecond))
	if got := s.occupancy(); got != 3+1 {
		t.Fatalf("occupancy %d, want the engine's 3 plus the 1 sent after the note at t0+530ms", got)
	}
	// The engine is full by its own count: the held count binds again.
	s.observe(sig(t0.Add(600*time.Millisecond), 12), t0.Add(700*time.Millisecond))
	if got := s.occupancy(); got != s.held.Load() {
		t.Fatalf("occupancy %d, want the %d held when the engine counts more", got, s.held.Load())
	}
}
