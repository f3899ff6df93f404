package kvindex

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
)

// TestDeepestAsBisected: Deepest, which remembers the keys it read, gives
// exactly the answers of the plain bisection that reads the maps at every
// probe (deepestUncached, below), on random indexes: prefixes stored by
// many engines, some shared, holes removed mid-sequence, engines cleared
// and forgotten, every limit.
func TestDeepestAsBisected(t *testing.T) {
	rng := rand.New(rand.NewPCG(18, 1))
	for round := range 300 {
		x, err := New(Options{MaxBlocksPerEngine: 1 + rng.IntN(64)})
		if err != nil {
			t.Fatal(err)
		}
		engines := 1 + rng.IntN(40)
		// A few conversations: chains of keys over a small key space, so
		// that engines share prefixes.
		chains := make([][]uint64, 1+rng.IntN(6))
		for c := range chains {
			n := 1 + rng.IntN(80)
			for k := range n {
				if c > 0 && k < 4 && rng.IntN(2) == 0 {
					chains[c] = append(chains[c], chains[0][min(k, len(chains[0])-1)])
					continue
				}
				chains[c] = append(chains[c], uint64(c)<<32|uint64(k+1))
			}
		}
		for range 1 + rng.IntN(200) {
			e := "e" + strconv.Itoa(rng.IntN(engines))
			ch := chains[rng.IntN(len(chains))]
			switch op := rng.IntN(20); {
			case op < 15:
				if err := x.Store(e, ch[:1+rng.IntN(len(ch))]); err != nil {
					t.Fatal(err)
				}
			case op < 18:
				a := rng.IntN(len(ch))
				x.Remove(e, ch[a:a+1+rng.IntN(min(3, len(ch)-a))])
			case op < 19:
				x.Clear(e)
			default:
				x.Forget(e)
			}
		}
		for q := range 20 {
			ch := chains[rng.IntN(len(chains))]
			req := slices.Clone(ch[:1+rng.IntN(len(ch))])
			if q%4 == 3 {
				req = append(req, 1<<40|uint64(q)) // a key nobody holds
			}
			limit := 1 + rng.IntN(12)
			if q%5 == 4 {
				limit = MaxMatches
			}
			got := x.Deepest(nil, req, limit)
			want := x.deepestUncached(nil, req, limit)
			if !slices.Equal(got, want) {
				t.Fatalf("round %d query %d (%d keys, limit %d): Deepest %v, the plain bisection %v", round, q, len(req), limit, got, want)
			}
		}
	}
}

// deepestUncached is Deepest reading the maps at every probe, as it did
// before it remembered its reads: the reference TestDeepestAsBisected
// holds it to, with a linear search where Deepest bisects.
func (x *Index) deepestUncached(dst []Match, keys []uint64, limit int) []Match {
	limit = max(1, min(limit, MaxMatches))
	if len(keys) > MaxKeys {
		keys = keys[:MaxKeys]
	}
	if len(keys) == 0 {
		return dst
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	var found [MaxMatches]uint16
	n := 0
	// fresh reports whether keys[j] has a holder not found yet.
	fresh := func(j int) bool {
		v, ok := x.blocks[keys[j]]
		if !ok {
			return false
		}
		if !in(found[:n], uint16(v)) {
			return true
		}
		if v&moreBit == 0 {
			return false
		}
		for _, h := range x.more[keys[j]] {
			if !in(found[:n], h.engine) {
				return true
			}
		}
		return false
	}
	// Each round finds the deepest key held by an engine not found yet:
	// all its holders not found have that depth, and the engines left hold
	// less, so the next round bisects the keys before it.
	v0, ok := x.blocks[keys[0]]
	if !ok {
		return dst
	}
	root := step{first: v0 &^ moreBit}
	if v0&moreBit != 0 {
		root.more = x.more[keys[0]]
	}
	for hi := len(keys); hi > 0 && n < limit && fresh(0); {
		lo := 0 // fresh(lo) holds; find the last j < hi where fresh(j) does
		for r := hi - 1; lo < r; {
			mid := (lo + r + 1) / 2
			if fresh(mid) {
				lo = mid
			} else {
				r = mid - 1
			}
		}
		v := x.blocks[keys[lo]]
		add := func(id uint16) {
			if n < limit && !in(found[:n], id) {
				found[n] = id
				n++
				if uint16(root.first) == id || slices.ContainsFunc(root.more, func(h holding) bool { return h.engine == id }) {
					dst = append(dst, Match{Engine: x.engines[id].name, Blocks: lo + 1})
				}
			}
		}
		add(uint16(v))
		if v&moreBit != 0 {
			for _, h := range x.more[keys[lo]] {
				add(h.engine)
			}
		}
		hi = lo
	}
	return dst
}
