package optimizersvc

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-dev/switchyard/auth/endpoints"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/optimizer"
	"github.com/switchyard-dev/switchyard/plan"
	"github.com/switchyard-dev/switchyard/streams"
)

// built is one model's problem with the names needed to write its snapshots.
type built struct {
	model   string
	problem *optimizer.Problem
	plan    *plan.Built // problem and what reads its solution back in requests
}

// buildProblems turns the current state into one problem per model, in model
// order; models are those with at least one engine state.
func (s *Service) buildProblems() []built {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	drained := map[string]int{}
	for _, op := range s.operators {
		drained[op.Action]++
	}
	for _, a := range []string{messages.ActionDrain, messages.ActionCordon, messages.ActionHealth} {
		s.metrics.operator.WithLabelValues(a).Set(float64(drained[a]))
	}
	for key := range s.ramps {
		if _, ok := s.engines[key]; !ok {
			s.endSlowStart(key, "engine state gone")
		}
	}
	for key := range s.refusedAt {
		if _, ok := s.engines[key]; !ok {
			delete(s.refusedAt, key)
		}
	}
	engines := map[string][]*messages.EngineState{}
	for _, key := range sortedKeys(s.engines) {
		st := s.engines[key]
		engines[st.Model] = append(engines[st.Model], st)
	}
	clusters := map[string]map[string]*messages.DemandState{}
	for _, d := range s.demand {
		if clusters[d.Model] == nil {
			clusters[d.Model] = map[string]*messages.DemandState{}
		}
		clusters[d.Model][d.Cluster] = d
	}
	var out []built
	refused := 0
	defer func() { s.metrics.refused.Set(float64(refused)) }()
	for _, model := range sortedKeys(engines) {
		network := plan.Network{
			Measured: func(c, engine string) (float64, bool) {
				ms, ok := s.rtt[streams.JoinNames(c, engine)]
				return ms, ok
			},
			Configured: s.opts.NetworkMs, PreferConfigured: s.opts.PreferConfiguredNetwork,
			ClusterRegion: func(c string) string { return s.opts.ClusterRegions[c] },
			EngineRegion: func(engine string) string {
				if st := s.engines[streams.JoinKey(model, engine)]; st != nil {
					return st.Region
				}
				return ""
			},
			Regions: s.opts.Regions, NoRegionDefault: s.opts.NoRegionDefault,
		}
		in := plan.Input{Network: network.Latency, Targets: s.opts.targets(), MinDemandRPS: s.opts.MinDemandRPS}
		modelRefused := 0
		for _, st := range engines[model] {
			key := streams.JoinKey(model, st.Engine)
			if s.refused(st, key, now) {
				// Not planned, but no slow start when it is accepted again:
				// its capacity did not go, its address was refused.
				modelRefused++
				continue
			}
			if st.Status == messages.StatusDown && !st.ServedOnOutcomes(now, s.opts.Penalties.EvidenceMaxAge) {
				// A silent engine that routers still use successfully is
				// planned on (its agent died, not the engine).
				s.slowStart(key, st, 0, now)
				continue
			}
			health, pen, excluded := s.healthOf(model, key, st, now)
			if excluded {
				health = 0
			}
			health *= math.Min(pen, s.slowStart(key, st, st.CapacityRPS*health, now))
			in.Engines = append(in.Engines, plan.EngineOf(st, health, plan.BaseMs(s.fits[key], st, s.opts.PriorBaseMs)))
		}
		refused += modelRefused
		if modelRefused == len(engines[model]) {
			// Every engine is refused: there is nothing to plan, which is
			// no reason to shed. Routers keep the snapshot they hold, or
			// their local policy over the engines they accept.
			continue
		}
		names := map[string]*messages.DemandState{}
		for c, d := range clusters[model] {
			names[c] = d
		}
		for _, c := range s.opts.Clusters {
			if _, ok := names[c]; !ok {
				names[c] = nil
			}
		}
		for _, c := range sortedKeys(names) {
			d := s.hold.Hold(streams.JoinKey(model, c), names[c], now.UnixMilli())
			in.Clusters = append(in.Clusters, plan.Cluster{Name: c, Demand: d})
		}
		b := plan.Build(in)
		out = append(out, built{model: model, problem: b.Problem, plan: b})
	}
	s.hold.Sweep()
	return out
}

// endpointGrace is how long an engine's state must go on advertising an
// endpoint the policy refuses before the engine is left out of the plan:
// a few signal intervals, so that the states a restarted fleet stored at
// its old addresses, rewritten by the engines' first signals, and a
// forged signal now and then between an engine's own, move no traffic
// (routers check every signal themselves and never forward to a refused
// endpoint meanwhile).
const endpointGrace = 2 * time.Second

// refused asks the endpoint policy about the endpoints st advertises and
// reports whether the engine has been refused for endpointGrace; it logs
// such an engine at a bounded rate. Callers hold s.mu.
func (s *Service) refused(st *messages.EngineState, key string, now time.Time) bool {
	if s.opts.Endpoints == nil {
		return false
	}
	u, subject := endpoints.Of(st.Transports)
	err := s.opts.Endpoints.Check(st.Model, st.Engine, u, subject)
	if err == nil {
		delete(s.refusedAt, key)
		return false
	}
	since, ok := s.refusedAt[key]
	if !ok {
		s.refusedAt[key] = now
		since = now
	}
	if now.Sub(since) < endpointGrace {
		return false
	}
	if s.badLog.Allow("endpoint/"+key, now) {
		s.log.Warn().Err(err).Str("model", st.Model).Str("engine", st.Engine).Str("reason", endpoints.Reason(err)).
			Dur("refused_for", now.Sub(since)).
			Msg("engine left out of the plan: the operator's endpoint policy refuses the endpoint its state advertises (logged at most once per 10s per engine)")
	}
	return true
}

// solveAll solves every model and, as leader, writes the snapshots that changed.
func (s *Service) solveAll(ctx context.Context, weights, enginesKV jetstream.KeyValue) {
	s.updatePenalties(ctx, enginesKV)
	problems := s.buildProblems()
	clusters, engines := 0, 0
	live := make(map[string]bool, len(problems))
	for _, b := range problems {
		live[b.model] = true
		clusters += len(b.problem.Clusters)
		engines += len(b.problem.Engines)
		ms := s.models[b.model]
		if ms == nil {
			ms = &modelState{solver: optimizer.NewSolver(s.opts.Solver)}
			s.models[b.model] = ms
		}
		sol, err := ms.solver.Solve(b.problem, ms.prev)
		if err != nil {
			s.metrics.solveErrors.Inc()
			if s.badLog.Allow("solve/"+b.model, time.Now()) {
				s.log.Error().Err(err).Str("model", b.model).Int("clusters", len(b.problem.Clusters)).
					Int("engines", len(b.problem.Engines)).Msg("solve failed (logged at most once per 10s per model)")
			}
			continue
		}
		if !s.opts.ShedByLatency {
			optimizer.ShareShed(b.problem, sol)
		}
		// Of the splits the objective leaves open between alike clusters
		// and engines, the one the loads fix, so that weights do not trade
		// keys between them from one solve to the next.
		optimizer.SplitTies(b.problem, sol, ms.solver.Options().Tolerance)
		ms.prev = sol
		s.metrics.solveDuration.WithLabelValues(sol.Diagnostics.Path).Observe(sol.Diagnostics.Duration.Seconds())
		s.metrics.gap.WithLabelValues(b.model).Set(sol.Diagnostics.SolveRelGap)
		s.mu.Lock()
		s.solutions[b.model] = sol
		s.mu.Unlock()
		// The solve's own certificate, not that of the weights the dead band
		// kept (which is loose by design, see docs/optimizer.md).
		if sol.Diagnostics.OutOfTime {
			// The solver stopped at its time budget: the weights are a feasible point, not
			// certified optimal (logged at most once per 10 s per model).
			s.metrics.outOfTime.WithLabelValues(b.model).Inc()
			if s.badLog.Allow("budget/"+b.model, time.Now()) {
				s.log.Warn().Str("model", b.model).Float64("rel_gap", sol.Diagnostics.SolveRelGap).
					Dur("budget", ms.solver.Options().TimeBudget).Dur("took", sol.Diagnostics.Duration).
					Int("clusters", len(b.problem.Clusters)).Int("engines", len(b.problem.Engines)).
					Strs("notes", sol.Diagnostics.Notes).Msg("solve ran out of its time budget")
			}
		} else if !(sol.Diagnostics.SolveRelGap <= s.opts.Solver.Tolerance) {
			s.log.Debug().Str("model", b.model).Float64("rel_gap", sol.Diagnostics.SolveRelGap).Strs("notes", sol.Diagnostics.Notes).Msg("solve did not converge")
		}
		if s.Leader() {
			s.publish(ctx, weights, b, sol)
		}
	}
	for m := range s.models {
		if !live[m] {
			delete(s.models, m)
			s.metrics.gap.DeleteLabelValues(m)
			s.metrics.outOfTime.DeleteLabelValues(m)
			s.mu.Lock()
			delete(s.solutions, m)
			s.mu.Unlock()
		}
	}
	s.metrics.problems.Set(float64(len(problems)))
	s.metrics.clusters.Set(float64(clusters))
	s.metrics.engines.Set(float64(engines))
}

// snapshot renders cluster i of sol as a weight snapshot (without generation).
func (s *Service) snapshot(b built, sol *optimizer.Solution, i int, now time.Time) *messages.WeightSnapshot {
	snap := b.plan.Snapshot(b.model, sol, i, s.opts.targets())
	snap.Time, snap.Writer = now.UnixMilli(), s.opts.Instance
	return snap
}

// publish writes the snapshots of one model whose clusters need it. Each
// read or write of the bucket is bounded by LeaseTTL/3; when one fails for
// another reason than a conflict, the round stops and a new solve is asked for.
func (s *Service) publish(ctx context.Context, weights jetstream.KeyValue, b built, sol *optimizer.Solution) {
	band := max(s.opts.Solver.DeadBand, 1e-9)
	now := s.opts.Now()
	for i := range sol.Clusters {
		if ctx.Err() != nil {
			return
		}
		snap := s.snapshot(b, sol, i, now)
		key, err := streams.WeightsKey(b.model, snap.Cluster)
		if err != nil {
			s.log.Error().Err(err).Str("model", b.model).Str("cluster", snap.Cluster).Msg("no weights key")
			continue
		}
		ks, err := s.keyState(ctx, weights, key)
		if err != nil {
			if ctx.Err() == nil {
				if s.badLog.Allow("write/"+key, time.Now()) {
					s.log.Warn().Err(err).Str("key", key).Msg("cannot read weights key; will retry (logged at most once per 10s per key)")
				}
				s.notify()
			}
			return
		}
		if ks.last != nil {
			tv, flip := plan.Distance(ks.last, snap)
			age := now.Sub(time.UnixMilli(ks.last.Time))
			if tv < band && !flip && age < s.opts.Heartbeat {
				continue
			}
		}
		gen, ok := messages.NextGeneration(max(ks.gen, s.maxGen[key]), now)
		if !ok {
			// Only after the clock stepped back by more than
			// messages.MaxFutureSkew: a generation routers would take for
			// one from the future. Wait for the clock rather than write it.
			s.metrics.generationAhead.Inc()
			if s.badLog.Allow("generation/"+key, time.Now()) {
				s.log.Warn().Str("key", key).Uint64("generation", max(ks.gen, s.maxGen[key])).
					Uint64("ceiling", messages.GenerationCeiling(now)).
					Msg("weights key's generation is ahead of this clock's ceiling; not writing it until the clock catches up (logged at most once per 10s per key)")
			}
			continue
		}
		if ks.rev != 0 && ks.last == nil && s.badLog.Allow("corrupt/"+key, time.Now()) {
			s.log.Warn().Str("key", key).Uint64("generation", gen).Uint64("revision", ks.rev).
				Msg("weights key holds a value that cannot be followed (undecodable, invalid, or from the future); overwriting it (logged at most once per 10s per key)")
		}
		snap.Generation = gen
		withSlots(snap, ks.last)
		data, err := messages.EncodeAt(snap, now)
		if errors.Is(err, messages.ErrTooLarge) && len(snap.Slots) > 0 {
			// Too many engines for a slot table in one snapshot: routers
			// compute theirs from the weights.
			if s.badLog.Allow("slots/"+key, time.Now()) {
				s.log.Warn().Err(err).Str("key", key).Int("engines", len(snap.SlotEngines)).
					Msg("snapshot too large with its slot table; writing it without (logged at most once per 10s per key)")
			}
			snap.SlotEngines, snap.Slots = nil, nil
			data, err = messages.EncodeAt(snap, now)
		}
		if err != nil {
			if s.badLog.Allow("encode/"+key, time.Now()) {
				s.log.Error().Err(err).Str("key", key).Msg("snapshot does not encode; not written (logged at most once per 10s per key)")
			}
			continue
		}
		if !s.Leader() {
			return // lost the lease meanwhile: stop writing at once
		}
		var rev uint64
		wctx, cancel := context.WithTimeout(ctx, s.opts.LeaseTTL/3)
		if ks.rev == 0 {
			rev, err = weights.Create(wctx, key, data)
		} else {
			rev, err = weights.Update(wctx, key, data, ks.rev)
		}
		cancel()
		if err != nil {
			if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
				s.metrics.conflicts.Inc()
				delete(s.keys, key)
				if ks, rerr := s.keyState(ctx, weights, key); rerr == nil {
					s.log.Warn().Str("key", key).Uint64("generation", ks.gen).Uint64("revision", ks.rev).
						Str("writer", writerOf(ks.last)).Msg("weights key written by someone else; not overwriting it this round")
				}
				s.notify() // decide again on the next solve, against what is there now
				continue
			}
			if ctx.Err() == nil {
				if s.badLog.Allow("write/"+key, time.Now()) {
					s.log.Warn().Err(err).Str("key", key).Uint64("generation", snap.Generation).
						Msg("snapshot write failed; will retry (logged at most once per 10s per key)")
				}
				delete(s.keys, key)
				s.notify()
			}
			return
		}
		if ks.rev != 0 && ks.last == nil {
			s.metrics.overwritten.Inc()
		}
		ks.rev, ks.gen, ks.last = rev, snap.Generation, snap
		s.maxGen[key] = snap.Generation
		s.metrics.generations.Inc()
		s.log.Debug().Str("key", key).Uint64("generation", snap.Generation).Float64("shed", snap.ShedFraction).Msg("snapshot written")
	}
}

func writerOf(w *messages.WeightSnapshot) string {
	if w == nil {
		return ""
	}
	return w.Writer
}

// keyState returns what is known of a weights key, reading it when unknown.
func (s *Service) keyState(ctx context.Context, weights jetstream.KeyValue, key string) (*keyState, error) {
	if ks := s.keys[key]; ks != nil {
		return ks, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.LeaseTTL/3)
	defer cancel()
	ks := &keyState{}
	e, err := weights.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		// Absent (or deleted): Create it, at a generation above any this
		// instance has seen for the key (s.maxGen). kv.History would find the
		// generations of a deleted key, but it does not honour ctx and can
		// block while the server recovers, so it is not used.
	case err != nil:
		return nil, fmt.Errorf("get weights key %s: %w", key, err)
	default:
		ks.rev = e.Revision()
		var snap messages.WeightSnapshot
		if derr := messages.DecodeIntoAt(e.Value(), &snap, s.opts.Now()); derr != nil {
			s.bad(s.opts.Names.WeightsBucket, key, derr)
		} else {
			ks.gen, ks.last = snap.Generation, &snap
		}
	}
	s.maxGen[key] = max(s.maxGen[key], ks.gen)
	s.keys[key] = ks
	return ks, nil
}
