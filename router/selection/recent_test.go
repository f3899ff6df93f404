package selection

import (
	"math/rand/v2"
	"sync"
	"testing"
)

func mustRecent(t testing.TB, size int) *RecentKeys {
	t.Helper()
	rk, err := NewRecentKeys(size)
	if err != nil {
		t.Fatal(err)
	}
	return rk
}

func TestNewRecentKeysRejects(t *testing.T) {
	for _, n := range []int{0, -1, 3, 1000, 1 << 25} {
		if _, err := NewRecentKeys(n); err == nil {
			t.Errorf("NewRecentKeys(%d) succeeded, want an error", n)
		}
	}
	if _, err := NewRecentKeys(1); err != nil {
		t.Errorf("NewRecentKeys(1): %v", err)
	}
}

func TestPickRecentKeepsKeysAcrossTables(t *testing.T) {
	old := mustTable(t, engineSet([]float64{0.25, 0.25, 0.25, 0.25}), TableOptions{Epsilon: -1})
	g := &fakeLoadGuard{fakeGuard: newFakeGuard(4), load: []float64{0.5, 0.1, 0.3, 0.2}}
	rk := mustRecent(t, 1<<20) // 200 keys in 2^20 entries: no two share one
	keys := keyHashes(200)
	first := make([]int, len(keys))
	for k, key := range keys {
		// An unseen key goes to the least loaded, relative to its plan, of
		// NewKeyChoices weighted candidates: the key's p0 slot's engine
		// and the next probes' other than it, the p0 kept unless another
		// is lighter by more than the margin.
		p0 := int(old.slots[old.probe(key, 0)])
		want, best := p0, g.load[p0]/old.Planned(p0)-TwoChoiceMargin
		for k, n := 1, 1; k < maxProbes && n < NewKeyChoices; k++ {
			j := int(old.slots[old.probe(key, k)])
			if j == p0 {
				continue
			}
			n++
			if r := g.load[j] / old.Planned(j); r < best {
				want, best = j, r
			}
		}
		i, ok := old.PickRecent(key, g, rk)
		if !ok || i != want {
			t.Fatalf("key %x unseen: PickRecent = %d, %v, want %d with loads %v", key, i, ok, want, g.load)
		}
		first[k] = i
	}
	// A new snapshot moves weight from engine 0 to engine 3; remembered keys
	// stay where they are whatever the loads say, while their engine keeps
	// a positive weight.
	cur := mustTable(t, engineSet([]float64{0.05, 0.25, 0.25, 0.45}), TableOptions{Epsilon: -1})
	g.load = []float64{0, 1, 1, 1}
	for k, key := range keys {
		if i, ok := cur.PickRecent(key, g, rk); !ok || i != first[k] {
			t.Fatalf("key %x remembered on %d: PickRecent = %d, %v", key, first[k], i, ok)
		}
	}
	// Engine 1 goes down: its keys go where Pick sends them, and stay there.
	g.down[1] = true
	moved := 0
	for k, key := range keys {
		i, ok := cur.PickRecent(key, g, rk)
		if !ok || i == 1 {
			t.Fatalf("key %x: PickRecent = %d, %v with engine 1 down", key, i, ok)
		}
		if first[k] == 1 {
			if want, _ := cur.Pick(key, g); i != want {
				t.Fatalf("key %x of the down engine: PickRecent = %d, want Pick's %d", key, i, want)
			}
			first[k] = i
			moved++
		} else if i != first[k] {
			t.Fatalf("key %x remembered on live engine %d: PickRecent = %d", key, first[k], i)
		}
	}
	if moved == 0 {
		t.Fatal("no key was remembered on engine 1; the test proves nothing")
	}
	g.down[1] = false
	for k, key := range keys {
		if i, _ := cur.PickRecent(key, g, rk); i != first[k] {
			t.Fatalf("key %x: back to %d after its engine returned, want it to stay on %d", key, i, first[k])
		}
	}
	// Engine 2 loses its weight: its keys leave it.
	last := mustTable(t, engineSet([]float64{0.3, 0.3, 0, 0.4}), TableOptions{Epsilon: -1})
	for _, key := range keys {
		if i, ok := last.PickRecent(key, g, rk); !ok || i == 2 {
			t.Fatalf("key %x: PickRecent = %d, %v on an engine of weight 0", key, i, ok)
		}
	}
}

func TestPickRecentBoundedLoad(t *testing.T) {
	tbl := mustTable(t, engineSet([]float64{0.5, 0.5}), TableOptions{Epsilon: 0.25})
	g := &fakeLoadGuard{fakeGuard: newFakeGuard(2), load: []float64{0, 0}}
	rk := mustRecent(t, 1<<10)
	key := keyHashes(1)[0]
	i, _ := tbl.PickRecent(key, g, rk)
	// The remembered engine holds 10 of 10 in flight, over 1.25·0.5·10+1:
	// the key spills like Pick spills it.
	g.inflight[i], g.total = 10, 10
	if j, ok := tbl.PickRecent(key, g, rk); !ok || j == i {
		t.Fatalf("PickRecent = %d, %v, want a spill off overloaded engine %d", j, ok, i)
	}
}

func TestPickRecentNil(t *testing.T) {
	tbl := mustTable(t, engineSet([]float64{0.4, 0.3, 0.3}), TableOptions{})
	for _, key := range keyHashes(100) {
		want, _ := tbl.Primary(key)
		if i, ok := tbl.PickRecent(key, nil, nil); !ok || i != want {
			t.Fatalf("key %x: PickRecent(nil, nil) = %d, %v, want primary %d", key, i, ok, want)
		}
	}
}

func TestPickRecentAllocsAndConcurrency(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	tbl := mustTable(t, engineSet(randomWeights(r, 100, 1)), TableOptions{})
	g := &fakeLoadGuard{fakeGuard: newFakeGuard(tbl.Len()), load: make([]float64, tbl.Len())}
	rk := mustRecent(t, 1<<10)
	keys := keyHashes(4096)
	var n int
	allocs := testing.AllocsPerRun(1000, func() {
		n++
		tbl.PickRecent(keys[n&4095], g, rk)
	})
	if allocs != 0 {
		t.Fatalf("PickRecent allocates %.1f times per call", allocs)
	}
	// Routers pick from many goroutines at once (run with -race).
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for k := 0; k < 2000; k++ {
				if _, ok := tbl.PickRecent(keys[(k*7+w)&4095], g, rk); !ok {
					t.Errorf("PickRecent found no engine")
					return
				}
			}
		}(w)
	}
	wg.Wait()
}
