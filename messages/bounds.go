package messages

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Bounds on values a writer could otherwise use to wedge or mislead the
// services that read them. Each is far beyond what an honest engine, router or
// optimizer produces, so that only broken clocks and forged values meet them.
const (
	// EpochMs (2020-01-01T00:00:00Z, Unix ms) is the earliest timestamp any
	// message may carry: no Switchyard message was written before it, so an
	// earlier time is an unset clock (a machine booted without a real-time
	// clock reads 1970) or a forged value. It is also the origin of snapshot
	// generations (GenerationCeiling).
	EpochMs int64 = 1_577_836_800_000

	// MaxMessageAge is how old a signal or a report may be before it is
	// rejected (with ErrExpired), like one from the future. It is the default
	// MaxAge of SY_SIGNALS: nothing older is still news about the present —
	// the aggregator's slowest window (30 s half-life) would give it a weight
	// below 2^-10 — and a sender whose clock lags by more is broken.
	MaxMessageAge = 5 * time.Minute

	// MinReportInterval is the shortest report interval accepted, seconds.
	// Routers report every second by default; an interval of 10 ms or less
	// makes a rate out of too few requests to mean anything, and an interval
	// near zero makes any count an infinite rate.
	MinReportInterval = 0.01

	// MaxRouterRate bounds every rate a report implies (a count over the
	// report's interval), req/s: a million requests a second is beyond any
	// one router process, two orders of magnitude above what a proxy core
	// forwards.
	MaxRouterRate = 1e6

	// MaxPenaltySpan bounds how long a penalty record may keep an engine
	// penalised, and how long its recovery may last: a day, far above the
	// optimizer's longest penalty (PenaltyOptions.Max, 5 minutes by
	// default) and its slow start. A record claiming longer would keep an
	// engine out for good once adopted.
	MaxPenaltySpan = 24 * time.Hour

	// MaxRate bounds every rate in a message and in the state the services
	// write (capacity, load, demand summed over a cluster's routers), req/s.
	MaxRate = maxRate
)

// Sentinel errors for timestamps and generations outside the window a reader
// accepts. Validate wraps them together with ErrInvalid, so errors.Is matches
// both.
var (
	// ErrFuture means a timestamp more than MaxFutureSkew ahead of the
	// reader's clock, or a snapshot generation above GenerationCeiling.
	ErrFuture = errors.New("messages: from the future")
	// ErrExpired means a signal or report older than MaxMessageAge; every
	// other field of the message is valid (the age is checked last).
	ErrExpired = errors.New("messages: expired")
)

// GenerationCeiling returns the highest weight-snapshot generation a reader
// with clock now accepts: the milliseconds from EpochMs to now, plus
// MaxFutureSkew in milliseconds.
//
// The rule: an honest writer (the optimizer service, NextGeneration) writes
// generation max(previous+1, milliseconds since EpochMs by its clock), so
// generations rise by at least one per write and follow the clock when writes
// are less frequent than one per millisecond (the optimizer writes a key at
// most a few times a second). A generation above the ceiling could only come
// from a writer whose clock is more than MaxFutureSkew ahead — the skew
// allowed for timestamps — or from a forged value; readers ignore it. Since
// every accepted generation is at most MaxFutureSkew ahead of the clock, a
// writer can always follow any generation it finds (NextGeneration never
// overflows and stays acceptable within MaxFutureSkew), and no value written
// once can stop routers from installing the next honest snapshot.
func GenerationCeiling(now time.Time) uint64 {
	return clockGeneration(now) + uint64(MaxFutureSkew/time.Millisecond)
}

// clockGeneration is the milliseconds from EpochMs to now, 0 before EpochMs.
func clockGeneration(now time.Time) uint64 {
	ms := now.UnixMilli() - EpochMs
	if ms < 0 {
		return 0
	}
	return uint64(ms)
}

// NextGeneration returns the generation a writer with clock now gives the
// snapshot that follows one of generation prev: max(prev+1, milliseconds
// since EpochMs). ok is false when that is above GenerationCeiling(now): prev
// was not itself acceptable (callers treat the stored value as corrupt and
// continue from what they know), or writes came faster than one per
// millisecond for MaxFutureSkew; the result is then not to be written.
func NextGeneration(prev uint64, now time.Time) (gen uint64, ok bool) {
	ceiling := GenerationCeiling(now)
	if prev >= ceiling {
		return 0, false
	}
	return max(prev+1, clockGeneration(now)), true
}

// failWith records an error that wraps ErrInvalid and sentinel.
func (c *checker) failWith(sentinel error, field string, format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("%w: %s.%s %s (%w)", ErrInvalid, c.kind, field, fmt.Sprintf(format, args...), sentinel)
	}
}

// fresh checks, once every other field passed, that a signal's or report's
// time is at most MaxMessageAge old.
func (c *checker) fresh(field string, ms int64, now time.Time) {
	if c.err != nil {
		return
	}
	if limit := now.Add(-MaxMessageAge).UnixMilli(); ms < limit {
		c.failWith(ErrExpired, field, "is %s, more than %s before %s", fmtMs(ms), MaxMessageAge, fmtMs(now.UnixMilli()))
	}
}

// rate checks that count over interval seconds is at most MaxRouterRate.
func (c *checker) rate(field string, count int64, interval float64) {
	if interval <= 0 || count <= 0 {
		return
	}
	if r := float64(count) / interval; r > MaxRouterRate || math.IsInf(r, 0) {
		c.fail(field, "is %d in %v s, %.4g/s, want at most %g/s", count, interval, r, MaxRouterRate)
	}
}

func fmtMs(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano) }
