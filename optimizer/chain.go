package optimizer

import (
	"fmt"

	"github.com/switchyard-dev/switchyard/optimizer/flow"
)

// A strategy is one fast path of the chain Solve tries before the sweeps (docs/optimizer.md).
type strategy interface {
	// path names the strategy in Diagnostics.Path.
	path() string
	// flows reports whether it starts from the previous solution's flows; otherwise it needs
	// only the anchors and the levels, and writes the flows itself.
	flows() bool
	// run solves from the state's point and reports whether the sweeps should start from the
	// point it leaves; it records in a what the notes and the next strategies need.
	run(a *attempt) bool
}

// attempt is what the strategies of one solve share.
type attempt struct {
	warm  bool // a previous solution was given
	first bool // the strategy running is the first of the chain
	// rounds and bids count the level solver's rounds and the auction's bids, for the notes.
	rounds, bids int
	// cert is the certificate of the point left, when the strategy computed one.
	cert  *flow.Measures
	notes []string
}

// levelsPath is the level solver (optimizer/levels), from the previous levels when warm.
type levelsPath struct{ s *Solver }

func (levelsPath) path() string { return PathLevels }
func (levelsPath) flows() bool  { return true }
func (l levelsPath) run(a *attempt) bool {
	lv := &l.s.levels
	r, ok := lv.Solve(lv.Rounds(a.warm))
	a.rounds += r
	return ok
}

// newtonPath is the Newton path (optimizer/newton), with the shed modelled when it comes
// first: on small problems the sweeps settle overloaded problems in well under a second too,
// and the points of the two paths, both within the tolerance, differ (the simulator's
// region-outage scenario, 3 clusters, had its TTFT p99 go from 56 to 147 ms).
type newtonPath struct{ s *Solver }

func (newtonPath) path() string { return PathNewton }
func (newtonPath) flows() bool  { return false }
func (n newtonPath) run(a *attempt) bool {
	nt := &n.s.newton
	if nt.Solve(a.first) {
		a.cert = nt.Cert()
		return true
	}
	if nt.Partial() {
		// The Newton path with the shed modelled settled but did not close its certificate
		// (at levels of shed prices the flows it reads off the levels are exact only to about
		// 1e-8/ε req/s, and the latencies are steep there): the sweeps go on from its point,
		// and one usually closes the gap.
		a.notes = append(a.notes, fmt.Sprintf("Newton path with shedding: relative gap %.3g after %d steps; sweeps from its point", nt.Cert().RelGap, nt.Steps()))
		return true
	}
	return false
}

// auctionPath is the auction (optimizer/auction) and, when its certificate does not close,
// the level solver from the auction's levels; when that fails too, the auction's routing is
// restored for the sweeps.
type auctionPath struct{ s *Solver }

func (auctionPath) path() string { return PathAuction }
func (auctionPath) flows() bool  { return true }
func (p auctionPath) run(a *attempt) bool {
	au, lv := &p.s.auction, &p.s.levels
	bids, ok := au.Solve()
	a.bids = bids
	if ok {
		return true
	}
	au.Save()
	r, ok := lv.Solve(lv.Rounds(true))
	a.rounds += r
	if !ok {
		au.Restore()
	}
	return ok
}
