package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/guard"
	"github.com/switchyard-dev/switchyard/router/live"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/router/upstream"
)

// GuardObserver is an Observer that is also told about requests' priority
// classes, shed requests and retries; a Reporter implements it.
type GuardObserver interface {
	control.Observer
	// Priority counts the class of one client request (after Request).
	Priority(model string, p protocol.Priority)
	// Shed counts one shed request.
	Shed(model string, p protocol.Priority, reason guard.ShedReason)
	// Retry counts one retry attempt.
	Retry(model string)
}

// MixObserver is an Observer that is also told each client request's
// estimated prompt tokens, for the cluster's mix; a Reporter implements it.
type MixObserver interface {
	control.Observer
	// Prompt counts the prompt tokens of one client request (after Request).
	Prompt(model string, tokens int64)
}

// routed is a request the router admitted and picked a first engine for.
type routed struct {
	model    string
	table    *selection.Table
	bound    *live.Bound
	ms       *modelState
	idx      int
	key      uint64
	src      protocol.KeySource
	prio     protocol.Priority
	ep       protocol.Endpoint
	spare    []string // the snapshot's engines of weight zero, nearest first (Figures.Spare)
	fallback bool     // every engine was ejected: ejections are ignored
	aliased  bool     // the client named the model by an alias
	// req is the parsed request; ren holds its body re-written for an
	// engine's served name, made on the first attempt that needs it.
	req *protocol.Request
	ren *renamedBody
}

// renamedBody is a request body with its model field re-written to name.
type renamedBody struct {
	name string
	body []byte
}

// release ends the request's admission.
func (rt *routed) release() { rt.ms.adm.Done() }

// bodyFor returns the request body to send eng: the client's as it is when
// the client named the model by its id and the engine serves it under that
// id, else the body with its model field re-written to the engine's served
// name (the model id when the engine names none).
func (rt *routed) bodyFor(eng selection.Engine) []byte {
	want := eng.ServedModel
	if want == "" {
		want = rt.model
	}
	if want == rt.model && !rt.aliased {
		return rt.req.Body
	}
	if rt.ren == nil {
		rt.ren = &renamedBody{}
	}
	if rt.ren.body == nil || rt.ren.name != want {
		rt.ren.body = rt.req.WithModel(rt.ren.body[:0], want)
		rt.ren.name = want
	}
	return rt.ren.body
}

// shedError is the answer to a shed request.
func (h *Handler) shedError(model string, p protocol.Priority, reason guard.ShedReason, detail string) *protocol.APIError {
	h.metrics.shed.WithLabelValues(string(reason), p.String()).Inc()
	if g, ok := h.opts.Observer.(GuardObserver); ok {
		g.Shed(model, p, reason)
	}
	if reason == guard.ShedUnplanned {
		// Not an overload: the plan has no engine for this cluster.
		return protocol.NewAPIError(http.StatusTooManyRequests, protocol.ErrTypeUnavailable, "no_engine_planned", "",
			fmt.Sprintf("no engine of model %q is planned for cluster %q (%s); %s request shed; retry later", model, h.opts.Cluster, detail, p))
	}
	return protocol.NewAPIError(http.StatusTooManyRequests, protocol.ErrTypeUnavailable, "overloaded", "",
		fmt.Sprintf("model %q is overloaded; %s request shed (%s); retry later", model, p, detail))
}

// retryAfter is the Retry-After header value of shed answers.
func (h *Handler) retryAfter() string {
	return strconv.Itoa(int(math.Ceil(h.prot.RetryAfter.Seconds())))
}

// admit applies the snapshot's shed fraction and the local admission
// control to a request of class p with key on model (live.Admission.Admit),
// and returns the fleet utilisation the retry budget earns at, or a 429.
func (h *Handler) admit(model string, ms *modelState, info control.Info, bound *live.Bound, key uint64, src protocol.KeySource, p protocol.Priority) (float64, *protocol.APIError) {
	u, reason, detail := ms.adm.Admit(h.opts.Now(), info.Figures, bound, ms.recent, key, src, p)
	if reason != "" {
		return 0, h.shedError(model, p, reason, detail)
	}
	return u, nil
}

// errEngineBroke marks relay errors on the engine's side (its body failed),
// as opposed to the client's.
var errEngineBroke = errors.New("engine stream broke")

// errClientGone marks a request whose client went away during forwarding.
var errClientGone = errors.New("client went away")

// attempt is the upstream attempt a request committed to: its response
// is relayed to the client. finish must be called when the relay ends.
type attempt struct {
	idx      int
	engine   selection.Engine
	resp     *upstream.Response
	first    []byte // body bytes already read, to be relayed first
	probe    bool
	recorded bool // outcome already recorded (a failed last attempt relayed as is)
	start    time.Time
	n        int
	ctx      *hookCtx // the attempt's context, canceled by finish
	rt       *routed
}

// finish ends the attempt: closes the body and releases its context and
// in-flight count.
func (a *attempt) finish() {
	_ = a.resp.Body.Close()
	a.ctx.cancel()
	a.rt.bound.Release(a.idx)
}

// retryReason is the reason label of a retry after result r.
func retryReason(r control.Result) string {
	if r == control.ResultTimeout {
		return "timeout"
	}
	if c := r.Class(); c != "" {
		return c
	}
	return "other"
}

// FirstInHand is implemented by a response body that can tell whether its
// first byte is in hand when Forward returns (a NATS reply stream returns
// only once the first reply arrived); the retry loop then does not wait
// for it under the first-byte timeout. Any Transport's body may implement
// it.
type FirstInHand interface {
	// FirstInHand reports whether the body's first byte is in hand.
	FirstInHand() bool
}

// bodyInHand reports whether a response body's first byte is known to be
// in hand when Forward returns (see FirstInHand).
func bodyInHand(b io.Reader) bool {
	f, ok := b.(FirstInHand)
	return ok && f.FirstInHand()
}

// forward sends the request to rt's engine and, on a failure before any
// response byte is in hand, to the key's next candidates, within
// MaxAttempts and the retry budget. It returns the attempt to relay, whose
// first body bytes (read into buf) are in hand; nothing has been written
// to the client. Structurally no retry can follow a byte sent to the
// client: the caller writes only after forward returns.
func (h *Handler) forward(ctx context.Context, rt *routed, up *upstream.Request, buf []byte, log *reqLog) (*attempt, *protocol.APIError) {
	var triedBuf [8]int
	tried := triedBuf[:0]
	idx := rt.idx
	timeout := h.prot.WholeFirstByteTimeout
	if up.Stream {
		timeout = h.prot.FirstByteTimeout
	}
	for n := 1; ; n++ {
		if !rt.bound.Reachable(idx) {
			// No address since Pick (its endpoints withdrawn): another
			// engine, not counted as an attempt nor against this one.
			tried = append(tried, idx)
			next, found := h.passOver(rt, tried, idx)
			if !found {
				return nil, noEngineError(rt.model)
			}
			idx, n = next, n-1
			continue
		}
		el := rt.bound.Live(idx)
		ok, probe := el.Claim(h.opts.Now())
		if !ok && !rt.fallback {
			// Ejected (or its half-open probe taken) since Pick: another
			// engine, not counted as an attempt.
			tried = append(tried, idx)
			if next, found := h.nextCandidate(rt, tried, idx); found {
				idx, n = next, n-1
				continue
			}
		}
		eng := rt.table.Engine(idx)
		if rt.req != nil {
			up.Body = rt.bodyFor(eng)
		}
		tried = append(tried, idx)
		rt.bound.Acquire(idx)
		actx := newAttemptCtx(ctx, timeout) // ends with ctx, on cancel or after timeout
		h.metrics.attempts.Inc()
		h.amp.Add(0, 1)
		start := h.opts.Now()
		resp, err := h.opts.Transport.Forward(actx, eng, up)
		if errors.Is(err, upstream.ErrNoTransport) {
			// The router has no way to reach the engine, which says
			// nothing about the engine: another one, with no outcome,
			// ejection or retry counted.
			if probe {
				el.ReleaseProbe()
			}
			actx.cancel()
			rt.bound.Release(idx)
			next, found := h.passOver(rt, tried, idx)
			if !found {
				return nil, noEngineError(rt.model)
			}
			idx, n = next, n-1
			continue
		}
		res := control.ResultOK
		var first []byte
		switch {
		case err != nil:
			res = classifyForwardError(actx, err)
		case resp.Status >= 400:
			res = control.StatusResult(resp.Status)
		case resp.Status < 300 && !bodyInHand(resp.Body):
			k, rerr := readFirst(resp.Body, buf)
			switch {
			case k > 0:
				first = buf[:k]
			case rerr == io.EOF:
			default:
				res = control.ResultConnect // the engine closed or failed before its first byte
			}
		}
		if actx.timedOut() {
			res = control.ResultTimeout // the deadline fired; the attempt's context is gone
		}
		if ctx.Err() != nil {
			res = control.ResultCanceled
		}
		if res == control.ResultClient || res == control.ResultOther {
			// The engine answered, and the answer is about the request (a
			// client error) or not one a retry would change (another
			// 4xx): it is relayed as it is, never retried elsewhere, and
			// finishAttempt records it by the same classification.
			h.countEngine(rt, eng.Name, resp.Status)
			if res == control.ResultClient {
				h.metrics.clientErrors.WithLabelValues(rt.model, eng.Name).Inc()
			}
			if probe {
				h.ejectReport(rt.model, eng.Name, el, res, probe, nil, log)
			}
			return &attempt{idx: idx, engine: eng, resp: resp, probe: probe, start: start, n: n, ctx: actx, rt: rt}, nil
		}
		if res == control.ResultOK {
			h.countEngine(rt, eng.Name, resp.Status)
			if idx != rt.idx && rt.src != protocol.KeyNone {
				// A retry placed the key elsewhere: the engine that
				// serves it now holds its newest prefix, so the key's
				// next requests follow it there.
				rt.ms.recent.RememberName(rt.key, eng.Name)
			}
			if rt.ep == protocol.EndpointResponses {
				// The engine keeps the response it makes (and its
				// context): a request continuing it names its id as
				// previous_response_id, and goes where it was made.
				if id, ok := protocol.ResponseID(first); ok {
					rt.ms.recent.RememberName(protocol.SessionKey(id), eng.Name)
				}
			}
			// A half-open probe succeeds as soon as the engine answers, not
			// when a long stream ends; other attempts count at their end,
			// a stream the engine breaks being a failure.
			if probe {
				h.ejectReport(rt.model, eng.Name, el, control.ResultOK, probe, nil, log)
			}
			return &attempt{idx: idx, engine: eng, resp: resp, first: first, probe: probe, start: start, n: n,
				ctx: actx, rt: rt}, nil
		}
		lat := h.opts.Now().Sub(start)
		h.opts.Observer.Outcome(rt.model, eng.Name, control.Outcome{Result: res, Latency: lat})
		code := "error"
		if resp != nil {
			code = strconv.Itoa(resp.Status)
		} else if res == control.ResultTimeout {
			code = "timeout"
		}
		if res == control.ResultCanceled {
			code = "canceled"
		}
		h.metrics.engineRequests.WithLabelValues(rt.model, eng.Name, code).Inc()
		h.ejectReport(rt.model, eng.Name, el, res, probe, err, log)
		if res == control.ResultCanceled {
			if resp != nil {
				_ = resp.Body.Close()
			}
			actx.cancel()
			rt.bound.Release(idx)
			return nil, protocol.NewAPIError(http.StatusBadGateway, protocol.ErrTypeServer, "canceled", "", errClientGone.Error())
		}
		next, cause := h.retryTo(rt, tried, idx, n)
		if cause == "" {
			h.metrics.retries.WithLabelValues(retryReason(res)).Inc()
			if g, ok := h.opts.Observer.(GuardObserver); ok {
				g.Retry(rt.model)
			}
			log.Info().Str("failed_engine", eng.Name).Str("reason", retryReason(res)).Int("attempt", n+1).
				Str("retry_engine", rt.table.Engine(next).Name).Err(err).Msg("attempt failed before the first byte; retrying")
			if resp != nil {
				_ = resp.Body.Close()
			}
			actx.cancel()
			rt.bound.Release(idx)
			idx = next
			continue
		}
		h.metrics.retrySuppressed.WithLabelValues(cause).Inc()
		if resp != nil {
			// No retry: relay the engine's own answer (a 5xx or 429).
			return &attempt{idx: idx, engine: eng, resp: resp, probe: probe, recorded: true, start: start, n: n,
				ctx: actx, rt: rt}, nil
		}
		actx.cancel()
		rt.bound.Release(idx)
		log.Warn().Err(err).Str("reason", retryReason(res)).Int("attempts", n).Str("no_retry", cause).Msg("forward failed")
		if res == control.ResultTimeout {
			msg := fmt.Sprintf("engine %q for model %q sent nothing within %v (%d attempts)", eng.Name, rt.model, timeout, n)
			if !actx.timerFired() {
				// A timeout below the attempt's deadline: connecting, or a
				// network deadline; say which rather than the deadline.
				msg = fmt.Sprintf("engine %q for model %q timed out after %v: %v (%d attempts)", eng.Name, rt.model,
					lat.Round(time.Millisecond), errString(err, resp), n)
			}
			return nil, protocol.NewAPIError(http.StatusGatewayTimeout, protocol.ErrTypeServer, "upstream_timeout", "", msg)
		}
		return nil, protocol.NewAPIError(http.StatusBadGateway, protocol.ErrTypeServer, "upstream_error", "",
			fmt.Sprintf("engine %q for model %q failed: %v (%d attempts)", eng.Name, rt.model, errString(err, resp), n))
	}
}

// passOver counts a pass over engine idx, which the router has no address
// for, and returns the key's next candidate not tried.
func (h *Handler) passOver(rt *routed, tried []int, idx int) (int, bool) {
	h.metrics.unaddressed.WithLabelValues(rt.model, rt.table.Engine(idx).Name).Inc()
	return h.nextCandidate(rt, tried, idx)
}

// noEngineError is the answer when no engine of model can be reached.
func noEngineError(model string) *protocol.APIError {
	return protocol.NewAPIError(http.StatusServiceUnavailable, protocol.ErrTypeUnavailable, "no_engine_available", "",
		fmt.Sprintf("no engine is available for model %q", model))
}

func errString(err error, resp *upstream.Response) string {
	if err != nil {
		return err.Error()
	}
	if resp != nil {
		return "status " + strconv.Itoa(resp.Status)
	}
	return "unknown error"
}

// readFirst reads until at least one byte or an error.
func readFirst(r io.Reader, buf []byte) (int, error) {
	for {
		k, err := r.Read(buf)
		if k > 0 || err != nil {
			return k, err
		}
	}
}

// retryTo decides whether attempt n, which failed on engine failed, is
// retried: it returns the next engine, or the cause of no retry
// ("attempts", "no_candidate" or "budget").
func (h *Handler) retryTo(rt *routed, tried []int, failed, n int) (int, string) {
	if n >= h.prot.MaxAttempts {
		return -1, "attempts"
	}
	next, ok := h.nextCandidate(rt, tried, failed)
	if !ok {
		return -1, "no_candidate"
	}
	if !h.budget.Take() {
		return -1, "budget"
	}
	return next, ""
}

// nextCandidate returns the key's next candidate for rt (see live.RetryCandidates.Next).
func (h *Handler) nextCandidate(rt *routed, tried []int, failed int) (int, bool) {
	c := live.RetryCandidates{Model: rt.model, Table: rt.table, Guard: rt.bound, Key: rt.key, Spare: rt.spare, Regions: h.opts.Regions}
	return c.Next(tried, failed)
}

// ejectReport feeds an attempt's result to the engine's ejection state
// (live.EngineLive.Report) and logs and exports changes.
func (h *Handler) ejectReport(model, engine string, el *live.EngineLive, res control.Result, probe bool, cause error, log *reqLog) {
	ev, d, fails := el.Report(res, probe, h.opts.Now(), h.prot.Eject)
	switch ev {
	case live.EjectStart, live.EjectAgain:
		h.metrics.ejected.WithLabelValues(model, engine).Set(1)
		msg := "engine ejected after consecutive failures; skipping it until a probe succeeds"
		if ev == live.EjectAgain {
			msg = "half-open probe failed; engine ejected again for longer"
		}
		log.Warn().Str("ejected_engine", engine).Int("consecutive_failures", fails).Str("last_failure", retryReason(res)).
			Err(cause).Dur("backoff", d).Msg(msg)
	case live.EjectRestored:
		h.metrics.ejected.WithLabelValues(model, engine).Set(0)
		log.Info().Str("restored_engine", engine).Msg("engine answered again; ejection lifted")
	}
}

// finishAttempt records a committed attempt's outcome after its relay.
func (h *Handler) finishAttempt(ctx context.Context, a *attempt, relayErr error, first, end time.Time, log *reqLog) {
	o := responseOutcome(ctx, a.resp.Status, relayErr, a.start, first, end)
	if a.recorded {
		return
	}
	h.opts.Observer.Outcome(a.rt.model, a.engine.Name, o)
	el := a.rt.bound.Live(a.idx)
	switch {
	case errors.Is(relayErr, errEngineBroke) && ctx.Err() == nil && a.resp.Status < 300:
		h.ejectReport(a.rt.model, a.engine.Name, el, o.Result, false, relayErr, log)
	case a.resp.Status >= 400:
		// An error answer relayed as it is: its class decides (a client
		// error is neutral, another 4xx a failure); a probe's was judged
		// when it was committed.
		if !a.probe {
			h.ejectReport(a.rt.model, a.engine.Name, el, o.Result, false, nil, log)
		}
	case relayErr == nil && !a.probe:
		h.ejectReport(a.rt.model, a.engine.Name, el, control.ResultOK, false, nil, log)
	}
}
