package selection

import (
	"math"
	"testing"
)

// TestPickPrefix: the deepest own prefix wins while its engine can take
// the request, beyond the bounded load too; a full batch, a down engine or
// zero weight send it where the weights place it; a shared prefix draws
// only an engine no busier than the placed one and within its bounded
// load.
func TestPickPrefix(t *testing.T) {
	tbl := mustTable(t, engineSet([]float64{0.25, 0.25, 0.25, 0.25}), TableOptions{})
	newGuard := func() *fakeLoadGuard {
		return &fakeLoadGuard{fakeGuard: newFakeGuard(tbl.Len()), load: make([]float64, tbl.Len())}
	}
	key := SpreadKey(42)
	g := newGuard()
	base, _ := tbl.PickPrefix(key, g, nil, 0, 7)
	other := (base + 1) % tbl.Len()
	held := []Held{{Index: other, Blocks: 7}, {Index: base, Blocks: 6}}
	if i, _ := tbl.PickPrefix(key, g, held, 0, 7); i != other {
		t.Fatalf("own prefix 7 deep on %d: picked %d", other, i)
	}
	if i, _ := tbl.PickPrefix(key, g, held, 7, 7); i != other {
		t.Fatalf("shared prefix on an idle holder: picked %d, want %d", i, other)
	}
	g.load[other] = 0.5
	if i, _ := tbl.PickPrefix(key, g, held, 7, 7); i != base {
		t.Fatalf("shared prefix on a busier holder: picked %d, want the placed %d", i, base)
	}
	if i, _ := tbl.PickPrefix(key, g, held, 0, 7); i != other {
		t.Fatalf("own prefix on a busier holder with a free slot: picked %d, want %d", i, other)
	}
	g.load[other] = 1
	if i, _ := tbl.PickPrefix(key, g, held, 0, 7); i != base {
		t.Fatalf("own prefix on a full batch: picked %d, want the placed %d", i, base)
	}
	g.load[other] = 0
	g.down[other] = true
	if i, _ := tbl.PickPrefix(key, g, held, 0, 7); i != base {
		t.Fatalf("own prefix on a down engine: picked %d, want %d", i, base)
	}
	g = newGuard()
	g.inflight[other], g.total = 10, 10
	if i, _ := tbl.PickPrefix(key, g, held, 0, 7); i != other {
		t.Fatalf("own prefix beyond the bounded load with a free slot: picked %d, want its holder %d", i, other)
	}
	if i, _ := tbl.PickPrefix(key, g, held, 7, 7); i != base {
		t.Fatalf("shared prefix beyond the bounded load: picked %d, want %d", i, base)
	}
	g = newGuard()
	if i, _ := tbl.PickPrefix(key, g, []Held{{Index: -1, Blocks: 9}, {Index: 99, Blocks: 9}}, 0, 9); i != base {
		t.Fatalf("out-of-table holders: picked %d, want %d", i, base)
	}
	zero := mustTable(t, engineSet([]float64{1, 0}), TableOptions{})
	if i, _ := zero.PickPrefix(key, newGuardFor(zero), []Held{{Index: 1, Blocks: 5}}, 0, 5); i != 0 {
		t.Fatalf("holder of zero weight: picked %d, want 0", i)
	}
	if a := testing.AllocsPerRun(100, func() { tbl.PickPrefix(key, g, held, 0, 7) }); a != 0 {
		t.Fatalf("PickPrefix allocates %v times", a)
	}
}

// TestPickPrefixWeighsOwnPrefixAgainstLoad: a prefix no other engine holds
// any of holds a request on a busier engine only as far as the prefill it
// saves: a continuation whose history is most of the request stays on an
// engine several times as loaded as the placed one, a new request behind a
// context one engine alone holds (a repository's before a new file) goes
// there only while the engine is nearly as idle as the placed one; an own
// prefix beyond a part other engines hold stays, and a holder whose load is
// unknown keeps the request.
func TestPickPrefixWeighsOwnPrefixAgainstLoad(t *testing.T) {
	tbl := mustTable(t, engineSet([]float64{0.25, 0.25, 0.25, 0.25}), TableOptions{})
	g := newGuardFor(tbl)
	key := SpreadKey(42)
	base, _ := tbl.PickPrefix(key, g, nil, 0, 8)
	other := (base + 1) % tbl.Len()
	for i := range g.load {
		g.load[i] = 0.2
	}
	// Relative to plan (a quarter each) the placed engine is at 0.8, the
	// holder at 4·load: 7 of 8 blocks held is worth up to 8× the load (less
	// the margin), 2 of 8 up to 8/6×.
	g.load[other] = 0.5
	if i, _ := tbl.PickPrefix(key, g, []Held{{Index: other, Blocks: 7}}, 0, 8); i != other {
		t.Fatalf("continuation holding 7 of 8 blocks on a holder at 0.5 (placed at 0.2): picked %d, want the holder %d", i, other)
	}
	if i, _ := tbl.PickPrefix(key, g, []Held{{Index: other, Blocks: 2}}, 0, 8); i != base {
		t.Fatalf("new request holding 2 of 8 blocks on a holder at 0.5 (placed at 0.2): picked %d, want the placed %d", i, base)
	}
	g.load[other] = 0.25
	if i, _ := tbl.PickPrefix(key, g, []Held{{Index: other, Blocks: 2}}, 0, 8); i != other {
		t.Fatalf("new request holding 2 of 8 blocks on a holder at 0.25 (placed at 0.2): picked %d, want the holder %d", i, other)
	}
	// Where another engine holds a shared part, what lies deeper is the
	// request's own, and it stays on its busier holder.
	g.load[other] = 0.5
	if i, _ := tbl.PickPrefix(key, g, []Held{{Index: other, Blocks: 2}, {Index: base, Blocks: 1}}, 1, 8); i != other {
		t.Fatalf("own prefix beyond a shared block on a holder at 0.5 (placed at 0.2): picked %d, want the holder %d", i, other)
	}
	g.load[other] = math.NaN()
	if i, _ := tbl.PickPrefix(key, g, []Held{{Index: other, Blocks: 2}}, 0, 8); i != other {
		t.Fatalf("holder of unknown load: picked %d, want the holder %d", i, other)
	}
	if a := testing.AllocsPerRun(100, func() { tbl.PickPrefix(key, g, []Held{{Index: other, Blocks: 2}}, 0, 8) }); a != 0 {
		t.Fatalf("PickPrefix allocates %v times", a)
	}
}

func newGuardFor(t *Table) *fakeLoadGuard {
	return &fakeLoadGuard{fakeGuard: newFakeGuard(t.Len()), load: make([]float64, t.Len())}
}
