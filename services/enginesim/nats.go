package enginesim

import (
	"context"
	"errors"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-dev/switchyard/messages"
)

// serveNATS answers one inference request received over NATS: a streamed
// request gets a reply message per batch of new tokens and a closing one with
// messages.HeaderLast; a plain request gets one reply. Every reply carries
// messages.HeaderStatus. A crashed or hanging engine sends nothing.
func (e *Engine) serveNATS(m *nats.Msg) {
	if m.Reply == "" {
		return // a publish, not a request: nobody to answer
	}
	ctx, cancel := context.WithTimeout(e.baseCtx, e.opts.NATSTimeout)
	defer cancel()
	reply := func(status int, last bool, body []byte) error {
		out := nats.NewMsg(m.Reply)
		out.Header.Set(messages.HeaderStatus, strconv.Itoa(status))
		out.Header.Set(messages.NATSHeaderEngine, e.opts.Name)
		if last {
			out.Header.Set(messages.HeaderLast, "true")
		}
		out.Data = body
		return e.opts.Conn.PublishMsg(out)
	}
	fail := func(a *apiError) { _ = reply(a.Status, true, a.body()) }
	// A request whose handling panics is answered 500 (after any part of
	// the answer already sent), and the engine goes on serving the others.
	defer e.poison.Recover("nats", m.Subject, func() {
		fail(&apiError{Status: 500, Type: "server_error", Code: "internal_error", Message: "the engine failed serving this request"})
	})

	j := e.parse(endpointOf(m.Data), m.Data)
	r, err := e.admit(ctx, j)
	if err != nil {
		var a *apiError
		if errors.As(err, &a) {
			fail(a)
		}
		return
	}
	if !j.stream {
		err := e.wait(ctx, r, nil)
		e.outcome(err)
		switch {
		case err == nil:
			_ = reply(200, true, j.full(j.maxOut))
		case errors.Is(err, errClosing):
			fail(errUnavailable("engine " + e.opts.Name + " is shutting down"))
		case errors.Is(err, context.DeadlineExceeded):
			fail(&apiError{Status: 504, Type: "server_error", Code: "timeout", Message: "request exceeded the engine's NATS timeout of " + e.opts.NATSTimeout.String()})
		}
		return
	}
	err = e.wait(ctx, r, func(from, to int) error { return reply(200, false, j.chunk(from, to, "", nil)) })
	e.outcome(err)
	switch {
	case err == nil:
		_ = reply(200, true, j.chunk(j.maxOut, j.maxOut, j.finishReason(), j.usage(j.maxOut)))
	case errors.Is(err, errClosing):
		fail(errUnavailable("engine " + e.opts.Name + " is shutting down"))
	case errors.Is(err, context.DeadlineExceeded):
		fail(&apiError{Status: 504, Type: "server_error", Code: "timeout", Message: "request exceeded the engine's NATS timeout of " + e.opts.NATSTimeout.String()})
	}
}
