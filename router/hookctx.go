package router

import (
	"context"
	"io"
	"sync"
	"time"

	"github.com/switchyard-dev/switchyard/router/upstream"
)

// hookCtx is a cancelable context for the request path that costs one
// allocation where the standard library's would cost several: a request's
// context (the fasthttp front's, a root) and each forwarding attempt's
// (a child with a first-byte deadline). Instead of a children map, an
// AfterFunc registration and a timer closure per attempt, a hookCtx holds
// one child attempt and one connection to close when it ends, as direct
// fields; anything else (a second child, AfterFunc, a foreign parent)
// takes the general, allocating path and behaves as the standard
// library's contexts do.
//
// Its Err is context.Canceled when canceled by its cancel, its first-byte
// timer or a root's end (the parent's Err for a foreign parent), as the
// WithCancel it replaces; timedOut says whether the timer fired.
type hookCtx struct {
	parent context.Context // nil for a root

	mu     sync.Mutex
	done   chan struct{} // made on first Done or at cancel
	err    error
	child  *hookCtx  // a child canceled with this one
	closer io.Closer // closed when this ends (the engine connection)
	fns    []func()  // AfterFunc callbacks not yet run or stopped (nil entries: stopped)
	fired  bool      // canceled by its timer
	timer  *time.Timer
	unhook func() bool // ends the watch of a foreign parent
}

// newRootCtx returns a root hookCtx: it ends only when canceled.
func newRootCtx() *hookCtx { return &hookCtx{} }

// newAttemptCtx returns a child of parent that also ends after timeout
// (at once when timeout <= 0, as time.AfterFunc does).
func newAttemptCtx(parent context.Context, timeout time.Duration) *hookCtx {
	a := &hookCtx{parent: parent}
	if p, ok := parent.(*hookCtx); !ok || !p.adopt(a) {
		if parent.Done() != nil {
			a.unhook = context.AfterFunc(parent, func() { a.cancelWith(parent.Err(), false) })
		}
	}
	a.mu.Lock()
	if a.err == nil {
		a.timer = time.AfterFunc(timeout, a.fire)
	}
	a.mu.Unlock()
	return a
}

// adopt makes a the child canceled with c, unless c already has one (the
// caller then watches c in general); a canceled c cancels a at once.
func (c *hookCtx) adopt(a *hookCtx) bool {
	c.mu.Lock()
	if err := c.err; err != nil {
		c.mu.Unlock()
		a.cancelWith(err, false)
		return true
	}
	if c.child != nil {
		c.mu.Unlock()
		return false
	}
	c.child = a
	c.mu.Unlock()
	return true
}

// Deadline returns the parent's deadline (the first-byte timer is not one).
func (c *hookCtx) Deadline() (time.Time, bool) {
	if c.parent == nil {
		return time.Time{}, false
	}
	return c.parent.Deadline()
}

// Done returns a channel closed when the context ends.
func (c *hookCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil {
			close(c.done)
		}
	}
	return c.done
}

// Err returns nil until the context ends, then why.
func (c *hookCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Value returns the parent's value for key.
func (c *hookCtx) Value(key any) any {
	if c.parent == nil {
		return nil
	}
	return c.parent.Value(key)
}

// cancel ends the context with context.Canceled; further calls do nothing.
func (c *hookCtx) cancel() { c.cancelWith(context.Canceled, false) }

// Cancel is cancel (httpfront.Context).
func (c *hookCtx) Cancel() { c.cancel() }

// fire is the first-byte timer's end of the context.
func (c *hookCtx) fire() { c.cancelWith(context.Canceled, true) }

// timedOut stops the first-byte timer and reports whether it had fired
// (or was about to). A cancel does not stop the timer (its firing later
// changes nothing), so that timedOut tells the two apart; the attempt's
// owner calls timedOut once the attempt has an answer or failed.
func (c *hookCtx) timedOut() bool {
	if c.timer == nil {
		return false
	}
	return !c.timer.Stop() || c.timerFired()
}

// timerFired reports whether the first-byte timer ended the context.
func (c *hookCtx) timerFired() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fired
}

func (c *hookCtx) cancelWith(err error, byTimer bool) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err, c.fired = err, byTimer
	if c.done != nil {
		close(c.done)
	}
	child, closer, fns, unhook := c.child, c.closer, c.fns, c.unhook
	c.child, c.closer, c.fns = nil, nil, nil
	c.mu.Unlock()
	if unhook != nil {
		unhook()
	}
	if p, ok := c.parent.(*hookCtx); ok {
		p.release(c)
	}
	if child != nil {
		child.cancelWith(err, false)
	}
	if closer != nil {
		_ = closer.Close()
	}
	for _, f := range fns {
		if f != nil {
			go f()
		}
	}
}

// release forgets child a (ended), so that the next attempt is adopted.
func (c *hookCtx) release(a *hookCtx) {
	c.mu.Lock()
	if c.child == a {
		c.child = nil
	}
	c.mu.Unlock()
}

// AfterFunc runs f in its own goroutine once the context ends, as
// context.AfterFunc does (which uses it); stop prevents that and reports
// whether it did.
func (c *hookCtx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	i := len(c.fns)
	c.fns = append(c.fns, f)
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.err != nil || i >= len(c.fns) || c.fns[i] == nil {
			return false
		}
		c.fns[i] = nil
		return true
	}
}

// CloseOnCancel takes conn to close when c ends (upstream.CloseHook),
// without allocating: false when c already holds a connection, and the
// caller watches with context.AfterFunc instead.
func (c *hookCtx) CloseOnCancel(conn io.Closer) (upstream.CloseStopper, bool) {
	c.mu.Lock()
	switch {
	case c.err != nil:
		c.mu.Unlock()
		_ = conn.Close()
		return upstream.Stopped, true
	case c.closer == nil:
		c.closer = conn
		c.mu.Unlock()
		return c, true
	}
	c.mu.Unlock()
	return nil, false
}

// StopClose stops closing the connection given to CloseOnCancel and
// reports whether the context had not ended.
func (c *hookCtx) StopClose() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return false
	}
	c.closer = nil
	return true
}
