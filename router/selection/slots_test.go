package selection

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
// are RendezvousSlots' (router.NewTable's), but for the rounding to exact
// counts.
func TestAssignSlotsStartsFromRendezvous(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for _, n := range []int{3, 50} {
		es := engineSet(randomWeights(r, n, 1))
		s := assign(t, slotState{}, es)
		rv := slotState{names: make([]string, len(es)), idx: make([]uint16, len(s.idx))}
		ws := make([]float64, len(es))
		active := make([]int32, len(es))
		for i, e := range es {
			rv.names[i], ws[i], active[i] = e.Name, e.Weight, int32(i)
		}
		for i, j := range RendezvousSlots(rv.names, ws, active, len(s.idx), 0) {
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
