package router

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/httpfront"
	"github.com/switchyard-dev/switchyard/router/natsfront"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/tenant"
	"github.com/switchyard-dev/switchyard/router/upstream"
)

// endpointFromBody asks begin to tell the endpoint from the body
// (protocol.EndpointOf), for a front whose address does not name it.
const endpointFromBody protocol.Endpoint = -1

// rejection is a request the pipeline answered with an error: what the
// front sends, already counted.
type rejection struct {
	err *protocol.APIError
	// reqID is the request's id, "" when its own was invalid.
	reqID string
	// retryAfter is the Retry-After value to send, "" for none.
	retryAfter string
}

// answer is a request whose engine answered: the front writes the head
// (status at.resp.Status, engine at.engine.Name, id logv.id), relays the
// body, then calls record and release.
type answer struct {
	h      *Handler
	rt     *routed
	at     *attempt
	mm     *modelMetrics
	bp     *[]byte
	log    *reqLog
	start  time.Time
	stream bool
	logv   reqLog           // what log points to
	up     upstream.Request // the request forwarded to the engine
}

// begin is the request pipeline both fronts run, up to the engine's
// answer: it checks the request's id, session and priority headers, reads
// and parses the body, routes the request (Handler.route) and forwards it
// (Handler.forward, with its retries). It returns the answer to relay, or
// the rejection to send (counted in the request metrics under the model,
// or labelInvalid / labelUnknown). ep is the request's endpoint, or
// endpointFromBody; front names the front in the request's logs ("" for
// HTTP).
func (h *Handler) begin(ctx context.Context, r protocol.ClientRequest, ep protocol.Endpoint, front string) (*answer, rejection) {
	start := h.opts.Now()
	reqID, _ := r.RequestHeader(messages.HeaderRequestID)
	if reqID == "" {
		reqID = h.newRequestID()
	} else if !protocol.ValidHeaderValue(reqID, maxRequestIDLen) {
		return nil, h.rejected(labelInvalid, "", protocol.NewAPIError(http.StatusBadRequest, protocol.ErrTypeInvalidRequest, "invalid_header", messages.HeaderRequestID,
			fmt.Sprintf("header %s must be 1 to %d visible ASCII characters", messages.HeaderRequestID, maxRequestIDLen)))
	}
	session, present := r.RequestHeader(messages.HeaderSessionID)
	if present && !protocol.ValidHeaderValue(session, maxSessionIDLen) {
		return nil, h.rejected(labelInvalid, reqID, protocol.NewAPIError(http.StatusBadRequest, protocol.ErrTypeInvalidRequest, "invalid_header", messages.HeaderSessionID,
			fmt.Sprintf("header %s must be 1 to %d visible ASCII characters", messages.HeaderSessionID, maxSessionIDLen)))
	}
	if ct, _ := r.RequestHeader("Content-Type"); ct != "" && ct != mimeJSON {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != mimeJSON {
			return nil, h.rejected(labelInvalid, reqID, protocol.NewAPIError(http.StatusUnsupportedMediaType, protocol.ErrTypeInvalidRequest, "unsupported_media_type", "",
				fmt.Sprintf("Content-Type %q is not application/json", ct)))
		}
	}
	prioHeader, _ := r.RequestHeader(messages.HeaderPriority)
	prio, ok := protocol.ParsePriority(prioHeader)
	if !ok {
		return nil, h.rejected(labelInvalid, reqID, protocol.NewAPIError(http.StatusBadRequest, protocol.ErrTypeInvalidRequest, "invalid_header", messages.HeaderPriority,
			fmt.Sprintf("header %s must be critical, standard or sheddable", messages.HeaderPriority)))
	}
	// The front door, before the body is read: the tenant's key, its
	// priority ceiling and default, its rate.
	door, apiErr, retryAfter := h.opts.Tenants.Admit(start, r.RequestHeader, prio, strings.TrimSpace(prioHeader) != "")
	if apiErr != nil {
		rej := h.rejected(labelTenant, reqID, apiErr)
		rej.retryAfter = retryAfter
		return nil, rej
	}
	prio = door.Priority
	body, apiErr := r.RequestBody()
	if apiErr != nil {
		return nil, h.rejected(labelInvalid, reqID, apiErr)
	}
	if ep == endpointFromBody {
		ep = protocol.EndpointOf(body)
	}
	req, err := protocol.ParseRequest(ep, body)
	if err != nil {
		var ae *protocol.APIError
		if !errors.As(err, &ae) {
			ae = protocol.InvalidRequest("", err.Error())
		}
		return nil, h.rejected(labelInvalid, reqID, ae)
	}
	if apiErr := r.Check(req); apiErr != nil {
		return nil, h.rejected(labelInvalid, reqID, apiErr)
	}
	aliased := false
	if m, ok := h.opts.Aliases[req.Model]; ok {
		req.Model, aliased = m, true
	}
	rt, apiErr := h.route(ctx, req, session, prio)
	if apiErr != nil {
		label := req.Model
		if apiErr.Status == http.StatusNotFound {
			label = labelUnknown
		}
		rej := h.rejected(label, reqID, apiErr)
		switch apiErr.Status {
		case http.StatusServiceUnavailable:
			rej.retryAfter = "1"
		case http.StatusTooManyRequests:
			rej.retryAfter = h.retryAfter()
		}
		return nil, rej
	}
	rt.req, rt.aliased = req, aliased
	mm := h.modelMetrics(rt.ms, req.Model)
	mm.inFlight.Inc()
	// One allocation for the answer, the request's logger and the request
	// to the engine; the answer is returned only once the engine answered.
	a := &answer{h: h, rt: rt, mm: mm, start: start, stream: req.Stream,
		logv: reqLog{base: &h.log, model: req.Model, id: reqID, key: rt.src, prio: prio, front: front, tenant: door.Tenant},
		up: upstream.Request{Endpoint: ep, Model: req.Model, Stream: req.Stream, RequestID: reqID, Body: body,
			Header: r.PassHeaders()}}
	a.log = &a.logv
	if h.opts.Tenants != nil {
		// The tenant's key is the router's to check, never the engine's to
		// see: an engine behind the router takes the router's word.
		a.up.Header.Del(tenant.HeaderAuthorization)
		a.up.Header.Del(tenant.HeaderAPIKey)
		a.up.Header.Del(tenant.HeaderXAPIKey)
	}
	a.bp = h.bufs.Get().(*[]byte)
	answered := false
	defer func() {
		if !answered { // an error, or a panic in forward
			a.release()
		}
	}()
	a.at, apiErr = h.forward(ctx, rt, &a.up, *a.bp, a.log)
	if apiErr != nil {
		if apiErr.Code != nil && *apiErr.Code == "canceled" {
			a.log.Debug().Msg("client went away before the engine answered")
		}
		return nil, h.rejected(req.Model, reqID, apiErr)
	}
	h.countRequest(mm, req.Model, a.at.resp.Status)
	answered = true
	return a, rejection{}
}

// rejected counts e under the metric label and returns it as a rejection.
func (h *Handler) rejected(label, reqID string, e *protocol.APIError) rejection {
	h.metrics.requests.WithLabelValues(label, strconv.Itoa(e.Status)).Inc()
	return rejection{err: e, reqID: reqID}
}

// record ends a relayed answer's bookkeeping: the attempt's outcome (its
// relay error err, n bytes relayed, the first written at first), the
// time-to-first-token and duration metrics and the request's log line.
// ctx is the request's context.
func (a *answer) record(ctx context.Context, n int64, first time.Time, err error) {
	h, at := a.h, a.at
	end := h.opts.Now()
	// Only a streamed answer's first byte is its first token; a whole
	// answer's first byte comes when it is complete, and counting it as TTFT
	// would make every engine look slow to the penalty rules.
	ttftAt := first
	if !a.stream {
		ttftAt = time.Time{}
	}
	h.finishAttempt(ctx, at, err, ttftAt, end, a.log)
	if !first.IsZero() {
		a.mm.ttft.Observe(first.Sub(a.start).Seconds())
	}
	a.mm.duration.Observe(end.Sub(a.start).Seconds())
	ev := a.log.Debug()
	if err != nil {
		ev = a.log.Info().Err(err)
	}
	ev.Str("engine", at.engine.Name).Int("status", at.resp.Status).Int64("bytes", n).Dur("duration", end.Sub(a.start)).
		Bool("stream", a.stream).Int("attempts", at.n).Msg("request done")
}

// release frees everything the request held: its attempt (when one
// answered), its read buffer, its in-flight count and its admission.
func (a *answer) release() {
	if a.at != nil {
		a.at.finish()
	}
	a.h.bufs.Put(a.bp)
	a.mm.inFlight.Dec()
	a.rt.release()
}

// Begin runs the request pipeline for the NATS front
// (natsfront.Pipeline): the endpoint is told from the body, and the
// request's logs name the front "nats".
func (h *Handler) Begin(ctx context.Context, r protocol.ClientRequest) (natsfront.Answer, *natsfront.Rejection) {
	a, rej := h.begin(ctx, r, endpointFromBody, "nats")
	if a == nil {
		return nil, &natsfront.Rejection{Err: rej.err, RequestID: rej.reqID, RetryAfter: rej.retryAfter}
	}
	return a, nil
}

// MaxBodyBytes returns the request body limit (Options.MaxBodyBytes).
func (h *Handler) MaxBodyBytes() int64 { return h.opts.MaxBodyBytes }

// Now reads the handler's clock (Options.Now).
func (h *Handler) Now() time.Time { return h.opts.Now() }

// RequestID returns the request's id (natsfront.Answer).
func (a *answer) RequestID() string { return a.logv.id }

// Engine returns the name of the engine that answered.
func (a *answer) Engine() string { return a.at.engine.Name }

// Status returns the engine's answer status.
func (a *answer) Status() int { return a.at.resp.Status }

// Streamed reports whether the client asked for a streamed answer.
func (a *answer) Streamed() bool { return a.stream }

// Body returns the engine's answer body, the bytes already read of it
// first.
func (a *answer) Body() io.Reader {
	if len(a.at.first) > 0 {
		return io.MultiReader(bytes.NewReader(a.at.first), a.at.resp.Body)
	}
	return a.at.resp.Body
}

// Record is record for a front that relayed the answer itself: err, when
// set, is a failure of the engine's body.
func (a *answer) Record(ctx context.Context, n int64, first time.Time, err error) {
	if err != nil {
		err = fmt.Errorf("%w: %w", errEngineBroke, err)
	}
	a.record(ctx, n, first, err)
}

// Release is release (natsfront.Answer).
func (a *answer) Release() { a.release() }

// Header returns the engine's answer header (httpfront.Answer).
func (a *answer) Header() http.Header { return a.at.resp.Header }

// httpPipeline is the Handler as the HTTP front's pipeline
// (httpfront.Pipeline); the NATS front's is the Handler itself.
type httpPipeline struct{ h *Handler }

// ServeHTTP serves the Handler's mux.
func (p httpPipeline) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.h.mux.ServeHTTP(w, r) }

// Begin runs the request pipeline for the HTTP front: the path named the
// endpoint, and the request's logs name no front.
func (p httpPipeline) Begin(ctx context.Context, r protocol.ClientRequest, ep protocol.Endpoint) (httpfront.Answer, httpfront.Rejection) {
	a, rej := p.h.begin(ctx, r, ep, "")
	if a == nil {
		return nil, httpfront.Rejection{Err: rej.err, RequestID: rej.reqID, RetryAfter: rej.retryAfter}
	}
	return a, httpfront.Rejection{}
}

// Reject counts an invalid request the front answered itself.
func (p httpPipeline) Reject(e *protocol.APIError) {
	p.h.metrics.requests.WithLabelValues(labelInvalid, strconv.Itoa(e.Status)).Inc()
}

// NewContext returns a root request context, to which each attempt's
// context is attached without allocating (hookCtx).
func (p httpPipeline) NewContext() httpfront.Context { return newRootCtx() }

// MaxBodyBytes returns the request body limit (Options.MaxBodyBytes).
func (p httpPipeline) MaxBodyBytes() int64 { return p.h.opts.MaxBodyBytes }

// BodyReadTimeout returns Options.BodyReadTimeout.
func (p httpPipeline) BodyReadTimeout() time.Duration { return p.h.opts.BodyReadTimeout }

// Now reads the handler's clock (Options.Now).
func (p httpPipeline) Now() time.Time { return p.h.opts.Now() }

// Logger returns the handler's logger.
func (p httpPipeline) Logger() zerolog.Logger { return p.h.log }

// NewServer returns the HTTP server of kind opts.Kind for h
// (httpfront.NewServer over h's pipeline).
func NewServer(h *Handler, opts httpfront.ServerOptions) (httpfront.Server, error) {
	return httpfront.NewServer(httpPipeline{h}, opts)
}
