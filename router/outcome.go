package router

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/upstream"
)

type nopObserver struct{}

func (nopObserver) Request(string)                          {}
func (nopObserver) Outcome(string, string, control.Outcome) {}

// classifyForwardError maps a Transport.Forward error to a Result.
func classifyForwardError(ctx context.Context, err error) control.Result {
	if ctx.Err() != nil {
		return control.ResultCanceled
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, upstream.ErrFirstReplyTimeout) ||
		errors.Is(err, nats.ErrTimeout) || (errors.As(err, &ne) && ne.Timeout()) {
		return control.ResultTimeout
	}
	return control.ResultConnect
}

// responseOutcome classifies an engine response and its relay: an error
// status by StatusResult, a successful one by how its relay ended.
func responseOutcome(ctx context.Context, status int, relayErr error, start, first, end time.Time) control.Outcome {
	o := control.Outcome{Latency: end.Sub(start)}
	if !first.IsZero() {
		o.TTFT = first.Sub(start)
	}
	if r := control.StatusResult(status); r != control.ResultOK {
		o.Result = r
		return o
	}
	switch {
	case relayErr != nil && ctx.Err() != nil:
		o.Result = control.ResultCanceled
	case relayErr != nil:
		var ne net.Error
		if errors.As(relayErr, &ne) && ne.Timeout() || errors.Is(relayErr, context.DeadlineExceeded) {
			o.Result = control.ResultTimeout
		} else {
			o.Result = control.ResultOther
		}
	}
	return o
}
