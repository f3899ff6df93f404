package sim

import (
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/guard"
	"github.com/switchyard-dev/switchyard/router/live"
	"github.com/switchyard-dev/switchyard/router/prefix"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/sim/scenario"
)

// This file holds every call from the simulator into the router's guards:
// the live state (down marks, in-flight counts, the load from signals,
// ejection), admission (the snapshot's shed fractions by key and class and
// the allotments), the retry budget and the retry's next engine. Each
// cluster's router runs them on the run's virtual clock.

// simModel names the model of every simulated snapshot, signal and state.
const simModel = "sim"

// clock returns the run's virtual time as a time.Time, for the router's guards.
func (r *run) clock() time.Time {
	return time.UnixMilli(0).Add(time.Duration(r.now * float64(time.Millisecond)))
}

// routerGuards is one cluster's router: its guards over the installed table.
type routerGuards struct {
	live    *live.LiveSet
	bound   *live.Bound    // bound to the installed table
	figures *guard.Figures // the installed snapshot's
	adm     *live.Admission
	budget  *guard.RetryBudget
	recent  *selection.RecentKeys
	prefix  *prefix.Index // the router's prefix index, learned from what it routed
	toSim   []int         // table index → engine index
	fromSim []int         // engine index → table index
}

// attempt is a request's current attempt at its router.
type attempt struct {
	g     *routerGuards
	bound *live.Bound // the bound it was picked under, released on
	idx   int         // its engine's index in bound's table
	probe bool        // the engine's half-open probe (live.EngineLive.Claim)
	key   uint64
	tried []int // table indexes of the engines refused, in bound's table
}

// regions resolves engines' regions for the retry's next engine.
type regions struct{ byName map[string]string }

func (rs regions) Region(_, engine string) string { return rs.byName[engine] }

// guards is every router's guards of a run.
type guards struct {
	routers []routerGuards // [cluster]
	att     []attempt      // [request]
	regions regions
}

func (gs *guards) setup(r *run) {
	clock := r.clock
	gs.routers = make([]routerGuards, len(r.f.clusters))
	gs.att = make([]attempt, len(r.arrivals))
	gs.regions = regions{byName: make(map[string]string, len(r.f.engines))}
	for j := range r.f.engines {
		gs.regions.byName[r.f.engines[j].name] = r.f.engines[j].region
	}
	for c := range gs.routers {
		rk, err := selection.NewRecentKeys(selection.DefaultRecentKeys)
		if err != nil {
			panic("sim: selection.NewRecentKeys: " + err.Error()) // a constant size; a failure is a bug
		}
		px, err := prefix.New(prefix.Options{})
		if err != nil {
			panic("sim: prefix.New: " + err.Error()) // the defaults; a failure is a bug
		}
		for j := range r.f.engines {
			// The engine's KV size, in the trace's blocks as the index's.
			if err := px.SetCapacity(r.f.engines[j].name, r.f.engines[j].typ.KVBlocks); err != nil {
				panic("sim: prefix.SetCapacity: " + err.Error())
			}
		}
		gs.routers[c] = routerGuards{
			live:   live.NewLiveSet(clock),
			adm:    live.NewAdmission(live.ProtectionOptions{}),
			budget: guard.NewRetryBudget(guard.BudgetOptions{}, clock),
			recent: rk,
			prefix: px,
		}
	}
}

// bind binds cluster c's router to its new table and snapshot.
func (gs *guards) bind(r *run, c int, ct *clusterTable, snap *messages.WeightSnapshot) {
	g := &gs.routers[c]
	g.bound = g.live.Bind(ct.t)
	g.figures = guard.FiguresOf(snap)
	g.toSim = ct.toSim
	g.fromSim = make([]int, len(r.f.engines))
	for j := range g.fromSim {
		g.fromSim[j] = -1
	}
	for i, j := range ct.toSim {
		g.fromSim[j] = i
	}
}

// signalled folds every engine's signal into every router's live state, as
// a router does with the signals it receives: the load for Bound.Load and
// the engine's down mark.
func (gs *guards) signalled(r *run) {
	for c := range gs.routers {
		live := gs.routers[c].live
		for j := range r.engines {
			e, s := &r.engines[j], &r.sig[j]
			name := r.f.engines[j].name
			live.SetDown(name, !s.up)
			live.ObserveSignal(&messages.EngineSignal{Model: simModel, Engine: name, Queue: e.batch.Queued(), Running: e.batch.Running(),
				MaxRunning: e.d.typ.MaxBatch, CapacityRPS: s.capacity, TBTMs: s.tbt.Fast, BaseLatencyMs: s.idleMs})
		}
	}
}

// admitAndPick routes request q of cluster c as the router does: the
// snapshot's shed fraction and the admission control, then Table.PickRecent
// with the router's RecentKeys when it has an affinity key, else
// Table.PickTwo on a spread key (then Bound.Overflow, past a full batch),
// under the router's bound-load guard, and
// Bound.PickFallback when every weighted engine is skipped. It returns the
// engine index, or -1 when the request is shed (or no engine is up).
func (gs *guards) admitAndPick(r *run, c int, q int32, a *scenario.Arrival) int {
	g := &gs.routers[c]
	if g.bound == nil {
		return -1
	}
	key, src := a.Key, protocol.KeyPrefix
	if a.Session != 0 {
		src = protocol.KeySession
	}
	if key == 0 {
		r.spreadSeq[c]++
		key, src = selection.SpreadKey(r.spreadSeq[c]), protocol.KeyNone
	}
	u, reason, _ := g.adm.Admit(r.clock(), g.figures, g.bound, g.recent, key, src, protocol.PriorityStandard)
	if reason != "" {
		return -1
	}
	t := g.bound.Table()
	var i int
	var ok bool
	var keys []uint64 // a prefix key's blocks, as the router keys only those
	switch src {
	case protocol.KeyNone:
		if i, ok = t.PickTwo(key, g.bound); ok {
			i, _ = g.bound.Overflow(i, g.figures)
		}
	case protocol.KeyPrefix:
		// The trace's block ids are chained (an id names its whole
		// prefix), as the router's PrefixKeys are.
		keys = a.Blocks[:min(len(a.Blocks), protocol.MaxPrefixKeys)]
		i, ok = g.prefix.Pick(t, g.bound, key, keys)
		if ok {
			g.recent.RememberName(key, t.Engine(i).Name)
		}
	default:
		i, ok = t.PickRecent(key, g.bound, g.recent)
	}
	fallback := false
	if !ok {
		i, fallback, ok = g.bound.PickFallback(key, g.figures.Spare)
	}
	if !ok {
		g.adm.Done()
		return -1
	}
	if !fallback {
		g.prefix.Routed(t.Engine(i).Name, keys, r.clock())
	}
	g.budget.Earn(u)
	gs.att[q] = attempt{g: g, bound: g.bound, key: key}
	return gs.send(r, q, i)
}

// send starts request q's attempt on engine i of its bound's table.
func (gs *guards) send(r *run, q int32, i int) int {
	at := &gs.att[q]
	at.idx = i
	_, at.probe = at.bound.Live(i).Claim(r.clock())
	at.bound.Acquire(i)
	return at.g.toSim[i]
}

// retried returns the engine of request q's retry, picked when its engine
// refused it (attemptEnded), and starts the attempt.
func (gs *guards) retried(r *run, q int32) int { return gs.send(r, q, gs.att[q].idx) }

// attemptResult is the router's result of an attempt's outcome: a
// refusal before the first token is a connect error, an engine failing
// under a running request a broken stream (see control.Result.Blames).
func attemptResult(outcome uint8) control.Result {
	switch outcome {
	case attemptOK:
		return control.ResultOK
	case attemptRefused:
		return control.ResultConnect
	}
	return control.ResultOther
}

// attemptEnded ends request q's attempt at its router: it releases the
// engine's in-flight count, records the result for the engine's ejection,
// and for a refusal decides the retry as the router does (within
// live.DefaultMaxAttempts and the retry budget, on the key's next
// candidate); a request that is not retried ends its admission.
func (gs *guards) attemptEnded(r *run, q int32, outcome uint8) bool {
	at := &gs.att[q]
	if at.g == nil {
		return false
	}
	at.bound.Release(at.idx)
	now := r.clock()
	at.bound.Live(at.idx).Report(attemptResult(outcome), at.probe, now, live.EjectOptions{})
	if outcome == attemptRefused {
		at.tried = append(at.tried, at.idx)
		if len(at.tried) < live.DefaultMaxAttempts {
			cands := live.RetryCandidates{Model: simModel, Table: at.bound.Table(), Guard: at.bound, Key: at.key,
				Spare: at.g.figures.Spare, Regions: gs.regions}
			if next, ok := cands.Next(at.tried, at.idx); ok && at.g.budget.Take() {
				at.idx = next
				return true
			}
		}
	}
	at.g.adm.Done()
	*at = attempt{}
	return false
}
