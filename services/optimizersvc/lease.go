package optimizersvc

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// leaseLoop takes part in the leader election until ctx is done: as follower
// it tries to create the lease key, as leader it renews it every LeaseTTL/3.
// On return it gives up leadership and, if it held the lease, deletes it so
// that another instance can take over at once.
func (s *Service) leaseLoop(ctx context.Context, kv jetstream.KeyValue) {
	period := s.opts.LeaseTTL / 3
	var rev uint64
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			if s.leader.Load() {
				s.lose("stopping")
				rctx, cancel := context.WithTimeout(context.Background(), period)
				if err := kv.Delete(rctx, LeaseKey, jetstream.LastRevision(rev)); err != nil {
					s.log.Debug().Err(err).Msg("release lease")
				}
				cancel()
			}
			return
		case <-timer.C:
		}
		wait := period
		if s.leader.Load() {
			var err error
			if rev, err = s.renew(ctx, kv, rev); err != nil {
				s.lose("renewal failed: " + err.Error())
			}
		} else {
			rev, wait = s.acquire(ctx, kv, period)
		}
		timer.Reset(wait)
	}
}

// renew extends the lease held at revision rev and returns its new revision.
func (s *Service) renew(ctx context.Context, kv jetstream.KeyValue, rev uint64) (uint64, error) {
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, s.opts.LeaseTTL/3)
	defer cancel()
	nrev, err := kv.Update(rctx, LeaseKey, []byte(s.opts.Instance), rev)
	if err != nil {
		return rev, err
	}
	s.extend(start)
	return nrev, nil
}

// acquire tries to take the lease. It returns the lease's revision (when it
// became leader) and how long to wait before the next attempt: period, or less
// when the holder's lease is due to expire sooner.
func (s *Service) acquire(ctx context.Context, kv jetstream.KeyValue, period time.Duration) (uint64, time.Duration) {
	start := time.Now()
	actx, cancel := context.WithTimeout(ctx, period)
	defer cancel()
	rev, err := kv.Create(actx, LeaseKey, []byte(s.opts.Instance))
	if err == nil {
		s.gain(start, rev)
		return rev, period
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		if ctx.Err() == nil {
			s.log.Debug().Err(err).Msg("lease: create failed")
		}
		return 0, period
	}
	e, err := kv.Get(actx, LeaseKey)
	if err != nil {
		return 0, 10 * time.Millisecond // expired between Create and Get: try again soon
	}
	if string(e.Value()) == s.opts.Instance {
		// Our own lease, from before a failed renewal: take it back.
		if rev, err := kv.Update(actx, LeaseKey, []byte(s.opts.Instance), e.Revision()); err == nil {
			s.gain(start, rev)
			return rev, period
		}
		return 0, period
	}
	// The bucket's TTL removes an unrenewed lease only some time after it
	// expires (the server checks ages at most every 250 ms): take over a lease
	// whose last renewal is older than the TTL at once, by compare-and-set on
	// the revision seen, so that a holder renewing at the same moment wins.
	until := time.Until(e.Created().Add(s.opts.LeaseTTL))
	if until <= 0 {
		if rev, err := kv.Update(actx, LeaseKey, []byte(s.opts.Instance), e.Revision()); err == nil {
			s.log.Info().Str("holder", string(e.Value())).Time("renewed", e.Created()).Msg("taking over an expired lease")
			s.gain(start, rev)
			return rev, period
		}
		return 0, 10 * time.Millisecond
	}
	// Try again just after the holder's lease is due to expire, if that is sooner.
	if until+5*time.Millisecond < period {
		return 0, until + 5*time.Millisecond
	}
	return 0, period
}

// extend records a successful lease write started at start: writes are
// allowed until start + 90% of the TTL.
func (s *Service) extend(start time.Time) {
	s.leaseMu.Lock()
	s.leaseUntil = start.Add(s.opts.LeaseTTL * 9 / 10)
	s.leaseMu.Unlock()
}

// gain makes this instance the leader.
func (s *Service) gain(start time.Time, rev uint64) {
	s.extend(start)
	s.leader.Store(true)
	s.metrics.leader.Set(1)
	s.log.Info().Uint64("lease_revision", rev).Msg("leadership acquired")
	select {
	case s.gained <- struct{}{}:
	default:
	}
}

// lose stops this instance writing at once.
func (s *Service) lose(reason string) {
	s.leader.Store(false)
	s.leaseMu.Lock()
	s.leaseUntil = time.Time{}
	s.leaseMu.Unlock()
	s.metrics.leader.Set(0)
	s.log.Info().Str("reason", reason).Msg("leadership lost")
}
