// Package netem emulates the network between a router and its engines
// where there is none to speak of (one machine, one container network), for
// stacks that must show cross-region latency: a test and demo concern kept
// out of the router library, which takes it through
// router.ServiceOptions.WrapTransport.
package netem

import (
	"context"
	"time"

	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/router/upstream"
)

// DelayTransport emulates the network between a frontend cluster and its
// engines where there is none to speak of (one machine, one container
// network): it waits Delay(engine) — the one-way latency — before forwarding
// a request and again before handing back the response, so that every
// request takes one emulated round trip longer, as it would across regions.
// Streamed tokens that follow arrive shifted by the same one-way delay, which
// is what a real network does to them.
type DelayTransport struct {
	// Next forwards the request.
	Next upstream.Transport
	// Delay returns the one-way latency to the named engine (0: none).
	Delay func(engine string) time.Duration
}

// Forward waits, forwards through Next, and waits again.
func (d *DelayTransport) Forward(ctx context.Context, engine selection.Engine, req *upstream.Request) (*upstream.Response, error) {
	wait := d.Delay(engine.Name)
	if err := sleepCtx(ctx, wait); err != nil {
		return nil, err
	}
	resp, err := d.Next.Forward(ctx, engine, req)
	if err != nil {
		return nil, err
	}
	if err := sleepCtx(ctx, wait); err != nil {
		_ = resp.Body.Close()
		return nil, err
	}
	return resp, nil
}

// sleepCtx waits d, or returns ctx's error if it ends first.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Wrap returns the router.ServiceOptions.WrapTransport that delays every
// request to an engine by delay(engine) each way, or nil when delay is nil.
func Wrap(delay func(engine string) time.Duration) func(upstream.Transport) upstream.Transport {
	if delay == nil {
		return nil
	}
	return func(next upstream.Transport) upstream.Transport { return &DelayTransport{Next: next, Delay: delay} }
}
