package selection

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// slotTable builds a table from a slot state over es, as a router does.
func slotTable(t testing.TB, s slotState, es []Engine) *Table {
	t.Helper()
	by := map[string]Engine{}
	for _, e := range es {
		by[e.Name] = e
	}
	var list []Engine
	seen := map[string]bool{}
	for _, n := range s.names {
		list = append(list, by[n])
		seen[n] = true
	}
	for _, e := range es {
		if !seen[e.Name] {
			list = append(list, e)
		}
	}
	tbl, err := NewTableFromSlots(list, s.idx, TableOptions{})
	if err != nil {
		t.Fatalf("NewTableFromSlots: %v", err)
	}
	return tbl
}

func TestNewTableFromSlotsRejects(t *testing.T) {
	es := engineSet([]float64{0.5, 0.4, 0})
	ok := make([]uint16, 1024)
	for i := range ok {
		ok[i] = uint16(i % 2)
	}
	if _, err := NewTableFromSlots(es, ok, TableOptions{}); err != nil {
		t.Fatalf("valid slots rejected: %v", err)
	}
	bad := func(mod func([]uint16) []uint16) []uint16 { return mod(append([]uint16(nil), ok...)) }
	for _, c := range []struct {
		name    string
		engines []Engine
		slots   []uint16
	}{
		{"not a power of two", es, ok[:1000]},
		{"index out of range", es, bad(func(s []uint16) []uint16 { s[7] = 3; return s })},
		{"zero-weight engine", es, bad(func(s []uint16) []uint16 { s[7] = 2; return s })},
		{"no slots but weights", es, nil},
		{"bad engine name", []Engine{{Name: "a.b", Weight: 0.5}, {Name: "c", Weight: 0.5}}, ok},
		{"duplicate engine", []Engine{{Name: "a", Weight: 0.5}, {Name: "a", Weight: 0.5}}, ok},
		{"weights over one", []Engine{{Name: "a", Weight: 0.7}, {Name: "b", Weight: 0.7}}, ok},
	} {
		if _, err := NewTableFromSlots(c.engines, c.slots, TableOptions{}); err == nil {
			t.Errorf("%s: NewTableFromSlots succeeded", c.name)
		}
	}
	tbl, err := NewTableFromSlots(engineSet([]float64{0}), nil, TableOptions{})
	if err != nil {
		t.Fatalf("empty table rejected: %v", err)
	}
	if _, ok := tbl.Pick(1, nil); ok {
		t.Fatal("empty table picked an engine")
	}
}

// TestNewTableFromSlotsMapsByName: the slots refer to the engines as given;
// the table, indexed by name, maps every key to the same engine name.
func TestNewTableFromSlotsMapsByName(t *testing.T) {
	es := []Engine{{Name: "z", Weight: 0.3}, {Name: "a", Weight: 0.6}, {Name: "m", Weight: 0}}
	idx := make([]uint16, 1024)
	for i := range idx {
		idx[i] = uint16(i % 2) // z, a, z, a, ...
	}
	tbl, err := NewTableFromSlots(es, idx, TableOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tbl.Slots() != 1024 || tbl.Engine(0).Name != "a" {
		t.Fatalf("slots %d, first engine %q", tbl.Slots(), tbl.Engine(0).Name)
	}
	for s := uint64(0); s < 1024; s++ {
		i, ok := tbl.Primary(s << 54)
		want := []string{"z", "a"}[s%2]
		if !ok || tbl.Engine(i).Name != want {
			t.Fatalf("slot %d: %q, want %q", s, tbl.Engine(i).Name, want)
		}
	}
	if a, _ := tbl.Index("a"); tbl.Share(a) != 0.5 {
		t.Errorf("share of a = %v, want 0.5", tbl.Share(a))
	}
	// The input order does not matter.
	rev := []Engine{es[2], es[1], es[0]}
	ridx := make([]uint16, len(idx))
	for i, j := range idx {
		ridx[i] = 2 - j
	}
	tbl2, err := NewTableFromSlots(rev, ridx, TableOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keyHashes(5000) {
		i, _ := tbl.Primary(k)
		j, _ := tbl2.Primary(k)
		if i != j {
			t.Fatalf("key %x: %d vs %d after reordering", k, i, j)
		}
	}
}

// TestSlotTableGuards: down engines are skipped, overloaded ones spill, and
// candidates are distinct engines with weight, the primary first.
func TestSlotTableGuards(t *testing.T) {
	es := engineSet([]float64{0.45, 0.3, 0.15, 0.05, 0})
	tbl := slotTable(t, assign(t, slotState{}, es), es)
	keys := keyHashes(2000)
	for _, k := range keys[:500] {
		got := tbl.Candidates(k, make([]int, 0, 10))
		if len(got) != 4 {
			t.Fatalf("key %x: candidates %v, want the 4 engines with weight", k, got)
		}
		if p, _ := tbl.Primary(k); got[0] != p {
			t.Fatalf("key %x: first candidate %d, want primary %d", k, got[0], p)
		}
		seen := map[int]bool{}
		for _, i := range got {
			if seen[i] || tbl.Engine(i).Weight == 0 {
				t.Fatalf("key %x: candidates %v", k, got)
			}
			seen[i] = true
		}
	}
	g := newFakeGuard(tbl.Len())
	g.down[0] = true
	for _, k := range keys {
		i, ok := tbl.Pick(k, g)
		if !ok || i == 0 {
			t.Fatalf("key %x: Pick = %d, %v with engine 0 down", k, i, ok)
		}
		if p, _ := tbl.Primary(k); p != 0 && p != i {
			t.Fatalf("key %x: moved from live engine %d to %d", k, p, i)
		}
	}
	g.down[0] = false
	g.inflight[0], g.total = 100, 100 // e0 far over 1.25·0.5·100+1
	for _, k := range keys {
		if i, ok := tbl.Pick(k, g); !ok || i == 0 {
			t.Fatalf("key %x: Pick = %d, %v with engine 0 overloaded", k, i, ok)
		}
	}
}

// TestSlotAffinity is the affinity criterion, measured on 100,000
// keys through the tables routers build from snapshot slots: with fixed
// weights every key maps to the same engine every time, and after a change
// of total-variation distance δ (normalised weights) — of many weights at
// once, engines joining and leaving — at most 1.2·δ + 0.01 of keys move.
func TestSlotAffinity(t *testing.T) {
	keys := keyHashes(affinityKeys)
	for _, n := range []int{3, 10, 50, 300, 2000} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			t.Parallel() // its own engines and tables; the keys are only read
			r := rand.New(rand.NewPCG(uint64(n), 61))
			es := engineSet(randomWeights(r, n, 0.95))
			s := assign(t, slotState{}, es)
			tbl := slotTable(t, s, es)

			// Fixed weights: the same engine every time, through re-assigned
			// and rebuilt tables too.
			again := slotTable(t, assign(t, s, es), es)
			for _, k := range keys {
				i, _ := tbl.Pick(k, nil)
				j, _ := tbl.Pick(k, nil)
				l, _ := again.Pick(k, nil)
				if i != j || i != l {
					t.Fatalf("key %x: engines %d, %d, %d with fixed weights", k, i, j, l)
				}
			}

			next := 0
			worstRatio, worstExcess := 0.0, 0.0
			for step := 0; step < 30; step++ {
				es2 := perturb(r, es, step, &next)
				s2 := assign(t, s, es2)
				tbl2 := slotTable(t, s2, es2)
				delta := tvDistance(es, es2)
				got := movedFraction(tbl, tbl2, keys)
				limit := 1.2*delta + 0.01
				if got > limit {
					t.Fatalf("step %d: moved %.4f of keys, limit %.4f (δ=%.4f)", step, got, limit, delta)
				}
				if delta > 0.02 {
					worstRatio = math.Max(worstRatio, got/delta)
				}
				worstExcess = math.Max(worstExcess, got-delta)
				if step < 5 || step%10 == 0 {
					t.Logf("step %2d: %d engines, %d slots, δ=%.4f moved=%.4f (%.3f·δ)", step, len(es2), len(s2.idx),
						delta, got, got/math.Max(delta, 1e-9))
				}
				es, s, tbl = es2, s2, tbl2
			}
			t.Logf("worst moved/δ (δ > 0.02) %.3f, worst moved − δ %+.4f", worstRatio, worstExcess)
		})
	}
}
