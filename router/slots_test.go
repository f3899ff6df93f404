package router

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// slotState is a slot table as the optimizer keeps it: engine names and
// slot indexes into them.
type slotState struct {
	names []string
	idx   []uint16
}

// assign runs AssignSlots from prev for es (engines with positive weight),
// with SlotCount's slot count (never shrinking), as the optimizer does.
func assign(t testing.TB, prev slotState, es []Engine) slotState {
	t.Helper()
	var names []string
	var ws []float64
	for _, e := range es {
		if e.Weight > 0 {
			names = append(names, e.Name)
			ws = append(ws, e.Weight)
		}
	}
	m := max(SlotCount(len(names)), len(prev.idx))
	out := AssignSlots(prev.idx, prev.names, names, ws, m)
	if out == nil {
		t.Fatalf("AssignSlots(%d engines, %d slots) = nil", len(names), m)
	}
	return slotState{names: names, idx: out}
}

// owners maps each slot to its engine's name.
func (s slotState) owners() []string {
	o := make([]string, len(s.idx))
	for i, j := range s.idx {
		o[i] = s.names[j]
	}
	return o
}

func (s slotState) counts() map[string]int {
	c := map[string]int{}
	for _, j := range s.idx {
		c[s.names[j]]++
	}
	return c
}

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

func TestSlotCount(t *testing.T) {
	for _, c := range []struct{ n, want int }{
		{0, 4096}, {1, 4096}, {256, 4096}, {257, 8192}, {1000, 16384}, {4096, 65536}, {10000, 65536}, {1 << 20, 65536},
	} {
		if got := SlotCount(c.n); got != c.want {
			t.Errorf("SlotCount(%d) = %d, want %d", c.n, got, c.want)
		}
	}
}

func TestAssignSlotsRejects(t *testing.T) {
	names, ws := []string{"a", "b"}, []float64{0.5, 0.5}
	for _, c := range []struct {
		name    string
		names   []string
		weights []float64
		slots   int
	}{
		{"zero slots", names, ws, 0},
		{"not a power of two", names, ws, 1000},
		{"too many slots", names, ws, 2 * MaxAssignedSlots},
		{"length mismatch", names, ws[:1], 1024},
		{"duplicate", []string{"a", "a"}, ws, 1024},
		{"no positive weight", names, []float64{0, math.NaN()}, 1024},
	} {
		if out := AssignSlots(nil, nil, c.names, c.weights, c.slots); out != nil {
			t.Errorf("%s: AssignSlots returned %d slots, want nil", c.name, len(out))
		}
	}
}

// TestAssignSlotsCounts: counts are the largest-remainder apportionment.
func TestAssignSlotsCounts(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, n := range []int{1, 2, 3, 10, 100, 1000} {
		es := engineSet(randomWeights(r, n, 1))
		es[0].Weight = 0 // ignored (unless alone)
		if n == 1 {
			es[0].Weight = 1
		}
		s := assign(t, slotState{}, es)
		m := len(s.idx)
		counts := s.counts()
		sum := 0.0
		for _, e := range es {
			sum += e.Weight
		}
		total, over := 0, 0
		for _, e := range es {
			q := float64(m) * e.Weight / sum
			c := counts[e.Name]
			total += c
			if float64(c) < math.Floor(q) || float64(c) > math.Ceil(q) {
				t.Errorf("n=%d %s: %d slots, quota %.3f", n, e.Name, c, q)
			}
			if float64(c) > q {
				over++
			}
		}
		if total != m {
			t.Errorf("n=%d: %d slots assigned of %d", n, total, m)
		}
		if n > 1 && over > n {
			t.Errorf("n=%d: %d engines rounded up", n, over)
		}
	}
	// Ties broken by name: three equal weights on 1024 slots, 1 slot left
	// over goes to the first name.
	out := AssignSlots(nil, nil, []string{"c", "a", "b"}, []float64{1, 1, 1}, 1024)
	c := map[uint16]int{}
	for _, j := range out {
		c[j]++
	}
	if c[1] != 342 || c[2] != 341 || c[0] != 341 {
		t.Errorf("equal weights: counts c=%d a=%d b=%d, want 341 342 341", c[0], c[1], c[2])
	}
}

// minimalMoves is Σ max(0, old count − new count) over engine names.
func minimalMoves(a, b slotState) int {
	ca, cb := a.counts(), b.counts()
	n := 0
	for e, c := range ca {
		if c > cb[e] {
			n += c - cb[e]
		}
	}
	return n
}

func movedSlots(a, b slotState) int {
	oa, ob := a.owners(), b.owners()
	n := 0
	for s := range oa {
		if oa[s] != ob[s] {
			n++
		}
	}
	return n
}

// perturb returns es with a random multi-engine change: every weight
// perturbed, several engines trading mass, engines added, removed or zeroed.
func perturb(r *rand.Rand, es []Engine, step int, nextName *int) []Engine {
	out := append([]Engine(nil), es...)
	switch step % 6 {
	case 0, 1: // every weight perturbed
		sigma := []float64{0.05, 0.3}[step%2]
		for i := range out {
			out[i].Weight *= math.Exp(r.NormFloat64() * sigma)
		}
	case 2: // several engines at once gain or lose a lot
		for k := 0; k < 1+len(out)/4; k++ {
			i := r.IntN(len(out))
			out[i].Weight *= math.Exp(r.NormFloat64())
		}
	case 3: // engines leave and join
		for k := 0; k < 1+len(out)/10 && len(out) > 2; k++ {
			i := r.IntN(len(out))
			out = append(out[:i], out[i+1:]...)
		}
		for k := 0; k < 1+len(es)/10; k++ {
			*nextName++
			out = append(out, Engine{Name: fmt.Sprintf("x%d", *nextName), Weight: r.ExpFloat64() / float64(len(es))})
		}
	case 5: // mass moves from one engine to another (stateless tables move up to ~2δ)
		i, j := r.IntN(len(out)), r.IntN(len(out))
		amount := out[i].Weight * r.Float64()
		out[i].Weight -= amount
		out[j].Weight += amount
	case 4: // one engine's weight drops to zero, another's doubles, the rest are noisy
		i, j := r.IntN(len(out)), r.IntN(len(out))
		out[j].Weight *= 2
		out[i].Weight = 0
		for k := range out {
			out[k].Weight *= math.Exp(r.NormFloat64() * 0.1)
		}
	}
	sum := 0.0
	for _, e := range out {
		sum += e.Weight
	}
	if sum == 0 {
		out[0].Weight, sum = 1, 1
	}
	for i := range out {
		out[i].Weight *= 0.9 / sum // 10% shed: only ratios matter
	}
	return out
}

// TestAssignSlotsMinimalMovement: after any change, exactly the slots that
// the new counts force to move do, and every engine keeps min(old, new) of
// its slots.
func TestAssignSlotsMinimalMovement(t *testing.T) {
	for _, n := range []int{2, 5, 30, 300} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(n), 21))
			es := engineSet(randomWeights(r, n, 1))
			s := assign(t, slotState{}, es)
			next := 0
			worst := 0.0
			for step := 0; step < 25; step++ {
				es2 := perturb(r, es, step, &next)
				s2 := assign(t, s, es2)
				if len(s2.idx) != len(s.idx) {
					// the table grew; doubling preserves the mapping
					continue
				}
				got, want := movedSlots(s, s2), minimalMoves(s, s2)
				if got != want {
					t.Fatalf("step %d: %d slots moved, minimum %d", step, got, want)
				}
				ca, cb := s.counts(), s2.counts()
				oa, ob := s.owners(), s2.owners()
				kept := map[string]int{}
				for i := range oa {
					if oa[i] == ob[i] {
						kept[oa[i]]++
					}
				}
				for e, c := range ca {
					if kept[e] != min(c, cb[e]) {
						t.Fatalf("step %d: %s kept %d of %d slots, new count %d", step, e, kept[e], c, cb[e])
					}
				}
				delta := tvDistance(es, es2)
				frac := float64(got) / float64(len(s.idx))
				// Rounding: each count is within one slot of its quota.
				if slack := float64(len(es)+len(es2)) / float64(len(s.idx)); frac > delta+slack {
					t.Fatalf("step %d: moved %.4f of slots, δ=%.4f", step, frac, delta)
				}
				if delta > 0.01 {
					worst = math.Max(worst, frac/delta)
				}
				es, s = es2, s2
			}
			t.Logf("worst moved/δ over steps with δ > 0.01: %.3f", worst)
		})
	}
}

// TestAssignSlotsDeterministic: the result depends on names and weights,
// not on input order, and is the same every time.
func TestAssignSlotsDeterministic(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	es := engineSet(randomWeights(r, 40, 1))
	s := assign(t, slotState{}, es)
	next := 0
	es2 := perturb(r, es, 0, &next)
	a := assign(t, s, es2)
	if b := assign(t, s, es2); movedSlots(a, b) != 0 {
		t.Fatal("same input, different slots")
	}
	// Shuffle the new engines and the previous state's names.
	sh := append([]Engine(nil), es2...)
	r.Shuffle(len(sh), func(i, j int) { sh[i], sh[j] = sh[j], sh[i] })
	perm := r.Perm(len(s.names))
	ps := slotState{names: make([]string, len(s.names)), idx: make([]uint16, len(s.idx))}
	for old, nw := range perm {
		ps.names[nw] = s.names[old]
	}
	for i, j := range s.idx {
		ps.idx[i] = uint16(perm[j])
	}
	if b := assign(t, ps, sh); movedSlots(a, b) != 0 {
		t.Fatalf("%d slots differ after reordering the input", movedSlots(a, b))
	}
	// Fixed weights: nothing moves, again and again.
	for k := 0; k < 3; k++ {
		b := assign(t, a, es2)
		if movedSlots(a, b) != 0 {
			t.Fatalf("round %d: slots moved with unchanged weights", k)
		}
		a = b
	}
}

// TestAssignSlotsStartsFromRendezvous: without a previous table the slots
// are NewTable's, but for the rounding to exact counts.
func TestAssignSlotsStartsFromRendezvous(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for _, n := range []int{3, 50} {
		es := engineSet(randomWeights(r, n, 1))
		s := assign(t, slotState{}, es)
		tbl := mustTable(t, es, TableOptions{Slots: len(s.idx)})
		rv := slotState{names: make([]string, tbl.Len()), idx: make([]uint16, tbl.Slots())}
		for i := range rv.names {
			rv.names[i] = tbl.Engine(i).Name
		}
		for i, j := range tbl.slots {
			rv.idx[i] = uint16(j)
		}
		// Only the rebalancing from the rendezvous shares (sampled) to the
		// exact counts moves slots, and no more than it must.
		differ, want := movedSlots(rv, s), minimalMoves(rv, s)
		t.Logf("n=%d: %.4f of slots differ from the rendezvous table", n, float64(differ)/float64(len(s.idx)))
		if differ != want {
			t.Errorf("n=%d: %d slots differ from the rendezvous table, minimum %d", n, differ, want)
		}
	}
}

// TestAssignSlotsResize: doubling the slot count moves no key; halving keeps
// the engine of one slot of each pair.
func TestAssignSlotsResize(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 52))
	es := engineSet(randomWeights(r, 20, 1))
	names := make([]string, len(es))
	ws := make([]float64, len(es))
	for i, e := range es {
		names[i], ws[i] = e.Name, e.Weight
	}
	small := AssignSlots(nil, nil, names, ws, 4096)
	big := AssignSlots(small, names, names, ws, 8192)
	moved := 0
	for s := range big {
		if big[s] != small[s/2] {
			moved++
		}
	}
	// Only the rounding to the new counts moves slots.
	if moved > len(es) {
		t.Errorf("doubling moved %d slots", moved)
	}
	back := AssignSlots(big, names, names, ws, 4096)
	if len(back) != 4096 {
		t.Fatalf("halving returned %d slots", len(back))
	}
	kept := 0
	for s := range back {
		if back[s] == big[2*s] || back[s] == big[2*s+1] {
			kept++
		}
	}
	if kept < 4096-len(es) {
		t.Errorf("halving: only %d slots kept an engine of their pair", kept)
	}
}

// TestAssignSlotsScattersMoves: the slots an engine gives up and the ones
// another receives are spread over the whole table.
func TestAssignSlotsScattersMoves(t *testing.T) {
	names, m := []string{"a", "b"}, 4096
	prev := AssignSlots(nil, nil, names, []float64{0.5, 0.5}, m)
	next := AssignSlots(prev, names, names, []float64{0.4, 0.6}, m)
	var moved []int
	for s := range prev {
		if prev[s] != next[s] {
			moved = append(moved, s)
		}
	}
	if len(moved) != 2048-1638 {
		t.Fatalf("%d slots moved, want %d", len(moved), 2048-1638)
	}
	var octant [8]int
	for _, s := range moved {
		octant[s*8/m]++
	}
	for i, c := range octant {
		if c < len(moved)/16 {
			t.Errorf("octant %d holds %d of %d moved slots: %v", i, c, len(moved), octant)
		}
	}
	// No long runs of consecutive moved slots.
	sort.Ints(moved)
	run, longest := 1, 1
	for i := 1; i < len(moved); i++ {
		if moved[i] == moved[i-1]+1 {
			run++
			longest = max(longest, run)
		} else {
			run = 1
		}
	}
	if longest > 8 {
		t.Errorf("%d consecutive slots moved", longest)
	}
}

func TestSlotsEncoding(t *testing.T) {
	idx := []uint16{0, 1, 255, 256, 65535}
	b := EncodeSlots(idx)
	if len(b) != 10 || b[4] != 255 || b[5] != 0 || b[6] != 0 || b[7] != 1 {
		t.Fatalf("EncodeSlots = %v", b)
	}
	back, err := DecodeSlots(b)
	if err != nil || fmt.Sprint(back) != fmt.Sprint(idx) {
		t.Fatalf("DecodeSlots = %v, %v", back, err)
	}
	if _, err := DecodeSlots(b[:3]); err == nil {
		t.Fatal("odd length decoded")
	}
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
	b := NewLiveSet().Bind(tbl)
	var seq uint64
	if allocs := testing.AllocsPerRun(1000, func() {
		seq++
		i, _ := tbl.Pick(SpreadKey(seq), b)
		b.Acquire(i)
		b.Release(i)
	}); allocs != 0 {
		t.Fatalf("Pick allocates %.1f times per call", allocs)
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
