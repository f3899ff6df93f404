package selection

import (
	"errors"
	"math"
	"sort"
)

// errNoSlots is an internal sanity error; RendezvousSlots fills every slot
// when at least one engine has positive weight.
var errNoSlots = errors.New("selection: slot left without an engine")

// RendezvousSlots returns the weighted rendezvous slot table that
// router.NewTable builds: out[s] is the index (into names and weights) of
// the engine that owns slot s. active lists the indexes of the engines with
// positive weight (at least one); weights of the others are not read. m is
// the slot count, a power of two; seed perturbs every engine's hash, so
// routers that must agree need the same seed.
//
// It assigns each of m slots to argmin_j E(s,j)/w_j without
// evaluating every (slot, engine) pair. For engine j it walks a Poisson
// process of rate m over time, each arrival landing on a uniformly chosen
// slot; the first arrival on slot s is E(s,j) ~ Exp(1), independent across
// slots and determined by the engine's name alone. Arrivals come in
// increasing time, so an engine stops as soon as its arrival time divided by
// its weight exceeds the largest current slot minimum (kept in a max tree).
// The pruning changes the cost, never the result.
func RendezvousSlots(names []string, weights []float64, active []int32, m int, seed uint64) []uint32 {
	best := make([]float64, m)
	owner := make([]int32, m)
	for s := range best {
		best[s] = math.Inf(1)
		owner[s] = -1
	}
	// The max tree is built once every slot has an owner; until then the
	// largest slot minimum is +Inf and no engine can stop early.
	var tree *maxTree
	unfilled := m

	order := append([]int32(nil), active...)
	sort.Slice(order, func(a, b int) bool {
		wa, wb := weights[order[a]], weights[order[b]]
		if wa != wb {
			return wa > wb
		}
		return order[a] < order[b]
	})
	mask := uint64(m - 1)
	fm := float64(m)
	for _, j := range order {
		w := weights[j]
		rng := splitmix{s: HashString(names[j]) ^ Mix64(seed)}
		t := 0.0
		for {
			t += -math.Log(rng.unit()) / fm
			v := t / w
			if tree != nil && v > tree.max() {
				break
			}
			s := rng.next() & mask
			if v < best[s] || (v == best[s] && j < owner[s]) {
				if owner[s] < 0 {
					unfilled--
				}
				best[s] = v
				owner[s] = j
				if tree != nil {
					tree.set(int(s), v)
				} else if unfilled == 0 {
					tree = newMaxTree(best)
				}
			}
		}
	}
	slots := make([]uint32, m)
	for s, j := range owner {
		if j < 0 {
			panic(errNoSlots)
		}
		slots[s] = uint32(j)
	}
	return slots
}

// maxTree is a complete binary tree over m leaves holding the maximum of its
// subtree at each inner node.
type maxTree struct {
	n    int
	node []float64
}

// newMaxTree builds the tree over the given leaf values in O(len(leaves)).
func newMaxTree(leaves []float64) *maxTree {
	m := len(leaves)
	t := &maxTree{n: m, node: make([]float64, 2*m)}
	copy(t.node[m:], leaves)
	for i := m - 1; i >= 1; i-- {
		t.node[i] = math.Max(t.node[2*i], t.node[2*i+1])
	}
	return t
}

func (t *maxTree) max() float64 { return t.node[1] }

func (t *maxTree) set(i int, v float64) {
	i += t.n
	t.node[i] = v
	for i > 1 {
		i >>= 1
		v = math.Max(t.node[2*i], t.node[2*i+1])
		if t.node[i] == v {
			return
		}
		t.node[i] = v
	}
}
