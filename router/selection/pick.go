package selection

import (
	"math"
)

// maxProbes is how many slots Pick examines (the key's own slot and its
// first spill candidates) before it falls back to the least-loaded live
// engine it saw.
const maxProbes = 16

// Guard is a router's live view of a table's engines, indexed like the
// table. Implementations must be cheap and safe for concurrent use: Pick
// calls them on every request.
type Guard interface {
	// Down reports whether engine i must be skipped (e.g. live signals say
	// it is unhealthy).
	Down(i int) bool
	// InFlight returns this router's in-flight requests on engine i.
	InFlight(i int) int64
	// TotalInFlight returns this router's in-flight requests on all engines
	// of the table.
	TotalInFlight() int64
}

// LoadGuard is a Guard that also knows how loaded each engine is, from the
// engines' own signals, so that PickTwo can compare candidates.
type LoadGuard interface {
	Guard
	// Load returns engine i's load as this router sees it, per batch slot
	// (1 is as many requests as the engine runs in one batch): for example
	// the requests queued and running in the engine's newest signal that
	// other routers sent, plus this router's own in-flight requests on it
	// now, over its maximum batch; NaN when unknown (a NaN load never wins
	// PickTwo's comparison). Like the other Guard methods it must be cheap
	// and safe for concurrent use.
	Load(i int) float64
}

// TwoChoiceMargin is how much lower, relative to its planned load, a later
// candidate's load must be for PickTwo to prefer it to the weighted first
// choice: 5% of the planned load (Load(i)/Planned(i) is 1 for an engine
// that runs exactly as planned). Smaller differences are mostly the noise
// of a view that is up to a signal period old for other routers' requests;
// following them spreads the traffic shares without balancing anything,
// and ties keep the weighted first choice.
const TwoChoiceMargin = 0.05

// NewKeyChoices is how many weighted candidates PickRecent compares for an
// affinity key it has not seen. Where such a key lands it stays, with the
// prefix it caches there, for the key's lifetime, so a wider choice pays:
// on the simulator's Mooncake trace 8 candidates against 2 raise the KV hit
// rate and lower the TTFT tail (BENCHMARKS.md, mooncake).
const NewKeyChoices = 8

// within reports whether engine i, with load of this router's total
// in-flight requests, is within its bounded load.
func (t *Table) within(i int, load int64, total float64) bool {
	return t.unbounded || float64(load) <= t.limit[i]*total+1
}

// probe returns the slot of the k-th candidate of key: slot 0 is the key's
// own slot (its top bits) and later ones follow an odd stride derived from
// the key (double hashing), which visits every slot once per cycle.
func (t *Table) probe(key uint64, k int) uint64 {
	if k == 0 {
		return key >> t.shift
	}
	step := Mix64(key)>>t.shift | 1
	return (key>>t.shift + uint64(k)*step) & t.mask
}

// Primary returns the engine that owns key's slot, ignoring load and health,
// and false when no engine has positive weight.
func (t *Table) Primary(key uint64) (int, bool) {
	if len(t.slots) == 0 {
		return -1, false
	}
	return int(t.slots[key>>t.shift]), true
}

// Pick returns the engine for key and false when none is available. key must
// be a well-mixed 64-bit hash (HashString, AffinityKey) or SpreadKey(seq) for
// requests without affinity.
//
// With a nil guard Pick returns Primary(key). Otherwise it skips engines that
// are down and engines over their bounded load — in-flight greater than
// (1+ε)·(weight share)·(total in-flight) + 1 — moving on to the key's next
// candidates (the same sequence Candidates returns, duplicates included).
// When the first probes are all overloaded it takes the least loaded live
// one among them; when they are all down it takes the first live engine with
// positive weight after a key-derived position. Pick does not allocate.
func (t *Table) Pick(key uint64, g Guard) (int, bool) {
	if len(t.slots) == 0 {
		return -1, false
	}
	s := key >> t.shift
	i := int(t.slots[s])
	if g == nil {
		return i, true
	}
	total := float64(g.TotalInFlight())
	best, bestRatio := -1, math.Inf(1)
	var step uint64
	for k := 0; ; {
		if !g.Down(i) {
			load := float64(g.InFlight(i))
			lim := t.limit[i]*total + 1
			if load <= lim || t.unbounded {
				return i, true
			}
			if r := load / lim; r < bestRatio {
				best, bestRatio = i, r
			}
		}
		k++
		if k == maxProbes {
			break
		}
		if k == 1 {
			step = Mix64(key)>>t.shift | 1
		}
		s = (s + step) & t.mask
		i = int(t.slots[s])
	}
	if best >= 0 {
		return best, true
	}
	n := len(t.active)
	start := int(key % uint64(n))
	for k := 0; k < n; k++ {
		j := int(t.active[(start+k)%n])
		if !g.Down(j) {
			return j, true
		}
	}
	return -1, false
}

// PickTwo is Pick for a request without affinity (key from SpreadKey or a
// random hash): the power of two choices among weighted candidates, each
// weighed against its plan. It takes Pick's engine for key and the key's
// next distinct candidate that is live and within its bounded load — both
// drawn by weight — and returns the one whose load relative to its planned
// load, Load(i)/Planned(i), is lower, the second only when lower by more
// than TwoChoiceMargin.
//
// Comparing load with the plan, not raw load, is what keeps the optimizer's
// weights in force: the plan loads nearby engines more than far ones on
// purpose, and while every engine runs as planned the relative loads are
// equal up to noise, the comparison is a fair coin, and each engine gets
// its weight — it is the first choice with probability w and the second
// with probability w, and wins half of those. Only an engine loaded beyond
// its plan (a burst a snapshot computed a control period ago cannot follow,
// or sticky affinity keys piling up) loses comparisons, and only until it
// is back on its plan. The exception is an engine whose batch is full
// (Load ≥ 1): there a new request queues for a slot whatever the plan says,
// so it loses to a candidate with a free slot, and two full candidates are
// compared on raw load per slot. On the simulator's Azure trace
// at 85% load this cut the requests missing the TTFT SLO from 50 to 15 of
// 142,749 (BENCHMARKS.md, azure-85). A request with affinity should use Pick or
// PickRecent: a second choice on every request would split its prefix
// across engines.
//
// With a nil guard PickTwo returns Primary(key). It examines at most
// maxProbes slots beyond Pick's and does not allocate.
func (t *Table) PickTwo(key uint64, g LoadGuard) (int, bool) {
	return t.pickLeast(key, g, 2)
}

// pickLeast is PickTwo with d candidates: Pick's engine and the engines of
// the key's next probes other than it until d-1 of them are counted (one
// drawn twice counts twice, as weighted sampling with replacement does; one
// that is down or over its bounded load is passed over, and counted only if
// it would not have won anyway), and the one whose load relative to its
// plan is lowest, the first unless another is lower by more than
// TwoChoiceMargin — except that an engine whose batch is full (load ≥ 1 per
// slot) loses to any with a free slot, and between full engines the raw
// load per slot decides (with the same margin for the first).
//
// A request sent to a full engine waits for a slot however the plan rates
// the engine: its TTFT grows by a request's service time over the batch for
// every request ahead of it. The full-batch test is made only for a
// candidate that could win, so that the common case, every engine with a
// free slot, costs one comparison more per pick, not per candidate.
func (t *Table) pickLeast(key uint64, g LoadGuard, d int) (int, bool) {
	if g == nil {
		return t.Primary(key)
	}
	i, ok := t.Pick(key, g)
	if !ok {
		return i, false
	}
	li := g.Load(i)
	ri := li * t.perPlan[i]
	if math.IsNaN(ri) {
		return i, true // load unknown: the weights decide
	}
	// best's relative load (br) and load per slot (bl), less the margin
	// while best is the first candidate; bfull: best's batch is full.
	best, br, bl, bfull := i, ri-TwoChoiceMargin, li-TwoChoiceMargin, li >= 1
	total := float64(g.TotalInFlight())
	s := key >> t.shift
	step := Mix64(key)>>t.shift | 1
	for k, n := 1, 1; k < maxProbes && n < d; k++ {
		s = (s + step) & t.mask
		j := int(t.slots[s])
		if j == i {
			continue
		}
		lj := g.Load(j)
		r := lj * t.perPlan[j]
		if bfull {
			// A free candidate wins, a full one only with less load per
			// slot; a NaN load does neither.
			if !(lj < 1 || lj < bl) {
				n++
				continue
			}
		} else if !(r < br) || lj >= 1 {
			n++
			continue
		}
		// Health and bounded load are checked only for a candidate that
		// would win: most do not, and each check is a memory access that,
		// at 10,000 engines, misses the cache.
		if g.Down(j) || !t.within(j, g.InFlight(j), total) {
			continue
		}
		best, br, bl, bfull = j, r, lj, lj >= 1
		n++
	}
	return best, true
}

// Candidates appends to dst, in order, up to cap(dst)-len(dst) distinct
// engines for key: the primary first, then the key's next candidates by
// probing further slots (so each is drawn by weight), and, if probing finds
// too few, the remaining engines with positive weight from a key-derived
// position. It ignores load and health; retries use it to find "the key's
// next engine". Pass a slice with spare capacity to avoid allocation.
func (t *Table) Candidates(key uint64, dst []int) []int {
	want := cap(dst) - len(dst)
	if want <= 0 || len(t.slots) == 0 {
		return dst
	}
	base := len(dst)
	if want > len(t.active) {
		want = len(t.active)
	}
	has := func(j int) bool {
		for _, x := range dst[base:] {
			if x == j {
				return true
			}
		}
		return false
	}
	budget := 32 * want
	for k := 0; k < budget && len(dst)-base < want; k++ {
		j := int(t.slots[t.probe(key, k)])
		if !has(j) {
			dst = append(dst, j)
		}
	}
	n := len(t.active)
	start := int(key % uint64(n))
	for k := 0; k < n && len(dst)-base < want; k++ {
		j := int(t.active[(start+k)%n])
		if !has(j) {
			dst = append(dst, j)
		}
	}
	return dst
}
