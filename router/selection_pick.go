package router

import "math"

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
// engines' own signals, so that PickTwo can compare two candidates.
type LoadGuard interface {
	Guard
	// Load returns engine i's load as this router sees it, per batch slot
	// (1 is as many requests as the engine runs in one batch): for example
	// the requests queued and running in the engine's newest signal plus
	// those this router sent it since, over its maximum batch; NaN when
	// unknown (a NaN load never wins PickTwo's comparison). Like the other
	// Guard methods it must be cheap and safe for concurrent use.
	Load(i int) float64
}

// TwoChoiceMargin is how much lighter, in LoadGuard.Load units (batch
// slots), PickTwo's second candidate must be to win over the first: 5% of a
// batch. A router's view of an engine's load is a signal up to a period old
// plus its own requests since, blind to the completions in between, so
// smaller differences are mostly noise; following them spreads the traffic
// shares without balancing anything (on the simulator's mixed fleet they
// raised the shares' standard deviation beyond sampling noise from 0.0005 to
// 0.005 in one of three seeds).
const TwoChoiceMargin = 0.05

// TwoChoiceSaturated is the Load (batch slots in use or waiting, per slot)
// from which PickTwo looks at a second candidate at all: a first choice with
// a free batch slot is kept. Below it the traffic follows the optimizer's
// weights — which load nearby engines more than far ones on purpose, so a
// comparison of raw load would undo the plan and pull traffic across
// regions — and above it a request would wait for a slot, which a lighter
// candidate spares it.
const TwoChoiceSaturated = 1.0

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
	step := mix64(key)>>t.shift | 1
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
			step = mix64(key)>>t.shift | 1
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
// random hash): the power of two choices among weighted candidates. It takes
// Pick's engine for key and, only when that engine is saturated (Load at
// least TwoChoiceSaturated: no free batch slot), the key's next distinct
// candidate that is live and within its bounded load — each candidate is
// drawn by weight — and returns the second only when its Load is lower by
// more than TwoChoiceMargin, else the first. The weights still decide which engines a
// cluster's traffic may reach and in which proportion it is offered to them;
// the engines' load signals correct, request by request, the bursts that a
// weight snapshot computed a control period ago cannot follow. A request
// with affinity should use Pick or PickRecent: a second choice on every
// request would split its prefix across engines.
//
// With a nil guard PickTwo returns Primary(key). It examines at most
// maxProbes slots beyond Pick's and does not allocate.
func (t *Table) PickTwo(key uint64, g LoadGuard) (int, bool) {
	if g == nil {
		return t.Primary(key)
	}
	i, ok := t.Pick(key, g)
	if !ok {
		return i, false
	}
	li := g.Load(i)
	if !(li >= TwoChoiceSaturated) {
		return i, true // a free slot, or load unknown: the weights decide
	}
	total := float64(g.TotalInFlight())
	s := key >> t.shift
	step := mix64(key)>>t.shift | 1
	for k := 1; k < maxProbes; k++ {
		s = (s + step) & t.mask
		j := int(t.slots[s])
		if j == i || g.Down(j) || !t.within(j, g.InFlight(j), total) {
			continue
		}
		if g.Load(j)+TwoChoiceMargin < li {
			return j, true
		}
		return i, true
	}
	return i, true
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
