package upstream

import (
	"context"
	"io"
)

// CloseStopper ends a CloseOnCancel watch: StopClose reports whether the
// connection was still open (the context had not ended), as the stop
// function of context.AfterFunc does.
type CloseStopper interface{ StopClose() bool }

// CloseHook is a context that closes a connection itself when it ends, so
// that a transport's watch of a request's context costs no goroutine and
// no allocation (the router's request contexts implement it).
// CloseOnCancel takes conn to close when the context ends, or closes it at
// once and returns Stopped when it already ended; it returns false when it
// cannot take conn, and the transport watches the context with
// context.AfterFunc instead.
type CloseHook interface {
	CloseOnCancel(conn io.Closer) (CloseStopper, bool)
}

// afterStop is the stop function of a context.AfterFunc as a CloseStopper.
type afterStop func() bool

func (f afterStop) StopClose() bool { return f() }

// Stopped is the CloseStopper of a context that had already ended: its
// connection is closed, and StopClose reports false.
var Stopped CloseStopper = afterStop(func() bool { return false })

// CloseOnCancel closes conn when ctx ends, until the returned watch is
// stopped; on a CloseHook that can take conn, without allocating.
func CloseOnCancel(ctx context.Context, conn io.Closer) CloseStopper {
	if c, ok := ctx.(CloseHook); ok {
		if s, ok := c.CloseOnCancel(conn); ok {
			return s
		}
	}
	return afterStop(context.AfterFunc(ctx, func() { _ = conn.Close() }))
}
