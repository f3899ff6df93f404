package optimizer

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// Policy turns a problem into a solution. The optimal policy is the solver; the others are
// baselines for comparison. A Policy is not safe for concurrent use.
type Policy interface {
	// Name returns the policy's name as accepted by PolicyByName.
	Name() string
	// Solve routes p; prev, if not nil, is the previous solution (used by the optimal policy
	// for warm starts and stability, ignored by the baselines).
	Solve(p *Problem, prev *Solution) (*Solution, error)
}

// PolicyNames lists the names PolicyByName accepts.
func PolicyNames() []string {
	return []string{"optimal", "nearest", "waterfall", "proportional", "least-latency"}
}

// PolicyByName returns the named policy configured with opt, or an error wrapping
// ErrUnknownPolicy.
func PolicyByName(name string, opt Options) (Policy, error) {
	switch name {
	case "optimal":
		return &optimalPolicy{s: NewSolver(opt)}, nil
	case "least-latency":
		o := opt
		o.ProximalMs, o.DeadBand, o.Congestion = 0, 0, -1
		s := NewSolver(o)
		s.st.Equilibrium = true
		return &optimalPolicy{s: s, name: name}, nil
	case "nearest", "waterfall", "proportional":
		// The baselines are evaluated at the latency they cause, without the term.
		opt.Congestion = -1
		return &baseline{name: name, s: NewSolver(opt)}, nil
	}
	return nil, fmt.Errorf("optimizer: policy %q: %w (want one of %v)", name, ErrUnknownPolicy, PolicyNames())
}

type optimalPolicy struct {
	s    *Solver
	name string
}

func (o *optimalPolicy) Name() string {
	if o.name == "" {
		return "optimal"
	}
	return o.name
}

func (o *optimalPolicy) Solve(p *Problem, prev *Solution) (*Solution, error) {
	sol, err := o.s.Solve(p, prev)
	if err != nil {
		return nil, err
	}
	sol.Policy = o.Name()
	if o.s.st.Equilibrium {
		// Report the system-optimum gap of the equilibrium, not its own equilibrium gap.
		o.s.st.Equilibrium = false
		m := o.s.st.Measure(false)
		o.s.st.Equilibrium = true
		sol.Diagnostics.Objective, sol.Diagnostics.Gap, sol.Diagnostics.RelGap = m.Objective, m.Gap, m.RelGap
		sol.Diagnostics.SolveRelGap = m.RelGap
		sol.Diagnostics.Notes = append(sol.Diagnostics.Notes, "least-latency equalises average latency; gap is relative to the optimum")
	}
	return sol, nil
}

// baseline implements the nearest, waterfall and proportional policies.
type baseline struct {
	name string
	s    *Solver
}

func (b *baseline) Name() string { return b.name }

func (b *baseline) Solve(p *Problem, _ *Solution) (*Solution, error) {
	t0 := time.Now()
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("optimizer: invalid problem: %w", err)
	}
	s := b.s
	s.setup(p)
	s.warm(p, nil, true)
	clear(s.st.Load)
	var order []int
	for i := range p.Clusters {
		e0, e1 := s.st.Start[i], s.st.Start[i+1]
		D := s.st.Demand[i]
		for k := e0; k < e1; k++ {
			s.st.Flow[k] = 0
		}
		switch b.name {
		case "nearest":
			best := -1
			for k := e0; k < e1; k++ {
				if s.st.Cap[s.st.Eng[k]] > 0 && (best < 0 || s.st.Dist[k] < s.st.Dist[best]) {
					best = k
				}
			}
			if best >= 0 {
				s.st.Flow[best] = D
			}
		case "waterfall":
			order = order[:0]
			for k := e0; k < e1; k++ {
				order = append(order, k)
			}
			sort.SliceStable(order, func(a, c int) bool { return s.st.Dist[order[a]] < s.st.Dist[order[c]] })
			left := D
			for _, k := range order {
				j := s.st.Eng[k]
				t := math.Min(left, math.Max(0, s.st.Cap[j]-s.st.Load[j]))
				s.st.Flow[k] = t
				s.st.Load[j] += t
				left -= t
			}
			for k := e0; k < e1; k++ {
				s.st.Load[s.st.Eng[k]] -= s.st.Flow[k]
			}
		case "proportional":
			total := 0.0
			for k := e0; k < e1; k++ {
				total += s.st.Cap[s.st.Eng[k]]
			}
			if total > 0 {
				for k := e0; k < e1; k++ {
					s.st.Flow[k] = D * s.st.Cap[s.st.Eng[k]] / total
				}
			}
		}
		served := 0.0
		for k := e0; k < e1; k++ {
			s.st.Load[s.st.Eng[k]] += s.st.Flow[k]
			served += s.st.Flow[k]
		}
		s.st.Shed[i] = math.Max(0, D-served)
		s.st.Mu[i] = math.NaN()
	}
	over := false
	for j := range s.st.Load {
		if s.st.Load[j] > s.st.Cap[j]*(1+1e-12) {
			over = true
		}
	}
	var notes []string
	sol := s.solution(p, b.name, notes)
	if over {
		sol.Diagnostics.Notes = append(sol.Diagnostics.Notes, "some engines are loaded beyond capacity (utilisation > 1); their latency is infinite for queue profiles")
		sol.Diagnostics.Gap, sol.Diagnostics.RelGap, sol.Diagnostics.Objective = math.NaN(), math.NaN(), math.NaN()
		// Recompute the mean latency: solution() skips nothing, so infinite latencies propagate.
	} else {
		m := s.st.Measure(false)
		sol.Diagnostics.Objective, sol.Diagnostics.Gap, sol.Diagnostics.RelGap = m.Objective, m.Gap, m.RelGap
	}
	sol.Diagnostics.SolveRelGap = sol.Diagnostics.RelGap
	sol.Diagnostics.Duration = time.Since(t0)
	return sol, nil
}
