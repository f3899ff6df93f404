package selection

import (
	"fmt"
	"math"
	"math/bits"
	"sort"
)

// Slot counts of the tables a snapshot carries (see SlotCount).
const (
	// MinAssignedSlots is the least slot count SlotCount returns.
	MinAssignedSlots = 1 << 12
	// MaxAssignedSlots is the largest slot count SlotCount returns and
	// AssignSlots accepts: slot indexes are uint16 and a snapshot carries
	// at most messages.MaxSnapshotSlots slots.
	MaxAssignedSlots = 1 << 16
	// SlotsPerEngine is how many slots SlotCount gives each engine on
	// average, at least, until MaxAssignedSlots.
	SlotsPerEngine = 16
)

// SlotCount returns the slot count of a table for n engines with positive
// weight: the smallest power of two at least max(MinAssignedSlots,
// SlotsPerEngine·n), capped at MaxAssignedSlots.
func SlotCount(n int) int {
	m := MinAssignedSlots
	for m < MaxAssignedSlots && m < SlotsPerEngine*n {
		m <<= 1
	}
	return m
}

// AssignSlots returns the slot table for engines with the given weights,
// computed from the previous table so that as few slots as possible change
// engine. It is the stateful counterpart of RendezvousSlots (router.NewTable's
// slots): the single writer of snapshots (the optimizer service) calls it
// with the table of the snapshot it last wrote and ships the result in the
// new snapshot, and routers install it with router.NewTableFromSlots.
//
// out[s] is an index into engines. prev[s] is an index into prevEngines (an
// index out of range, or an engine no longer listed, frees the slot); prev
// may be nil. weights[i] is engines[i]'s weight; only their ratios matter,
// and weights that are not finite and positive count as zero. slots must be
// a power of two in [1, MaxAssignedSlots].
//
//   - Each engine's slot count is its share of slots by largest remainder,
//     ties broken by engine name: it is within one slot of
//     slots·weights[i]/Σweights.
//   - Every slot whose previous engine still has room keeps it: an engine
//     keeps as many of its old slots as its new count allows. An engine
//     over its count gives up the slots that come first in a fixed hashed
//     order of slot indexes, so the freed slots are scattered; the freed
//     slots go, in that order, to the engines under their count, by name.
//     So the number of slots that change engine is exactly Σ max(0, old
//     count − new count): the total-variation distance between the old and
//     the new slot shares, times slots, which is the least any assignment
//     with these counts can move.
//   - Without prev, the start is the weighted rendezvous assignment
//     (RendezvousSlots, seed 0, as router.NewTable builds) for the same
//     slot count, rebalanced to the exact counts.
//   - When len(prev) differs from slots (both powers of two), prev is first
//     resized with the key → slot mapping preserved: doubling splits each
//     slot in two, which moves no key; halving keeps one engine of each
//     pair (the first that still has weight), which moves up to half the
//     keys, so writers should not shrink tables.
//
// The result depends only on the (name, weight) pairs and on prev as a
// mapping from slot to engine name: not on the order of engines. It returns
// nil when slots is invalid, an engine name is repeated, there are more than
// 65,536 engines, or no weight is positive.
func AssignSlots(prev []uint16, prevEngines []string, engines []string, weights []float64, slots int) []uint16 {
	if slots < 1 || slots > MaxAssignedSlots || slots&(slots-1) != 0 ||
		len(engines) != len(weights) || len(engines) > 1<<16 {
		return nil
	}
	index := make(map[string]int, len(engines))
	for i, name := range engines {
		if _, dup := index[name]; dup {
			return nil
		}
		index[name] = i
	}
	byName := make([]int, len(engines))
	for i := range byName {
		byName[i] = i
	}
	sort.Slice(byName, func(a, b int) bool { return engines[byName[a]] < engines[byName[b]] })
	target := slotTargets(engines, weights, byName, slots)
	if target == nil {
		return nil
	}

	// cur[s] is the engine holding slot s, -1 when free.
	cur := make([]int32, slots)
	switch {
	case len(prev) > 0 && len(prev)&(len(prev)-1) == 0:
		remap := make([]int32, len(prevEngines))
		for k, name := range prevEngines {
			remap[k] = -1
			if i, ok := index[name]; ok && target[i] > 0 {
				remap[k] = int32(i)
			}
		}
		owner := func(s int) int32 {
			if j := int(prev[s]); j < len(remap) {
				return remap[j]
			}
			return -1
		}
		switch {
		case len(prev) <= slots:
			r := slots / len(prev)
			for s := range cur {
				cur[s] = owner(s / r)
			}
		default:
			r := len(prev) / slots
			for s := range cur {
				cur[s] = owner(s * r)
				for k := 0; k < r && cur[s] < 0; k++ {
					cur[s] = owner(s*r + k)
				}
			}
		}
	default:
		ws := make([]float64, len(engines))
		var active []int32
		for i := range engines {
			if target[i] > 0 {
				ws[i] = weights[i]
				active = append(active, int32(i))
			}
		}
		for s, i := range RendezvousSlots(engines, ws, active, slots, 0) {
			cur[s] = int32(i)
		}
	}

	have := make([]int, len(engines))
	for _, i := range cur {
		if i >= 0 {
			have[i]++
		}
	}
	// Free, in hashed slot order, the slots of engines over their count;
	// already free slots join the list in the same order.
	free := make([]int32, 0, slots/8)
	k := bits.TrailingZeros(uint(slots))
	for x := 0; x < slots; x++ {
		s := scramble(uint64(x), k)
		i := cur[s]
		switch {
		case i < 0:
		case have[i] > target[i]:
			have[i]--
			cur[s] = -1
		default:
			continue
		}
		free = append(free, int32(s))
	}
	// Hand them out to the engines under their count, by name.
	next := 0
	for _, i := range byName {
		for ; have[i] < target[i]; have[i]++ {
			cur[free[next]] = int32(i)
			next++
		}
	}
	out := make([]uint16, slots)
	for s, i := range cur {
		out[s] = uint16(i)
	}
	return out
}

// slotTargets returns each engine's slot count by largest remainder (ties by
// name), or nil when no weight is positive. byName lists the engines' indexes
// in name order; sums follow it, so that the result does not depend on the
// order of engines, to the last bit.
func slotTargets(engines []string, weights []float64, byName []int, slots int) []int {
	sum := 0.0
	for _, i := range byName {
		if w := weights[i]; usableWeight(w) {
			sum += w
		}
	}
	if !(sum > 0) || math.IsInf(sum, 0) {
		return nil
	}
	target := make([]int, len(engines))
	rem := make([]float64, len(engines))
	var order []int
	left := slots
	for _, i := range byName {
		w := weights[i]
		if !usableWeight(w) {
			continue
		}
		q := float64(slots) * (w / sum)
		f := math.Floor(q)
		target[i] = int(f)
		rem[i] = q - f
		left -= target[i]
		order = append(order, i)
	}
	sort.Slice(order, func(a, b int) bool {
		ia, ib := order[a], order[b]
		if rem[ia] != rem[ib] {
			return rem[ia] > rem[ib]
		}
		return engines[ia] < engines[ib]
	})
	// left = Σ remainders, so 0 ≤ left < len(order): the quotas sum to
	// slots within far less than one slot (slots, engines ≤ 2^16). Cycle
	// anyway, to be safe.
	for k := 0; left > 0; k++ {
		target[order[k%len(order)]]++
		left--
	}
	return target
}

func usableWeight(w float64) bool { return w > 0 && !math.IsInf(w, 1) }

// scramble is a fixed bijection of [0, 2^k): odd multiplications and
// xor-shifts modulo 2^k. Walking x = 0, 1, 2, … visits every slot once in
// a scattered order.
func scramble(x uint64, k int) uint64 {
	if k == 0 {
		return 0
	}
	mask := uint64(1)<<k - 1
	h := uint(k+1) / 2
	x = (x*0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & mask
	x ^= x >> h
	x = (x * 0xBF58476D1CE4E5B9) & mask
	x ^= x >> h
	x = (x * 0x94D049BB133111EB) & mask
	x ^= x >> h
	return x
}

// EncodeSlots renders slot indexes as messages.WeightSnapshot.Slots carries
// them: two bytes per slot, little-endian.
func EncodeSlots(idx []uint16) []byte {
	b := make([]byte, 2*len(idx))
	for s, v := range idx {
		b[2*s], b[2*s+1] = byte(v), byte(v>>8)
	}
	return b
}

// DecodeSlots parses messages.WeightSnapshot.Slots into slot indexes.
func DecodeSlots(b []byte) ([]uint16, error) {
	if len(b)%2 != 0 {
		return nil, fmt.Errorf("selection: decode slots: odd length %d", len(b))
	}
	idx := make([]uint16, len(b)/2)
	for s := range idx {
		idx[s] = uint16(b[2*s]) | uint16(b[2*s+1])<<8
	}
	return idx, nil
}
