package live

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard-dev/switchyard/router/control"
)

// Defaults of EjectOptions.
const (
	DefaultEjectAfter      = 3
	DefaultEjectBackoff    = time.Second
	DefaultEjectMaxBackoff = 30 * time.Second
)

// EjectOptions tunes the router's fast local skip of failing engines. The
// zero value selects the defaults.
type EjectOptions struct {
	// After is how many consecutive failed attempts (connect error, 5xx,
	// timeout, a stream broken by the engine) eject an engine (default
	// DefaultEjectAfter). A negative value disables ejection.
	After int
	// Backoff is the first ejection's length (default DefaultEjectBackoff).
	// It doubles each time the half-open probe fails, up to MaxBackoff, and
	// resets when the engine succeeds.
	Backoff time.Duration
	// MaxBackoff caps the ejection length (default DefaultEjectMaxBackoff).
	MaxBackoff time.Duration
}

func (o EjectOptions) withDefaults() EjectOptions {
	if o.After == 0 {
		o.After = DefaultEjectAfter
	}
	if o.Backoff <= 0 {
		o.Backoff = DefaultEjectBackoff
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = DefaultEjectMaxBackoff
	}
	if o.MaxBackoff < o.Backoff {
		o.MaxBackoff = o.Backoff
	}
	return o
}

// ejectState is one engine's ejection state at one router. ejected and
// until are read lock-free on every Pick; the rest changes under mu.
//
// States: serving (not ejected); ejected (now < until: skipped); half-open
// (now ≥ until: one attempt, the probe, may go through; further ones are
// skipped while it runs). The probe's success restores the engine; its
// failure ejects it again for twice as long.
type ejectState struct {
	ejected atomic.Bool
	until   atomic.Int64 // Unix ns
	probing atomic.Bool

	mu    sync.Mutex
	fails int // consecutive failed attempts
	level int // ejections since the last success
}

// skipped reports whether Pick must skip the engine at now.
func (e *ejectState) skipped(now func() time.Time) bool {
	if !e.ejected.Load() {
		return false
	}
	return now().UnixNano() < e.until.Load() || e.probing.Load()
}

// claim is called when an attempt is about to go to the engine. It reports
// whether the attempt may go (false: ejected, or half-open with its probe
// taken) and whether it is the half-open probe.
func (e *ejectState) claim(now time.Time) (ok, probe bool) {
	if !e.ejected.Load() {
		return true, false
	}
	if now.UnixNano() < e.until.Load() {
		return false, false
	}
	if !e.probing.CompareAndSwap(false, true) {
		return false, false
	}
	return true, true
}

// EjectChange is a change of an engine's ejection state, for the logs and
// the gauge.
type EjectChange uint8

// Ejection changes.
const (
	// EjectNone: no change.
	EjectNone EjectChange = iota
	// EjectStart: the engine is ejected after consecutive failures.
	EjectStart
	// EjectAgain: the half-open probe failed; ejected again for longer.
	EjectAgain
	// EjectRestored: the engine succeeded and serves again.
	EjectRestored
)

// Claim is called when an attempt is about to go to the engine at now. It
// reports whether the attempt may go (false: ejected, or half-open with its
// probe taken) and whether it is the half-open probe.
func (e *EngineLive) Claim(now time.Time) (ok, probe bool) { return e.eject.claim(now) }

// ReleaseProbe gives back the half-open probe Claim granted to an attempt
// that never reached the engine (no transport to it), so that the next
// attempt may probe it.
func (e *EngineLive) ReleaseProbe() { e.eject.probing.Store(false) }

// Report folds the result res of an attempt (the half-open probe when
// probe) into the engine's ejection state at now, under o (zero fields:
// the defaults), as the router does after every attempt, and returns the
// change with the ejection length and the consecutive failures. A result
// that does not blame the engine (Result.Blames) other than a success is
// neutral: a 429, a cancelled request and a client error leave the
// consecutive failures as they are, except that a half-open probe the
// engine answered with a client error restores it (it is up and parsing
// requests).
func (e *EngineLive) Report(res control.Result, probe bool, now time.Time, o EjectOptions) (EjectChange, time.Duration, int) {
	ok := res == control.ResultOK || (res == control.ResultClient && probe)
	if !ok && !res.Blames() {
		if probe {
			e.eject.probing.Store(false)
		}
		return EjectNone, 0, 0
	}
	if ok {
		e.lastOK.Store(now.UnixNano())
	}
	return e.eject.report(ok, probe, now, o.withDefaults())
}

// report records an attempt's result and returns the state change with
// the current ejection length and failure count. Neutral results (a
// cancelled request, a 429, a client error) do not come here.
func (e *ejectState) report(ok, probe bool, now time.Time, o EjectOptions) (EjectChange, time.Duration, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ok {
		e.fails, e.level = 0, 0
		if e.ejected.Load() {
			e.probing.Store(false)
			e.ejected.Store(false)
			return EjectRestored, 0, 0
		}
		return EjectNone, 0, 0
	}
	e.fails++
	if o.After < 0 {
		return EjectNone, 0, e.fails
	}
	if e.ejected.Load() {
		if !probe {
			return EjectNone, 0, e.fails // an attempt sent before the ejection
		}
		e.level++
		d := e.backoffLocked(o)
		e.until.Store(now.Add(d).UnixNano())
		e.probing.Store(false)
		return EjectAgain, d, e.fails
	}
	if e.fails < o.After {
		return EjectNone, 0, e.fails
	}
	d := e.backoffLocked(o)
	e.until.Store(now.Add(d).UnixNano())
	e.probing.Store(false)
	e.ejected.Store(true)
	return EjectStart, d, e.fails
}

func (e *ejectState) backoffLocked(o EjectOptions) time.Duration {
	d := o.Backoff
	for i := 0; i < e.level && d < o.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, o.MaxBackoff)
}
