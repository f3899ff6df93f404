package optimizersvc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/optimizer"
	"github.com/switchyard-dev/switchyard/streams"
)

// handleOther folds a non-engine-state value of sy_engines (by its kind:
// operator overrides, and the leader's penalty records, which a follower
// adopts when newer than its own judgement) and reports whether it was one.
func (s *Service) handleOther(key string, value []byte) bool {
	_, kind, err := messages.Peek(value)
	if err != nil || kind == messages.KindEngineState {
		return false
	}
	switch kind {
	case messages.KindOperator:
		var op messages.Operator
		if err := messages.DecodeIntoAt(value, &op, s.opts.Now()); err != nil {
			s.bad(s.opts.Names.EnginesBucket, key, err)
			return true
		}
		if want, _ := streams.OperatorKey(op.Engine); want != key {
			s.bad(s.opts.Names.EnginesBucket, key, fmt.Errorf("%w: operator record for %s stored under key %q", messages.ErrInvalid, op.Engine, key))
			return true
		}
		s.mu.Lock()
		s.operators[key] = &op
		delete(s.restore, key)
		s.mu.Unlock()
		s.log.Warn().Str("engine", op.Engine).Str("model", op.Model).Str("action", op.Action).Float64("health", op.Health).
			Str("reason", op.Reason).Str("by", op.By).Msg("operator override in force")
		s.notify()
	case messages.KindPenalty:
		var pen messages.Penalty
		if err := messages.DecodeIntoAt(value, &pen, s.opts.Now()); err != nil {
			s.bad(s.opts.Names.EnginesBucket, key, err)
			return true
		}
		if want, _ := streams.PenaltyKey(pen.Model, pen.Engine); want != key {
			s.bad(s.opts.Names.EnginesBucket, key, fmt.Errorf("%w: penalty record for %s.%s stored under key %q", messages.ErrInvalid, pen.Model, pen.Engine, key))
			return true
		}
		s.adoptPenalty(&pen)
	default:
		s.bad(s.opts.Names.EnginesBucket, key, fmt.Errorf("%w: %q in the engines bucket", messages.ErrKind, kind))
	}
	return true
}

// adoptPenalty folds the leader's penalty record into this instance's
// penalties when it is not the leader and the record is newer than what it
// judged itself (a later penalty, or more strikes), so that a follower
// taking over continues the escalation rather than starting again at
// strike one.
//
// A record written before this instance started (read from the bucket on a
// restart) keeps its strikes, decaying as they would have, but not its
// penalty: the evidence behind it is older than the restart and the fault
// may be long gone, so the engine serves at once at full weight (a
// restarted service does not throttle the fleet, as with slow starts), and
// fresh evidence judges it again, continuing the escalation if the fault
// persists.
func (s *Service) adoptPenalty(pen *messages.Penalty) {
	restored := pen.Time < s.started.UnixMilli()
	// The leader's own records come back through the watch; a predecessor's
	// (restored) are adopted by the leader too, so that it deletes them
	// once forgotten.
	if pen.Strikes <= 0 || (s.Leader() && !restored) {
		return
	}
	key := streams.JoinKey(pen.Model, pen.Engine)
	since := time.UnixMilli(pen.Since)
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pens[key]
	if p != nil && (p.strikes > pen.Strikes || (p.strikes == pen.Strikes && !since.After(p.since))) {
		return
	}
	if p == nil {
		p = &penalty{}
		s.pens[key] = p
	}
	*p = penalty{strikes: pen.Strikes, reason: pen.Reason, detail: pen.Detail, mult: pen.Multiplier, since: since,
		until: time.UnixMilli(pen.Until), recoverUntil: time.UnixMilli(pen.RecoverUntil), stored: true}
	if now := time.Now(); restored && now.Before(p.recoverUntil) {
		// Ended now, without a slow start; its strikes decay from now.
		p.until, p.recoverUntil = now, now
		s.log.Info().Str("model", pen.Model).Str("engine", pen.Engine).Int("strikes", pen.Strikes).Str("reason", pen.Reason).
			Msg("penalty from before the restart lifted; its strikes are kept for fresh evidence")
	}
}

// forgetOther drops an operator override whose key was deleted (restore).
func (s *Service) forgetOther(key string) bool {
	if !streams.IsOperatorKey(key) {
		return false
	}
	s.mu.Lock()
	op, had := s.operators[key]
	delete(s.operators, key)
	delete(s.restore, key)
	s.mu.Unlock()
	if had {
		s.log.Info().Str("engine", op.Engine).Str("model", op.Model).Str("was", op.Action).Msg("operator override removed (restored)")
		s.notify()
	}
	return had
}

// operatorFor returns the override in force for an engine of model, or nil.
// Callers hold s.mu.
func (s *Service) operatorFor(model, engine string) *messages.Operator {
	op := s.operators[streams.JoinOperatorKey(engine)]
	if op == nil || (op.Model != "" && op.Model != model) {
		return nil
	}
	return op
}

// updatePenalties judges every model's engines, logs new penalties and, as
// leader, publishes the records that changed. It runs on the solve loop.
func (s *Service) updatePenalties(ctx context.Context, kv jetstream.KeyValue) {
	if s.opts.Penalties.Off {
		return
	}
	now := time.Now()
	po := &s.opts.Penalties
	var events []penaltyEvent
	s.mu.Lock()
	byModel := map[string][]string{}
	outs := map[string]*messages.EngineOutcomes{}
	expect := map[string]float64{}
	for _, key := range sortedKeys(s.engines) {
		st := s.engines[key]
		if st.Status == messages.StatusDown && !st.ServedOnOutcomes(now, po.EvidenceMaxAge) {
			continue
		}
		byModel[st.Model] = append(byModel[st.Model], key)
		if o := st.Outcomes; o != nil && o.LastSent > 0 && now.Sub(time.UnixMilli(o.LastSent)) <= po.EvidenceMaxAge {
			outs[key] = o
		}
		if c := st.CapacityRPS * st.Health; c > 0 {
			expect[key] = s.fits[key].TTFTMs(st.LoadRPS.Fast / c)
		}
	}
	for _, model := range sortedKeys(byModel) {
		events = append(events, po.judge(s.pens, byModel[model], outs, expect, now)...)
	}
	for key := range s.pens {
		if _, ok := s.engines[key]; !ok {
			delete(s.pens, key) // engine gone
		}
	}
	penalised := 0
	type rec struct {
		key    string
		msg    *messages.Penalty // nil: delete
		stored bool              // the record was read from the bucket
	}
	var recs []rec
	for _, key := range sortedKeys(s.pens) {
		p := s.pens[key]
		model, engine, _ := streams.CutKey(key)
		pkey, err := streams.PenaltyKey(model, engine)
		if err != nil {
			continue
		}
		if po.forgotten(p, now) {
			delete(s.pens, key)
			recs = append(recs, rec{key: pkey, stored: p.stored})
			continue
		}
		ph := p.phase(now)
		if ph == messages.PhasePenalised {
			penalised++
		}
		recs = append(recs, rec{key: pkey, msg: &messages.Penalty{Model: model, Engine: engine, Phase: ph, Multiplier: p.mult,
			Reason: p.reason, Detail: truncate(p.detail, 500), Since: p.since.UnixMilli(), Until: p.until.UnixMilli(),
			RecoverUntil: p.recoverUntil.UnixMilli(), Strikes: p.strikes}})
	}
	s.mu.Unlock()
	s.metrics.penalised.Set(float64(penalised))
	for _, ev := range events {
		model, engine, _ := streams.CutKey(ev.key)
		s.metrics.penalties.WithLabelValues(ev.p.reason).Inc()
		s.log.Warn().Str("model", model).Str("engine", engine).Str("reason", ev.p.reason).Float64("multiplier", ev.p.mult).
			Dur("duration", ev.p.until.Sub(ev.p.since)).Int("strikes", ev.p.strikes).Str("detail", ev.p.detail).
			Msg("engine penalised")
	}
	leader := s.Leader()
	if !leader {
		clear(s.written)
		return
	}
	for _, r := range recs {
		prev, had := s.written[r.key]
		if r.msg == nil {
			if had || r.stored {
				dctx, cancel := context.WithTimeout(ctx, s.opts.LeaseTTL/3)
				err := kv.Delete(dctx, r.key)
				cancel()
				if err == nil {
					delete(s.written, r.key)
					s.log.Info().Str("key", r.key).Msg("penalty forgotten")
				}
			}
			continue
		}
		sig := fmt.Sprintf("%s/%d/%v/%d", r.msg.Phase, r.msg.Since, r.msg.Multiplier, r.msg.Strikes)
		if had && prev == sig {
			continue
		}
		if had && r.msg.Phase != messages.PhasePenalised {
			s.log.Info().Str("model", r.msg.Model).Str("engine", r.msg.Engine).Str("phase", r.msg.Phase).
				Int("strikes", r.msg.Strikes).Msg("penalty phase changed")
		}
		r.msg.Time = time.Now().UnixMilli()
		data, err := messages.Encode(r.msg)
		if err != nil {
			s.log.Error().Err(err).Str("key", r.key).Msg("penalty record does not encode")
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, s.opts.LeaseTTL/3)
		_, err = kv.Put(pctx, r.key, data)
		cancel()
		if err != nil {
			if s.badLog.Allow("penalty/"+r.key, time.Now()) {
				s.log.Warn().Err(err).Str("key", r.key).Msg("cannot write penalty record; will retry")
			}
			continue
		}
		s.written[r.key] = sig
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// healthOf returns the health the problem uses for an engine of model
// before its penalty and slow start (the reported health, with the stale
// factor unless routers' outcomes show it serving, and operator
// overrides), the penalty's multiplier (1 when none is
// in force, or an operator pinned the health), and whether the engine is
// kept out. Callers hold s.mu.
func (s *Service) healthOf(model, key string, st *messages.EngineState, now time.Time) (health, penalty float64, excluded bool) {
	health = st.Health
	if st.Status == messages.StatusStale && !st.ServedOnOutcomes(now, s.opts.Penalties.EvidenceMaxAge) {
		health *= optimizer.StaleHealthFactor
	}
	if op := s.operatorFor(model, st.Engine); op != nil {
		switch op.Action {
		case messages.ActionDrain, messages.ActionCordon:
			return 0, 1, true
		case messages.ActionHealth:
			return health * op.Health, 1, false // pinned: replaces any penalty
		}
	}
	penalty = 1
	if !s.opts.Penalties.Off {
		penalty = s.pens[key].multiplier(now, s.opts.Penalties.RecoveryFloor)
	}
	return health, penalty, false
}

// restoreOperators writes back, as leader, the operator records the
// engines bucket lost when it was deleted and re-created. It creates each
// key only if absent, so that a record an operator wrote since wins.
func (s *Service) restoreOperators(ctx context.Context, kv jetstream.KeyValue) {
	if !s.Leader() {
		return
	}
	s.mu.Lock()
	ops := make(map[string]messages.Operator, len(s.restore))
	for k, op := range s.restore {
		ops[k] = *op
	}
	s.mu.Unlock()
	for key, op := range ops {
		data, err := messages.Encode(&op)
		if err == nil {
			cctx, cancel := context.WithTimeout(ctx, s.opts.LeaseTTL/3)
			_, err = kv.Create(cctx, key, data)
			cancel()
		}
		if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			if s.badLog.Allow("restore/"+key, time.Now()) {
				s.log.Warn().Err(err).Str("key", key).Msg("cannot write back an operator record the engines bucket lost; will retry")
			}
			continue
		}
		s.mu.Lock()
		delete(s.restore, key)
		s.mu.Unlock()
		s.log.Warn().Str("engine", op.Engine).Str("action", op.Action).Msg("operator record written back into the re-created engines bucket")
	}
}
