package router

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/router/upstream"
)

// closeCount is an io.Closer that counts its Close calls.
type closeCount struct{ n atomic.Int32 }

func (c *closeCount) Close() error { c.n.Add(1); return nil }

func waitDone(t *testing.T, ctx context.Context, what string) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: context not done", what)
	}
}

func TestHookCtxRootCancelEndsAttemptAndClosesConn(t *testing.T) {
	root := newRootCtx()
	a := newAttemptCtx(root, time.Hour)
	conn := &closeCount{}
	stop := upstream.CloseOnCancel(a, conn)
	if a.Err() != nil || root.Err() != nil {
		t.Fatal("ended before cancel")
	}
	root.cancel()
	waitDone(t, a, "attempt")
	if a.Err() != context.Canceled || root.Err() != context.Canceled {
		t.Fatalf("errs %v %v, want canceled", a.Err(), root.Err())
	}
	if conn.n.Load() != 1 {
		t.Fatalf("conn closed %d times, want 1", conn.n.Load())
	}
	if stop.StopClose() {
		t.Fatal("StopClose after the end reported live")
	}
	if a.timedOut() {
		t.Fatal("timedOut after a cancel")
	}
	root.cancel() // idempotent
	if conn.n.Load() != 1 {
		t.Fatal("conn closed again")
	}
}

func TestHookCtxTimerEndsOnlyTheAttempt(t *testing.T) {
	root := newRootCtx()
	a := newAttemptCtx(root, 10*time.Millisecond)
	conn := &closeCount{}
	upstream.CloseOnCancel(a, conn)
	waitDone(t, a, "attempt")
	if !a.timedOut() || !a.timerFired() {
		t.Fatal("timer end not reported")
	}
	if root.Err() != nil {
		t.Fatal("the attempt's timer ended the request")
	}
	// The timer's goroutine closes the conn right after Done.
	for deadline := time.Now().Add(5 * time.Second); conn.n.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if conn.n.Load() != 1 {
		t.Fatalf("conn closed %d times, want 1", conn.n.Load())
	}
	// The next attempt is adopted again and ends with the request.
	b := newAttemptCtx(root, time.Hour)
	root.cancel()
	waitDone(t, b, "second attempt")
	if b.timedOut() {
		t.Fatal("second attempt reported a timeout")
	}
}

func TestHookCtxStopCloseKeepsConn(t *testing.T) {
	root := newRootCtx()
	a := newAttemptCtx(root, time.Hour)
	conn := &closeCount{}
	stop := upstream.CloseOnCancel(a, conn)
	if !stop.StopClose() {
		t.Fatal("StopClose on a live context reported ended")
	}
	a.cancel()
	if conn.n.Load() != 0 {
		t.Fatal("a stopped watch closed the conn")
	}
	if root.Err() != nil {
		t.Fatal("an attempt's cancel ended the request")
	}
	// Given to an ended context, a conn is closed at once.
	late := &closeCount{}
	if upstream.CloseOnCancel(a, late).StopClose() || late.n.Load() != 1 {
		t.Fatal("conn given to an ended context not closed at once")
	}
}

func TestHookCtxGeneralPaths(t *testing.T) {
	// Two attempts at once on one root: the second watches the root in
	// general and still ends with it.
	root := newRootCtx()
	a := newAttemptCtx(root, time.Hour)
	b := newAttemptCtx(root, time.Hour)
	// A second connection on one attempt, AfterFunc, and a standard child.
	c1, c2 := &closeCount{}, &closeCount{}
	upstream.CloseOnCancel(b, c1)
	upstream.CloseOnCancel(b, c2)
	var ran atomic.Bool
	stopped := b.AfterFunc(func() { t.Error("stopped AfterFunc ran") })
	context.AfterFunc(b, func() { ran.Store(true) })
	std, stdCancel := context.WithCancel(b)
	defer stdCancel()
	if !stopped() {
		t.Fatal("stop of a pending AfterFunc reported not stopped")
	}
	root.cancel()
	waitDone(t, a, "first attempt")
	waitDone(t, b, "second attempt")
	waitDone(t, std, "standard child")
	deadline := time.Now().Add(5 * time.Second)
	for (!ran.Load() || c2.n.Load() != 1) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if !ran.Load() || c1.n.Load() != 1 || c2.n.Load() != 1 {
		t.Fatalf("after the end: AfterFunc ran %v, conns closed %d %d", ran.Load(), c1.n.Load(), c2.n.Load())
	}

	// A foreign parent: its end ends the attempt with its error.
	parent, cancel := context.WithTimeout(context.Background(), time.Hour)
	f := newAttemptCtx(parent, time.Hour)
	if d, ok := f.Deadline(); !ok || d.IsZero() {
		t.Fatal("the parent's deadline not passed on")
	}
	cancel()
	waitDone(t, f, "attempt of a foreign parent")
	if f.Err() != context.Canceled {
		t.Fatalf("err %v, want canceled", f.Err())
	}
	// An ended parent ends a new attempt at once.
	if g := newAttemptCtx(root, time.Hour); g.Err() == nil || g.timedOut() {
		t.Fatal("attempt of an ended root is live")
	}
}
