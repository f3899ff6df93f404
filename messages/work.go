package messages

import "math"

// DefaultPrefillWeight is the cost of one prompt token relative to one
// output token assumed for an engine that does not state its own
// (EngineSignal.PrefillWeight). A continuous-batching engine computes a
// prompt token in a compute-bound prefill and an output token in a
// memory-bound decode step shared by its whole batch; vLLM on an H100
// prefills some 10,000-20,000 tokens/s of an 8B model where a full batch
// decodes some 2,000-4,000, so a prompt token costs about a tenth of an
// output token.
const DefaultPrefillWeight = 0.1

// Work is the unit of work of a request of prompt prompt tokens and output
// output tokens on an engine whose prompt token costs prefillWeight output
// tokens: prefillWeight × prompt + output, in output-token equivalents.
// Demand, capacity and the plan's loads are counted in it, so that a
// prefill-heavy request counts as the load it is. Negative or non-finite
// inputs count as 0.
func Work(prompt, output, prefillWeight float64) float64 {
	return finitePos(prefillWeight)*finitePos(prompt) + finitePos(output)
}

// Mix returns the cluster's mean prompt and output tokens per request from
// its slow windows, each 0 when not measured (no router reported it).
func (m *DemandState) Mix() (prompt, output float64) {
	if m.RPS.Slow > 0 {
		prompt = finitePos(m.PromptTPS.Slow / m.RPS.Slow)
	}
	if m.DoneRPS.Slow > 0 {
		output = finitePos(m.OutputTPS.Slow / m.DoneRPS.Slow)
	}
	return prompt, output
}

// StdDev returns the standard deviation of the cluster's request rate over
// one second, req/s, from its slow variance window (0 when not measured).
func (m *DemandState) StdDev() float64 { return math.Sqrt(finitePos(m.RPSVar.Slow)) }

func finitePos(v float64) float64 {
	if !(v > 0) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

// Fold folds one router's report into its entry of the cluster's demand:
// every rate of the report over its interval, dt seconds after the
// router's previous report (first: the router's first). The aggregator
// folds routers' reports with it and the simulator its routers'
// intervals, so both keep the same windows.
func (r *RouterDemand) Fold(s Smoother, rep *RouterReport, dt float64, first bool) {
	iv := rep.IntervalS
	s.UpdateVariance(&r.RPS, &r.RPSVar, float64(rep.Requests)/iv, iv, dt, first)
	s.Update(&r.PromptTPS, float64(rep.PromptTokens)/iv, dt, first)
	s.Update(&r.DoneRPS, float64(rep.Completed)/iv, dt, first)
	s.Update(&r.OutputTPS, float64(rep.OutputTokens)/iv, dt, first)
	s.Update(&r.ShedRPS, float64(rep.Shed)/iv, dt, first)
	s.Update(&r.RetryRPS, float64(rep.Retries)/iv, dt, first)
	if len(rep.DemandByPriority) > 0 || len(r.Priority) > 0 {
		pri := make(map[string]Window, 3)
		for _, p := range []string{PriorityCritical, PriorityStandard, PrioritySheddable} {
			w, had := r.Priority[p]
			s.Update(&w, float64(rep.DemandByPriority[p])/iv, dt, first || !had)
			pri[p] = w
		}
		r.Priority = pri
	}
}
