package optimizer

import (
	"fmt"
	"math"
	"time"

	"github.com/switchyard-dev/switchyard/optimizer/flow"
)

// Solution is the routing decided for a Problem. Clusters and Engines are indexed like the
// problem's; names are copied so that a solution can warm-start a related problem.
type Solution struct {
	// Policy names the policy that produced the solution.
	Policy string
	// Clusters holds the per-cluster result, indexed like Problem.Clusters.
	Clusters []ClusterResult
	// Engines holds the per-engine result, indexed like Problem.Engines.
	Engines []EngineResult
	// MeanLatencyMs is the mean end-to-end latency (network plus engine-side) over served
	// traffic; +Inf when some traffic goes to an engine beyond its capacity.
	MeanLatencyMs float64
	// ShedRPS is the total shed demand.
	ShedRPS float64
	// Diagnostics says how the solution was obtained and how close to optimal it is.
	Diagnostics Diagnostics
}

// ClusterResult is the routing of one cluster.
type ClusterResult struct {
	// Name is the cluster's name.
	Name string
	// DemandRPS is the cluster's total demand.
	DemandRPS float64
	// Engines lists the eligible engines (indices into Solution.Engines), like the cluster's
	// network row. Solutions from one Solver share these lists while the network rows stay
	// the same: they are read-only.
	Engines []int
	// Weights[k] is the fraction of the cluster's demand sent to Engines[k]; the weights sum to
	// 1 - ShedFraction.
	Weights []float64
	// FlowsRPS[k] is the traffic sent to Engines[k] in req/s.
	FlowsRPS []float64
	// ShedFraction is the fraction of the demand shed.
	ShedFraction float64
	// ShedRPS is the demand shed, and ShedByPriority the same split by priority class.
	ShedRPS        float64
	ShedByPriority [NumPriorities]float64
	// MeanLatencyMs is the mean end-to-end latency of the cluster's served traffic (0 when
	// nothing is served).
	MeanLatencyMs float64
	level         float64 // marginal-cost level, for warm starts
}

// Weight returns the weight of the engine with index j, 0 if it is not eligible.
func (c *ClusterResult) Weight(j int) float64 {
	for k, e := range c.Engines {
		if e == j {
			return c.Weights[k]
		}
	}
	return 0
}

// EngineResult is the load of one engine.
type EngineResult struct {
	// Name is the engine's name.
	Name string
	// CapacityRPS is the effective capacity (capacity × health).
	CapacityRPS float64
	// LoadRPS is the traffic routed to the engine.
	LoadRPS float64
	// Utilisation is LoadRPS / CapacityRPS (0 for an idle engine of zero capacity, +Inf for a
	// loaded one).
	Utilisation float64
	// LatencyMs is the engine-side latency at LoadRPS.
	LatencyMs float64
	// PriceMs is the shadow price of the engine's hard capacity limit (0 when not binding).
	PriceMs float64
}

// Diagnostics describes how a solution was obtained.
type Diagnostics struct {
	// Objective is Σ flow × latency + shed cost + proximal cost, in ms·req/s.
	Objective float64
	// Gap is the duality gap certificate: Objective minus a proven lower bound on the optimum
	// of the problem solved (including the proximal term when warm-started).
	Gap float64
	// RelGap is Gap divided by the latency (and proximal) part of the objective: shed cost is
	// left out of the denominator so that the gap measures how well served traffic is routed.
	// NaN for baseline policies that leave engines over capacity.
	RelGap float64
	// SolveRelGap is the relative gap the solve certified before the dead band restored
	// previous weights (see Options.DeadBand); it equals RelGap when the dead band kept none.
	// RelGap is that of the weights returned, and is usually far above the tolerance when the
	// dead band kept some clusters' stale weights. Baseline policies set it to RelGap.
	SolveRelGap float64
	// Converged reports RelGap ≤ the tolerance.
	Converged bool
	// OutOfTime reports that the solve stopped at its time budget (Options.TimeBudget): the
	// solution is a feasible point with the gap certified for it, which may be above the
	// tolerance.
	OutOfTime bool
	// Iterations is the number of sweeps over the clusters.
	Iterations int
	// Path names the solver path that answered: PathLevels, PathNewton or
	// PathAuction (the fast path whose point was returned), the same with
	// "+sweeps" when Gauss-Seidel sweeps went on from that point, or PathSweeps
	// alone when the sweeps solved it from the previous solution or from zero.
	// Baseline policies leave it empty.
	Path string
	// Duration is the wall time of the solve.
	Duration time.Duration
	// Notes are human-readable remarks, such as clusters that have no eligible engine.
	Notes []string
}

// The solver paths named in Diagnostics.Path.
const (
	// PathLevels is the level solver: the clusters' marginal-cost levels
	// balanced by bisection (dual.go), exact on small problems.
	PathLevels = "levels"
	// PathNewton is the Newton path on the dual (newton.go), first on problems
	// of more than 20 clusters.
	PathNewton = "newton"
	// PathAuction is the auction (auction.go) that finds starting levels when
	// the others do not balance, followed by the level solver.
	PathAuction = "auction"
	// PathSweeps is Gauss-Seidel equilibration over the clusters, the path of
	// last resort, which always returns a feasible point.
	PathSweeps = "sweeps"
)

// solution builds a Solution from the solver's flows.
func (s *Solver) solution(p *Problem, policy string, notes []string) *Solution {
	sol := s.newSolution(p, policy)
	for i := range p.Clusters {
		s.rowOut(sol, i)
	}
	s.finishSolution(sol, notes)
	return sol
}

// newSolution allocates a Solution for the solver's flows and fills in the engines and the
// clusters' names, demands and engine lists; rowOut fills in the clusters' routing.
func (s *Solver) newSolution(p *Problem, policy string) *Solution {
	nc := len(p.Clusters)
	sol := &Solution{Policy: policy, Clusters: make([]ClusterResult, nc), Engines: make([]EngineResult, len(p.Engines))}
	edges := len(s.st.Eng)
	flat := make([]float64, 2*edges)
	weights, flows := flat[:edges], flat[edges:]
	// The engine lists are the network rows: solutions share them while the rows stay the
	// same (they are read-only), so that a warm start recognises its rows without comparing.
	if s.rowsLinks != s.st.Links || len(s.rows) != edges {
		s.rows = make([]int, edges)
		for k, j := range s.st.Eng {
			s.rows[k] = int(j)
		}
		s.rowsLinks = s.st.Links
	}
	idx := s.rows
	for j := range p.Engines {
		e := &sol.Engines[j]
		e.Name = p.Engines[j].Name
		e.CapacityRPS = p.Engines[j].EffectiveCapacity()
		e.LoadRPS = s.st.Load[j]
		switch {
		case e.CapacityRPS > 0:
			e.Utilisation = s.st.Load[j] / e.CapacityRPS
		case s.st.Load[j] > 0:
			e.Utilisation = math.Inf(1)
		}
		// The engine-side latency without the congestion term, which is a cost of the
		// objective, not a latency an engine's requests see.
		e.LatencyMs = s.st.Curves[j].Latency(s.st.Load[j]) - 0.5*s.cong[j]*s.st.Load[j]
		e.PriceMs = s.st.Lam[j]
	}
	s.served = flow.GrowRaw(s.served, nc)
	s.costs = flow.GrowRaw(s.costs, nc)
	for i := range p.Clusters {
		c := &sol.Clusters[i]
		e0, e1 := s.st.Start[i], s.st.Start[i+1]
		c.Name = p.Clusters[i].Name
		c.DemandRPS = s.st.Demand[i]
		c.Engines = idx[e0:e1:e1]
		c.Weights = weights[e0:e1:e1]
		c.FlowsRPS = flows[e0:e1:e1]
		c.level = s.st.Mu[i]
	}
	return sol
}

// rowOut writes cluster i's flows and weights into sol and keeps its served traffic and
// latency cost for finishSolution.
func (s *Solver) rowOut(sol *Solution, i int) {
	c := &sol.Clusters[i]
	e0, e1 := s.st.Start[i], s.st.Start[i+1]
	D := s.st.Demand[i]
	served, cost := 0.0, 0.0
	x, dist, eng := s.st.Flow[e0:e1], s.st.Dist[e0:e1], s.st.Eng[e0:e1]
	flows, weights := c.FlowsRPS[:len(x)], c.Weights[:len(x)]
	for r, v := range x {
		flows[r] = v
		if D > 0 {
			weights[r] = v / D
		}
		if v > 0 {
			served += v
			cost += v * (dist[r] + sol.Engines[eng[r]].LatencyMs)
		}
	}
	s.served[i], s.costs[i] = served, cost
}

// finishSolution completes sol after rowOut: shed, mean latencies and notes.
func (s *Solver) finishSolution(sol *Solution, notes []string) {
	p := s.p
	totalServed, totalCost := 0.0, 0.0
	for i := range p.Clusters {
		c := &sol.Clusters[i]
		cl := &p.Clusters[i]
		e0, e1 := s.st.Start[i], s.st.Start[i+1]
		served, cost := s.served[i], s.costs[i]
		c.ShedRPS = s.st.Shed[i]
		if s.st.Demand[i] > 0 {
			c.ShedFraction = s.st.Shed[i] / s.st.Demand[i]
		}
		left := s.st.Shed[i]
		for _, q := range s.st.Order {
			t := math.Min(left, cl.Demand[q])
			c.ShedByPriority[q] = t
			left -= t
		}
		if served > 0 {
			c.MeanLatencyMs = cost / served
		}
		totalServed += served
		totalCost += cost
		sol.ShedRPS += s.st.Shed[i]
		if e0 == e1 && s.st.Demand[i] > 0 {
			notes = append(notes, fmt.Sprintf("cluster %s has no eligible engine: all shed", cl.Name))
		} else if s.st.Demand[i] > 0 && s.st.Shed[i] >= s.st.Demand[i]*(1-1e-12) {
			notes = append(notes, fmt.Sprintf("cluster %s: its eligible engines have no capacity left: all shed", cl.Name))
		} else if s.st.Shed[i] > 1e-9*s.st.Demand[i] {
			notes = append(notes, fmt.Sprintf("cluster %s: %.4g of %.4g req/s shed for lack of capacity", cl.Name, s.st.Shed[i], s.st.Demand[i]))
		}
	}
	if totalServed > 0 {
		sol.MeanLatencyMs = totalCost / totalServed
	}
	sol.Diagnostics.Notes = notes
}
