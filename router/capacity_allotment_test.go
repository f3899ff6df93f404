package router

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/guard"
	"github.com/switchyard-dev/switchyard/router/httpfront"
)

// TestCapacityAllotmentShedsBurst: while the snapshot sheds, a burst is
// admitted up to the engines' batch slots plus each class's queue steps
// (CapacityAllotment), not up to the latency-based allotment, and the rest
// is shed at once with reason "admission": sheddable requests first,
// critical ones last.
func TestCapacityAllotmentShedsBurst(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		// λ = 10 req/s (a shed of 1% relaxes to none, so no key is shed by
		// the snapshot); each engine 4 slots at 5 req/s, 0.8 s a slot, and
		// 1 s steps: sheddable 10·0.8 = 8, standard 10·(0.8+0.375) =
		// 11.75, critical 10·(0.8+20) = 208. The latency
		// allotment would allow 1.5·m + 4·√m = 3,100 at m = 1,000.
		f := newCapacityFront(t, kind)
		b := &burster{f: f}
		count, held := b.count, b.held
		b.burst("sheddable", 12)
		ok := poll(5*time.Second, func() bool { return held() == 8 && count("sheddable429") == 4 }) &&
			b.then("standard", 8) &&
			poll(5*time.Second, func() bool { return held() == 11 && count("standard429") == 5 }) &&
			b.then("critical", 5) &&
			poll(5*time.Second, func() bool { return held() == 16 })
		b.release()
		if !ok {
			t.Fatalf("held %d; shed %d sheddable, %d standard, %d critical", held(), count("sheddable429"), count("standard429"), count("critical429"))
		}
		if count("sheddable200") != 8 || count("standard200") != 3 || count("critical200") != 5 {
			t.Fatalf("served %d sheddable, %d standard, %d critical", count("sheddable200"), count("standard200"), count("critical200"))
		}
		if n := metricValue(f.h.metrics.shed.WithLabelValues(string(guard.ShedAdmission), "standard")); n != 5 {
			t.Fatalf("standard requests shed by admission: %v, want 5", n)
		}
	})
}

// newCapacityFront returns a front of two holding engines whose snapshot
// sheds (1%, relaxed to none, so no key is shed by the snapshot) at a
// planned 10 req/s, and whose signals tell 4 slots at 5 req/s (0.8 s a
// slot) and 1 s decode steps: capacity allotments of 10·0.8 = 8
// sheddable, 10·(0.8+0.375) = 11.75 standard and 10·(0.8+20) = 208 critical
// requests, where the latency allotment would allow 3,100.
func newCapacityFront(t *testing.T, kind httpfront.ServerKind) *pfront {
	t.Helper()
	figs := &guard.Figures{ShedFraction: 0.01, DemandRPS: 10 / 0.99, Latency: 100 * time.Second, Utilisation: 1}
	f := newPFront(t, kind, []int32{modeHold, modeHold}, []float64{0.5, 0.5}, figs, Options{})
	for _, e := range f.engines {
		f.h.ObserveSignal(&messages.EngineSignal{Model: "m", Engine: e.name, MaxRunning: 4, CapacityRPS: 5, TBTMs: 1000,
			Time: time.Now().UnixMilli()})
	}
	return f
}

// TestCapacityAllotmentKeepsOngoingConversations: when the capacity
// allotment sheds standard requests, one whose session id this router has
// routed before gets another step of queue (up to 10·(0.8+1.375) = 21.75 in
// flight), so a new conversation is shed while an ongoing one goes on.
func TestCapacityAllotmentKeepsOngoingConversations(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		f := newCapacityFront(t, kind)
		b := &burster{f: f}
		var wg sync.WaitGroup
		session := func(id string) chan int {
			code := make(chan int, 1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				code <- f.do(streamBody("x"), map[string]string{messages.HeaderPriority: "standard", messages.HeaderSessionID: id}).status
			}()
			return code
		}
		first := session("conv-a")
		ok := poll(5*time.Second, func() bool { return b.held() == 1 }) &&
			b.then("standard", 20) &&
			poll(5*time.Second, func() bool { return b.held() == 11 && b.count("standard429") == 10 })
		var newConv int
		if ok {
			newConv = f.do(streamBody("x"), map[string]string{messages.HeaderPriority: "standard", messages.HeaderSessionID: "conv-b"}).status
		}
		var second chan int
		ok = ok && newConv == http.StatusTooManyRequests
		if ok {
			second = session("conv-a")
			ok = poll(5*time.Second, func() bool { return b.held() == 12 })
		}
		held := b.held()
		b.release()
		wg.Wait()
		if !ok {
			t.Fatalf("held %d, new conversation answered %d, %d standard shed", held, newConv, b.count("standard429"))
		}
		if c := <-first; c != http.StatusOK {
			t.Fatalf("the conversation's first request answered %d", c)
		}
		if c := <-second; c != http.StatusOK {
			t.Fatalf("the ongoing conversation's request answered %d, want 200", c)
		}
	})
}
