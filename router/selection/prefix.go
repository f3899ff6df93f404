package selection

// Held is an engine's cached prefix of a request, as a prefix index
// reports it: the engine's index in the table and how many of the
// request's leading blocks it holds.
type Held struct {
	Index  int
	Blocks int
}

// PickPrefix picks the engine for a request of blocks leading blocks
// whose cached prefixes held reports (deepest first), under g; key is the
// request's affinity key (its placement among weighted candidates). shared
// is how deep the request's prefix is shared with other requests (a system
// prompt other conversations went on from: router/prefix passes the depth
// that as many engines hold as it compares); deeper than that the prefix
// is taken for the request's own (its conversation's previous turns).
// blocks counts the request's blocks (router/prefix passes its keys).
//
// It first places the request as PickRecent places a key it has not seen
// (the lowest load relative to plan among NewKeyChoices weighted
// candidates), then moves it to the engine holding the longest prefix
// deeper than the placed engine's, if that engine has positive weight and
// is live, and:
//
//   - for a prefix of its own (deeper than a shared part other engines
//     hold), unless the engine's batch is full while the placed one has a
//     free slot: a conversation stays where its previous
//     turns are cached, whatever the slots say. The bounded load does not
//     apply: it keeps many keys from piling onto one engine, while this is
//     one conversation's next request, and moving it would add its whole
//     history's prefill to the fleet's work — on agent loops, whose context
//     grows by thousands of tokens a step, that extra prefill is what
//     overloads the fleet (the workload suite's agentic scenarios). The
//     weights still bound it: an engine of zero weight is never chosen, and
//     a full batch sends the request on;
//   - for a prefix no other engine holds any of (shared is 0), only while
//     the engine's load relative to its plan times the request's blocks it
//     would still prefill is below the placed engine's (plus
//     TwoChoiceMargin) times the blocks that one would prefill, and its
//     batch has a free slot. Such a prefix may be a conversation's own or
//     a shared one that every request behind it went to, because it was
//     taken for own: a repository's context leading every completion of
//     it, whose first completion went to one engine (the suite's code-85:
//     50 repositories held by one engine each, 4,428 to 6,448 requests an
//     engine, e2e mean 1.03× prefix-affinity's). Weighing what the engine
//     saves the request against how busy it is tells them apart where
//     they differ: a continuation, most of whose blocks the engine holds
//     (7 of 8), stays on an engine up to eight times as loaded; a new
//     request behind a two-block context before its own six-block file
//     goes there only while it is at most 8/6 as loaded, else elsewhere,
//     and from then on two engines hold the context and it is shared;
//   - for a shared prefix only, if the engine's load relative to its plan
//     is not above the placed engine's by TwoChoiceMargin (PickTwo's test),
//     its batch has a free slot and it is within its bounded load: a hot
//     prefix draws requests to its holders only while they are not busier
//     than the weights would make them, so it spreads to other engines
//     (each prefilling it once) instead of piling onto the one that cached
//     it first.
//
// A load that is not known (NaN) does not hold a prefix back. With a nil
// guard it is Primary(key). It does not allocate.
func (t *Table) PickPrefix(key uint64, g LoadGuard, held []Held, shared, blocks int) (int, bool) {
	if g == nil {
		return t.Primary(key)
	}
	base, ok := t.pickLeast(key, g, NewKeyChoices)
	if !ok {
		return base, false
	}
	depth := 0
	for _, h := range held {
		if h.Index == base {
			depth = max(depth, h.Blocks)
		}
	}
	lb := g.Load(base)
	rb := lb * t.perPlan[base]
	baseFull := lb >= 1
	total := float64(g.TotalInFlight())
	best := base
	for _, h := range held {
		j := h.Index
		if h.Blocks <= depth || j < 0 || j >= len(t.engines) || t.engines[j].Weight <= 0 {
			continue
		}
		if g.Down(j) {
			continue
		}
		lj := g.Load(j)
		if h.Blocks > shared {
			if !baseFull && lj >= 1 {
				continue
			}
			// Held by no other engine, the prefix may be a shared one
			// that every request behind it went to: the blocks each engine
			// would prefill weigh its load.
			if n := max(blocks, h.Blocks); shared == 0 && !baseFull && lj*t.perPlan[j]*float64(n-h.Blocks) >= (rb+TwoChoiceMargin)*float64(n-depth) {
				continue
			}
		} else if !(lj < 1 && lj*t.perPlan[j] < rb+TwoChoiceMargin) || !t.within(j, g.InFlight(j), total) {
			continue
		}
		best, depth = j, h.Blocks
	}
	return best, true
}
