package control

import (
	"net/http"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
)

// Result classifies the outcome of one forwarding attempt.
type Result uint8

// Forwarding results. Errors map to the report's error classes: "connect",
// "5xx", "429", "other" and "client"; timeouts are counted apart, and a
// request the client cancelled counts as sent but neither succeeded nor
// failed (the engine is not to blame). Blames tells which results count
// against an engine's health.
const (
	ResultOK Result = iota
	ResultConnect
	Result5xx
	Result429
	ResultOther
	ResultTimeout
	ResultCanceled
	// ResultClient is an answer saying the request was at fault (see
	// ClientErrorStatus): the engine works, the client must change its
	// request. It is counted apart ("client") and never against the engine.
	ResultClient
)

// ClassClient is the report error class of client errors (ResultClient).
// Aggregators leave it out of an engine's error rate.
const ClassClient = messages.ErrorClassClient

// Class returns the report error class of r, or "" for results that are
// not errors (ok, timeout, canceled).
func (r Result) Class() string {
	switch r {
	case ResultConnect:
		return "connect"
	case Result5xx:
		return "5xx"
	case Result429:
		return "429"
	case ResultOther:
		return "other"
	case ResultClient:
		return ClassClient
	}
	return ""
}

// Blames reports whether r counts against the engine's health: connect
// errors, timeouts, 5xx and other engine failures do; a success, a
// cancelled request, the engine's own 429 (its load, which capacity
// accounts for) and a client error do not. Ejection, retries, reports and
// through them the optimizer's penalties all follow this one rule.
func (r Result) Blames() bool {
	switch r {
	case ResultConnect, Result5xx, ResultOther, ResultTimeout:
		return true
	}
	return false
}

// ClientErrorStatus reports whether an engine's answer status says the
// request, not the engine, is at fault: 400 (invalid parameters, and the
// context-length errors vLLM and the OpenAI API answer as 400
// BadRequestError / invalid_request_error), 401 and 403 (the client's own
// credentials, which the router passes through), 404 (an unknown model or
// path: NotFoundError), 405, 409, 411, 413 (body too large), 414, 415, 422
// (validation errors, as TGI and FastAPI answer them) and 431. Other 4xx
// answers (408 above all: the engine timed the request out) are the
// engine's.
func ClientErrorStatus(status int) bool {
	switch status {
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound,
		http.StatusMethodNotAllowed, http.StatusConflict, http.StatusLengthRequired,
		http.StatusRequestEntityTooLarge, http.StatusRequestURITooLong, http.StatusUnsupportedMediaType,
		http.StatusUnprocessableEntity, http.StatusRequestHeaderFieldsTooLarge:
		return true
	}
	return false
}

// StatusResult classifies an engine's answer by its status (the HTTP
// status, or Sy-Status over NATS): below 400 ResultOK, 408 ResultTimeout,
// 429 Result429, 5xx Result5xx, a client error (ClientErrorStatus)
// ResultClient, any other 4xx ResultOther.
func StatusResult(status int) Result {
	switch {
	case status < 400:
		return ResultOK
	case status == http.StatusTooManyRequests:
		return Result429
	case status == http.StatusRequestTimeout:
		return ResultTimeout
	case status >= 500:
		return Result5xx
	case ClientErrorStatus(status):
		return ResultClient
	}
	return ResultOther
}

// Outcome is what one forwarding attempt came to, as seen by the router.
type Outcome struct {
	// Result classifies the attempt.
	Result Result
	// Latency is the time from receiving the request to the end of the
	// response (or the failure).
	Latency time.Duration
	// TTFT is the time from receiving the request to relaying the first
	// response byte; zero when none was relayed.
	TTFT time.Duration
}

// Observer is told about routed requests and forwarding outcomes; a
// Reporter implements it. Calls come from request goroutines and must not
// block.
type Observer interface {
	// Request counts one client request for a served model.
	Request(model string)
	// Outcome records one forwarding attempt to engine.
	Outcome(model, engine string, o Outcome)
}
