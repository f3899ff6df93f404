package optimizersvc

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-dev/switchyard/internal/poison"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/optimizer"
	"github.com/switchyard-dev/switchyard/plan"
	"github.com/switchyard-dev/switchyard/streams"
)

// bad counts and logs (at a bounded rate, per key and in total) a state
// value that failed to decode or validate; the value is skipped.
func (s *Service) bad(bucket, key string, err error) {
	reason := poison.Reason(err)
	s.metrics.bad.WithLabelValues(bucket, reason).Inc()
	s.poison.Log(bucket+"/"+key).Err(err).Str("bucket", bucket).Str("key", key).Str("reason", reason).
		Msg("bad state value ignored (logged at a bounded rate)")
}

// guarded wraps a watch's entry handler: a panic on one value is
// recovered, counted (reason panic) and logged, and the value skipped, so
// that a poison value cannot crash the service — at start-up, when the
// watch delivers the bucket's current values, least of all.
func (s *Service) guarded(bucket string, handle func(jetstream.KeyValueEntry)) func(jetstream.KeyValueEntry) {
	return func(e jetstream.KeyValueEntry) {
		defer s.poison.Recover(bucket, bucket+"/"+e.Key(), func() {
			s.metrics.bad.WithLabelValues(bucket, poison.ReasonPanic).Inc()
		})
		if s.opts.OnValue != nil {
			s.opts.OnValue(bucket, e.Key(), e.Value())
		}
		handle(e)
	}
}

func deleted(e jetstream.KeyValueEntry) bool {
	return e.Operation() == jetstream.KeyValueDelete || e.Operation() == jetstream.KeyValuePurge
}

// handleEngine folds one sy_engines entry into the state.
func (s *Service) handleEngine(e jetstream.KeyValueEntry) {
	key := e.Key()
	if deleted(e) {
		if s.forgetOther(key) {
			return
		}
		s.mu.Lock()
		_, had := s.engines[key]
		delete(s.engines, key)
		delete(s.fits, key)
		s.mu.Unlock()
		if had {
			s.notify()
		}
		return
	}
	if s.handleOther(key, e.Value()) {
		return
	}
	var st messages.EngineState
	if err := messages.DecodeIntoAt(e.Value(), &st, s.opts.Now()); err != nil {
		s.bad(s.opts.Names.EnginesBucket, key, err)
		return
	}
	if model, engine, ok := streams.SplitKey(key); !ok || model != st.Model || engine != st.Engine {
		s.bad(s.opts.Names.EnginesBucket, key, fmt.Errorf("%w: state of %s.%s stored under key %q", messages.ErrInvalid, st.Model, st.Engine, key))
		return
	}
	func() {
		s.mu.Lock()
		defer s.mu.Unlock() // deferred: a panic while fitting must not leave it locked
		s.engines[key] = &st
		delete(s.carried, "e/"+key)
		f := s.fits[key]
		if f == nil {
			f = optimizer.NewBaseFit(optimizer.FitOptions{})
			s.fits[key] = f
		}
		f.Add(plan.FitSample(&st), plan.FitPrior(&st, s.opts.PriorBaseMs))
	}()
	s.notify()
}

// handleDemand folds one sy_demand entry (demand or RTT) into the state.
func (s *Service) handleDemand(e jetstream.KeyValueEntry) {
	key := e.Key()
	rttKey, isRTT := streams.CutRTTKey(key)
	if deleted(e) {
		s.mu.Lock()
		if isRTT {
			delete(s.rtt, rttKey)
		} else {
			delete(s.demand, key)
		}
		s.mu.Unlock()
		s.notify()
		return
	}
	now := s.opts.Now()
	if isRTT {
		var st messages.RTTState
		if err := messages.DecodeIntoAt(e.Value(), &st, now); err != nil {
			s.bad(s.opts.Names.DemandBucket, key, err)
			return
		}
		if cluster, engine, ok := streams.SplitNames(rttKey); !ok || cluster != st.Cluster || engine != st.Engine {
			s.bad(s.opts.Names.DemandBucket, key, fmt.Errorf("%w: RTT of %s.%s stored under key %q", messages.ErrInvalid, st.Cluster, st.Engine, key))
			return
		}
		rtt := st.RTTMs.Slow
		if rtt <= 0 {
			rtt = st.RTTMs.Fast
		}
		s.mu.Lock()
		s.rtt[rttKey] = rtt / 2
		delete(s.carried, "r/"+rttKey)
		s.mu.Unlock()
		s.notify()
		return
	}
	var st messages.DemandState
	if err := messages.DecodeIntoAt(e.Value(), &st, now); err != nil {
		s.bad(s.opts.Names.DemandBucket, key, err)
		return
	}
	if model, cluster, ok := streams.SplitKey(key); !ok || model != st.Model || cluster != st.Cluster {
		s.bad(s.opts.Names.DemandBucket, key, fmt.Errorf("%w: demand of %s.%s stored under key %q", messages.ErrInvalid, st.Model, st.Cluster, key))
		return
	}
	s.mu.Lock()
	s.demand[key] = &st
	delete(s.carried, "d/"+key)
	s.mu.Unlock()
	s.notify()
}

// carryGrace is how long, after its bucket was deleted and re-created,
// the service keeps the state it held that the new bucket does not hold
// (yet): the aggregator writes everything it holds into a re-created bucket
// within about a second of noticing (its consumer checks run every second),
// and until then the old state plans better than none, which would shed
// the traffic of every engine not written back yet.
const carryGrace = 10 * time.Second

// sweepEngines drops engine states not seen by a restarted watcher. After
// the bucket was replaced (deleted and re-created) it drops nothing at once:
// engine states are carried for carryGrace (see dropCarried), and operator
// records are kept and written back by the leader (see restoreOperators),
// so that a deleted bucket neither sheds traffic nor undoes a drain.
func (s *Service) sweepEngines(seen map[string]bool) {
	replaced := s.enginesReplaced.Swap(false)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for k := range s.engines {
		if !seen[k] {
			if replaced {
				s.carried["e/"+k] = now
				continue
			}
			delete(s.engines, k)
			delete(s.fits, k)
		}
	}
	for k, op := range s.operators {
		if !seen[k] {
			if replaced {
				s.restore[k] = op
				continue
			}
			delete(s.operators, k)
		}
	}
}

// sweepDemand drops demand and RTT states not seen by a restarted watcher;
// after the bucket was replaced, it carries them for carryGrace instead.
func (s *Service) sweepDemand(seen map[string]bool) {
	replaced := s.demandReplaced.Swap(false)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for k := range s.demand {
		if !seen[k] {
			if replaced {
				s.carried["d/"+k] = now
				continue
			}
			delete(s.demand, k)
		}
	}
	for k := range s.rtt {
		if !seen[streams.RTTPrefix+k] {
			if replaced {
				s.carried["r/"+k] = now
				continue
			}
			delete(s.rtt, k)
		}
	}
}

// dropCarriedLocked drops the carried states that were not written back within
// carryGrace. Callers hold s.mu.
func (s *Service) dropCarriedLocked(now time.Time) {
	for k, since := range s.carried {
		if now.Sub(since) < carryGrace {
			continue
		}
		delete(s.carried, k)
		switch kind, key := k[:2], k[2:]; kind {
		case "e/":
			delete(s.engines, key)
			delete(s.fits, key)
		case "d/":
			delete(s.demand, key)
		case "r/":
			delete(s.rtt, key)
		}
	}
}
