package optimizer

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/switchyard-dev/switchyard/optimizer/auction"
	"github.com/switchyard-dev/switchyard/optimizer/flow"
	"github.com/switchyard-dev/switchyard/optimizer/levels"
	"github.com/switchyard-dev/switchyard/optimizer/newton"
	"github.com/switchyard-dev/switchyard/optimizer/sweep"
)

// Options configures the solver. DefaultOptions returns the recommended values.
type Options struct {
	// Tolerance is the target relative optimality gap (see Diagnostics.RelGap); 0 means 1e-4.
	Tolerance float64
	// MaxSweeps bounds the number of passes over all clusters; 0 means 5000.
	MaxSweeps int
	// ShedPriceMs is the cost in ms of shedding one req/s of each priority class, indexed by
	// Priority. It should be far above any latency and fall with priority. Zero entries take
	// the defaults (critical 1e9, standard 1e8, sheddable 1e7).
	ShedPriceMs [NumPriorities]float64
	// ProximalMs is the anti-churn price: moving one req/s of a cluster's traffic away from the
	// previous solution's flow to an engine costs this many ms (an L1 proximal term). 0 disables.
	ProximalMs float64
	// DeadBand keeps a cluster's previous weights when the new ones differ from them by less
	// than this total-variation distance (0..1). 0 disables.
	DeadBand float64
	// TimeBudget bounds the wall time of one Solve; 0 means DefaultTimeBudget and a negative
	// value disables the bound. The fast paths (Newton, level solver, auction) stop at half of
	// it, and the sweeps stop when it has run out (after at least one sweep): the solution is
	// then the feasible point reached, with the gap certified for it, Diagnostics.OutOfTime set
	// and a note saying so. A large overloaded problem can otherwise take minutes (see
	// docs/optimizer.md).
	TimeBudget time.Duration
	// Congestion weighs the congestion term that makes the objective strictly convex in each
	// engine's load even where its latency profile is flat: engine j's cost gains
	// a_j·X_j²/2 with a_j = Congestion·L_j(0)/(C_j·ρ), where C_j is its hard limit and ρ the
	// problem's utilisation (total demand over total capacity, at least MinCongestionLoad).
	// At the fleet's mean utilisation the term adds Congestion times the engine's idle latency
	// to its marginal cost, so ties are broken in proportion to capacity and a cluster's split
	// moves by about ΔL/(Congestion·L) when an engine's latency moves by ΔL, at every load
	// (docs/optimizer.md). 0 means DefaultCongestion; a negative value disables the term.
	Congestion float64
}

// DefaultCongestion is the congestion weight of a solve when Options.Congestion is 0.
const DefaultCongestion = 0.1

// MinCongestionLoad is the least utilisation the congestion term is scaled by, so that a
// problem of no demand keeps a finite term.
const MinCongestionLoad = 1e-3

// DefaultTimeBudget is the time budget of a solve when Options.TimeBudget is 0.
const DefaultTimeBudget = 2 * time.Second

// DefaultOptions returns the recommended options: tolerance 1e-4, a proximal price of 1 ms per
// req/s moved, a dead band of 0.01 and the default congestion weight.
func DefaultOptions() Options {
	return Options{
		Tolerance:   1e-4,
		MaxSweeps:   5000,
		ShedPriceMs: defaultShedPrice,
		ProximalMs:  1,
		DeadBand:    0.01,
		TimeBudget:  DefaultTimeBudget,
		Congestion:  DefaultCongestion,
	}
}

var defaultShedPrice = [NumPriorities]float64{Critical: 1e9, Standard: 1e8, Sheddable: 1e7}

func (o Options) withDefaults() Options {
	if !(o.Tolerance > 0) {
		o.Tolerance = 1e-4
	}
	if o.MaxSweeps <= 0 {
		o.MaxSweeps = 5000
	}
	for q := range o.ShedPriceMs {
		if !(o.ShedPriceMs[q] > 0) || math.IsInf(o.ShedPriceMs[q], 0) {
			o.ShedPriceMs[q] = defaultShedPrice[q]
		}
	}
	if !(o.ProximalMs > 0) || math.IsInf(o.ProximalMs, 0) {
		o.ProximalMs = 0
	}
	if !(o.DeadBand > 0) {
		o.DeadBand = 0
	}
	if o.TimeBudget == 0 {
		o.TimeBudget = DefaultTimeBudget
	}
	switch {
	case o.Congestion == 0:
		o.Congestion = DefaultCongestion
	case !(o.Congestion > 0) || math.IsInf(o.Congestion, 0):
		o.Congestion = -1
	}
	return o
}

// Solver solves problems with block-coordinate equilibration (see docs/optimizer.md). It reuses
// its buffers between calls, so a Solver must not be used by several goroutines at once; use one
// Solver per goroutine.
type Solver struct {
	opt Options
	// st is the problem in index form and the point being solved; the algorithms below, each
	// with its own buffers, work on it.
	st      flow.State
	levels  levels.Solver
	newton  newton.Solver
	auction auction.Solver
	sweeps  sweep.Solver
	// small and large are the fast paths in the order Solve tries them, on problems of up to
	// levelsFirstClusters clusters and on larger ones.
	small, large []strategy

	p *Problem
	// rows holds the engine lists of the solutions' clusters, built at the links count
	// rowsLinks and shared by the solutions (read-only) while the network rows stay the same.
	rows      []int
	rowsLinks uint64
	// out, when set, is the solution that the certificate writes the clusters' routing into
	// (rowOut, through writeRow); served and costs hold each cluster's served traffic and
	// latency cost for it.
	out           *Solution
	writeRow      func(i int)
	served, costs []float64
	// cong is each engine's congestion coefficient a_j of the current problem (0: none).
	cong []float64
}

// NewSolver returns a solver with the given options (zero fields take their defaults as
// documented on Options).
func NewSolver(opt Options) *Solver {
	s := &Solver{opt: opt.withDefaults()}
	s.st.Opt = flow.Options{
		Tolerance:   s.opt.Tolerance,
		MaxSweeps:   s.opt.MaxSweeps,
		ShedPriceMs: s.opt.ShedPriceMs,
		ProximalMs:  s.opt.ProximalMs,
		DeadBand:    s.opt.DeadBand,
	}
	s.levels.State, s.newton.State, s.auction.State, s.sweeps.State = &s.st, &s.st, &s.st, &s.st
	lv, nt, au := levelsPath{s}, newtonPath{s}, auctionPath{s}
	s.small = []strategy{lv, nt, au}
	s.large = []strategy{nt, lv, au}
	s.writeRow = func(i int) { s.rowOut(s.out, i) }
	return s
}

// Options returns the solver's effective options.
func (s *Solver) Options() Options { return s.opt }

// Solve solves p, warm-starting from prev (which may be nil, or the solution of a different
// but related problem: clusters and engines are matched by name). The returned solution's
// weights are deterministic functions of p, prev and the options.
func (s *Solver) Solve(p *Problem, prev *Solution) (*Solution, error) {
	t0 := time.Now()
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("optimizer: invalid problem: %w", err)
	}
	s.st.FastEnd, s.st.End, s.st.OutOfTime = time.Time{}, time.Time{}, false
	if b := s.opt.TimeBudget; b > 0 {
		s.st.FastEnd, s.st.End = t0.Add(b/2), t0.Add(b)
	}
	s.setup(p)
	// On small problems the level solver from the previous levels (warm) or from a common
	// level (cold) settles in a few rounds, exactly; larger ones take the Newton path first,
	// which needs no warm-started flows. The least-latency equilibrium has no fast path.
	var chain []strategy
	switch {
	case s.st.Equilibrium:
	case len(p.Clusters) > levelsFirstClusters:
		chain = s.large
	default:
		chain = s.small
	}
	s.warm(p, prev, len(chain) == 0 || chain[0].flows())
	var notes []string
	for j := range p.Engines {
		if pp, ok := p.Engines[j].Profile.(*PointsProfile); ok {
			for _, n := range pp.Notes {
				notes = append(notes, fmt.Sprintf("engine %s: %s", p.Engines[j].Name, n))
			}
		}
	}
	// The fast paths in turn, each from a fresh setup, until one settles; the sweeps then
	// start from its point (or, when none settles, from the auction's routing).
	a := attempt{warm: prev != nil}
	path, ok, ran := "", false, 0
	for n, st := range chain {
		if n > 0 {
			if s.st.OutOfTime {
				break
			}
			s.setup(p)
			s.warm(p, prev, st.flows())
		}
		a.first = n == 0
		path, ran = st.path(), ran+1
		if ok = st.run(&a); ok {
			break
		}
	}
	notes = append(notes, a.notes...)
	switch {
	case ok || len(chain) == 0:
	case ran < len(chain):
		// The fast paths used up their half of the time budget: the sweeps start from the
		// previous solution's flows (or from zero) and use the rest.
		s.setup(p)
		s.warm(p, prev, true)
		notes = append(notes, fmt.Sprintf("fast path (levels: %d rounds) ran out of its half of the time budget; sweeps from the previous solution or from zero", a.rounds))
	case !s.st.OutOfTime:
		notes = append(notes, fmt.Sprintf("fast path (levels: %d rounds, auction: %d bids) did not balance; solved by sweeps from the auction's routing", a.rounds, a.bids))
	}
	sweeps, m := s.sweeps.Run(a.cert)
	switch {
	case path == "":
		path = PathSweeps
	case sweeps > 0:
		path += "+" + PathSweeps
	}
	if m.RelGap > s.opt.Tolerance {
		notes = append(notes, fmt.Sprintf("relative gap %.3g above tolerance %.3g after %d sweeps", m.RelGap, s.opt.Tolerance, sweeps))
	}
	if s.st.OutOfTime {
		notes = append(notes, fmt.Sprintf("time budget %v ran out after %d sweeps: returning the feasible point reached (relative gap %.3g certified)", s.opt.TimeBudget, sweeps, m.RelGap))
	}
	solveRelGap := m.RelGap
	kept := s.st.DeadBand(prev != nil)
	if kept > 0 && !s.st.Equilibrium {
		// Previous weights kept for a changed demand may shed by priority no longer.
		s.st.EnforcePriority()
	}
	sol := s.newSolution(p, "optimal")
	if kept > 0 {
		// The certificate of the weights returned, and their routing written in the same
		// pass over the links.
		s.out, s.st.RowOut = sol, s.writeRow
		m = s.st.Measure(false)
		s.out, s.st.RowOut = nil, nil
		notes = append(notes, fmt.Sprintf("dead band %.3g: kept the previous weights of %d clusters", s.opt.DeadBand, kept))
	} else {
		for i := range p.Clusters {
			s.rowOut(sol, i)
		}
	}
	s.finishSolution(sol, notes)
	sol.Diagnostics.Objective = m.Objective
	sol.Diagnostics.Gap = m.Gap
	sol.Diagnostics.RelGap = m.RelGap
	sol.Diagnostics.SolveRelGap = solveRelGap
	sol.Diagnostics.Iterations = sweeps
	sol.Diagnostics.Path = path
	sol.Diagnostics.Converged = m.RelGap <= s.opt.Tolerance
	sol.Diagnostics.OutOfTime = s.st.OutOfTime
	sol.Diagnostics.Duration = time.Since(t0)
	return sol, nil
}

// levelsFirstClusters is the largest number of clusters for which Solve tries the level solver
// before the Newton path: on small problems it settles in a few rounds (the case study in 3,
// 10×100 in 37 cold and 7 after a 1% change), cheaper than the Newton path's continuation,
// and its ties are exact.
const levelsFirstClusters = 20

// setup builds the index-based representation of p in the solver's buffers.
func (s *Solver) setup(p *Problem) {
	nc, ne := len(p.Clusters), len(p.Engines)
	s.p = p
	s.st.Order = [NumPriorities]int{int(Sheddable), int(Standard), int(Critical)}
	slices.SortStableFunc(s.st.Order[:], func(a, b int) int {
		if s.st.Opt.ShedPriceMs[a] < s.st.Opt.ShedPriceMs[b] {
			return -1
		}
		if s.st.Opt.ShedPriceMs[a] > s.st.Opt.ShedPriceMs[b] {
			return 1
		}
		return 0
	})
	// The network rows are compared with the previous setup's while they are copied: when
	// their engines are the same (as on warm re-solves of one deployment), views built from
	// them (the engine-major view, the solutions' engine lists) stay valid, and when their latencies are
	// the same too, so do the views' latencies.
	same := len(s.st.Start) == nc+1
	s.st.Start = flow.GrowRaw(s.st.Start, nc+1)
	edges := 0
	for i, row := range p.Network {
		same = same && s.st.Start[i] == edges
		s.st.Start[i] = edges
		edges += len(row)
	}
	same = same && s.st.Start[nc] == edges && len(s.st.Eng) == edges
	sameDist := true
	s.st.Start[nc] = edges
	s.st.Demand = flow.Grow(s.st.Demand, nc)
	s.st.Mu = flow.Grow(s.st.Mu, nc)
	s.st.Shed = flow.Grow(s.st.Shed, nc)
	s.st.Anchor = flow.Grow(s.st.Anchor, nc)
	s.st.Classes = flow.GrowRaw(s.st.Classes, nc)
	for i := range p.Clusters {
		s.st.Classes[i] = p.Clusters[i].Demand
		s.st.Demand[i] = p.Clusters[i].TotalDemand()
		s.st.Mu[i] = math.NaN()
	}
	s.st.Eng = flow.GrowRaw(s.st.Eng, edges)
	s.st.Dist = flow.GrowRaw(s.st.Dist, edges)
	// x and x0 are written by warm; the scratch per edge is written by UpdateCluster before
	// it is read.
	s.st.Flow = flow.GrowRaw(s.st.Flow, edges)
	s.st.Flow0 = flow.GrowRaw(s.st.Flow0, edges)
	s.st.Xo = flow.GrowRaw(s.st.Xo, edges)
	s.st.Room = flow.GrowRaw(s.st.Room, edges)
	s.st.Thr = flow.GrowRaw(s.st.Thr, edges)
	s.st.DFlow = flow.GrowRaw(s.st.DFlow, edges)
	for i, row := range p.Network {
		k := s.st.Start[i]
		eng, dist := s.st.Eng[k:k+len(row)], s.st.Dist[k:k+len(row)]
		for r, l := range row {
			j := int32(l.Engine)
			same = same && eng[r] == j
			sameDist = sameDist && dist[r] == l.Ms
			eng[r], dist[r] = j, l.Ms
		}
	}
	if !same || s.st.Links == 0 {
		s.st.Links++
	}
	if !same || !sameDist || s.st.Dists == 0 {
		s.st.Dists++
	}
	s.st.Curves = flow.Grow(s.st.Curves, ne)
	s.st.Cap = flow.Grow(s.st.Cap, ne)
	s.st.Load = flow.Grow(s.st.Load, ne)
	s.st.Lam = flow.Grow(s.st.Lam, ne)
	s.st.FP = flow.Grow(s.st.FP, ne)
	s.st.Lat = flow.Grow(s.st.Lat, ne)
	s.st.CapMarg = flow.Grow(s.st.CapMarg, ne)
	s.st.Bidv = flow.Grow(s.st.Bidv, ne)
	s.cong = flow.Grow(s.cong, ne)
	for j := range p.Engines {
		e := &p.Engines[j]
		s.st.Curves[j] = e.Profile.Curve(e.CapacityRPS, e.Health)
		s.st.Cap[j] = math.Max(0, s.st.Curves[j].Capacity())
	}
	if s.opt.Congestion > 0 && !s.st.Equilibrium {
		// The congestion term's scale: the problem's utilisation.
		demand, capacity := 0.0, 0.0
		for i := range s.st.Demand {
			demand += s.st.Demand[i]
		}
		for j := range s.st.Cap {
			capacity += s.st.Cap[j]
		}
		rho := MinCongestionLoad
		if capacity > 0 {
			rho = math.Max(rho, demand/capacity)
		}
		for j, c := range s.st.Curves {
			if s.st.Cap[j] > 0 {
				s.cong[j] = s.opt.Congestion * c.Latency(0) / (s.st.Cap[j] * rho)
				s.st.Curves[j] = congested(c, s.cong[j])
			}
		}
	}
	for j := range p.Engines {
		s.st.CapMarg[j] = s.st.Cost(j, s.st.Cap[j])
	}
}

// warm initialises the anchors (x0), the levels and the flows from prev (matched by name),
// the flows clipped to the capacities. With flows false it leaves the flows, loads and shed
// alone: the Newton path needs only the anchors and the levels, and writes the rest.
func (s *Solver) warm(p *Problem, prev *Solution, flows bool) {
	for i := range s.st.Shed {
		s.st.Shed[i] = s.st.Demand[i]
	}
	if prev == nil {
		clear(s.st.Flow)
		clear(s.st.Flow0)
		return
	}
	same := len(prev.Clusters) == len(p.Clusters) && len(prev.Engines) == len(p.Engines)
	for j := 0; same && j < len(p.Engines); j++ {
		same = prev.Engines[j].Name == p.Engines[j].Name
	}
	var engIdx map[string]int
	if !same {
		engIdx = make(map[string]int, len(prev.Engines))
		for j := range prev.Engines {
			engIdx[prev.Engines[j].Name] = j
		}
	}
	var clIdx map[string]int
	// The loads and each cluster's served traffic are summed while the flows are copied; the
	// clipping passes run only when some engine is over its capacity.
	served := s.st.Shed // scratch until the end: the cluster's warm-started traffic
	for i := range p.Clusters {
		e0, e1 := s.st.Start[i], s.st.Start[i+1]
		x, x0 := s.st.Flow[e0:e1], s.st.Flow0[e0:e1]
		served[i] = 0
		pi := i
		if !(same && prev.Clusters[i].Name == p.Clusters[i].Name) {
			if clIdx == nil {
				clIdx = make(map[string]int, len(prev.Clusters))
				for c := range prev.Clusters {
					clIdx[prev.Clusters[c].Name] = c
				}
			}
			var ok bool
			if pi, ok = clIdx[p.Clusters[i].Name]; !ok {
				clear(x)
				clear(x0)
				continue
			}
		}
		pc := &prev.Clusters[pi]
		s.st.Anchor[i] = true
		if !math.IsNaN(pc.level) {
			s.st.Mu[i] = pc.level
		}
		D := s.st.Demand[i]
		sum := 0.0
		if engIdx == nil && s.sameRow(pc.Engines, e0, e1) {
			// The usual warm start: the same engines in the same order.
			ws := pc.Weights[:len(x)]
			if !flows {
				for r, w := range ws {
					x0[r] = w * D
				}
				continue
			}
			for r, j := range s.st.Eng[e0:e1] {
				v := ws[r] * D
				x0[r], x[r] = v, v
				s.st.Load[j] += v
				sum += v
			}
			served[i] = sum
			continue
		}
		r := 0
		for k := e0; k < e1; k++ {
			// Both rows are sorted by engine index; with the same engines advance a cursor.
			w := 0.0
			if engIdx == nil {
				for r < len(pc.Engines) && pc.Engines[r] < int(s.st.Eng[k]) {
					r++
				}
				if r < len(pc.Engines) && pc.Engines[r] == int(s.st.Eng[k]) {
					w = pc.Weights[r]
				}
			} else if pj, ok := engIdx[p.Engines[s.st.Eng[k]].Name]; ok {
				for q, e := range pc.Engines {
					if e == pj {
						w = pc.Weights[q]
						break
					}
				}
			}
			s.st.Flow0[k] = w * D
			s.st.Flow[k] = w * D
			s.st.Load[s.st.Eng[k]] += w * D
			sum += w * D
		}
		served[i] = sum
	}
	if !flows {
		return
	}
	over := false
	for j := range s.st.Load {
		if s.st.Load[j] > s.st.Cap[j] {
			over = true
			break
		}
	}
	if over {
		// Clip to capacity and rebuild the loads and the clusters' traffic.
		for k, j := range s.st.Eng {
			if s.st.Load[j] > s.st.Cap[j] {
				s.st.Flow[k] *= s.st.Cap[j] / s.st.Load[j]
			}
		}
		clear(s.st.Load)
		for i := range p.Clusters {
			sum := 0.0
			for k := s.st.Start[i]; k < s.st.Start[i+1]; k++ {
				s.st.Load[s.st.Eng[k]] += s.st.Flow[k]
				sum += s.st.Flow[k]
			}
			served[i] = sum
		}
	}
	for i := range p.Clusters {
		sum := served[i]
		if sum > s.st.Demand[i] {
			f := s.st.Demand[i] / sum
			for k := s.st.Start[i]; k < s.st.Start[i+1]; k++ {
				s.st.Load[s.st.Eng[k]] -= s.st.Flow[k] * (1 - f)
				s.st.Flow[k] *= f
			}
			sum = s.st.Demand[i]
		}
		s.st.Shed[i] = math.Max(0, s.st.Demand[i]-sum)
	}
	for j := range s.st.Load {
		s.st.Load[j] = math.Min(math.Max(s.st.Load[j], 0), s.st.Cap[j])
	}
}

// sameRow reports whether a previous solution's row lists the same engines as the network
// row of links e0..e1: at once when the solution shares the row built for the current links.
func (s *Solver) sameRow(prev []int, e0, e1 int) bool {
	row := s.st.Eng[e0:e1]
	if len(prev) != len(row) {
		return false
	}
	if len(row) == 0 || s.rowsLinks == s.st.Links && len(s.rows) == len(s.st.Eng) && &prev[0] == &s.rows[e0] {
		return true
	}
	for k, j := range row {
		if prev[k] != int(j) {
			return false
		}
	}
	return true
}
