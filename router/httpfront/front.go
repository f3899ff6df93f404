package httpfront

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/protocol"
)

// Pipeline is the router's request pipeline as the HTTP front calls it,
// whichever server parsed the request (router.Handler's, through
// router.NewServer).
type Pipeline interface {
	// ServeHTTP serves the routes that are not inference endpoints
	// (/v1/models, /healthz, /readyz, /metrics, ...); the std server
	// serves every request through it, its inference routes included
	// (InferenceHandler).
	http.Handler
	// Begin runs the pipeline up to the engine's answer for a request to
	// endpoint ep: the request's checks, its route and its forward with
	// retries. It returns the answer to relay, or (a nil Answer) the
	// rejection to send, already counted.
	Begin(ctx context.Context, r protocol.ClientRequest, ep protocol.Endpoint) (Answer, Rejection)
	// Reject counts an invalid request the front answers itself with e.
	Reject(e *protocol.APIError)
	// NewContext returns a request's context, which ends only when
	// canceled: the fasthttp front cancels it when the client goes away.
	NewContext() Context
	// MaxBodyBytes is the request body limit.
	MaxBodyBytes() int64
	// BodyReadTimeout bounds reading a request body.
	BodyReadTimeout() time.Duration
	// Now reads the pipeline's clock.
	Now() time.Time
	// Logger receives the servers' own logs.
	Logger() zerolog.Logger
}

// Context is a request's context with its cancel.
type Context interface {
	context.Context
	// Cancel ends the context; further calls do nothing.
	Cancel()
}

// Answer is a request an engine answered: the front writes the head
// (Status, the engine's Header, Engine, RequestID), then calls Relay, or
// Release when it relays nothing.
type Answer interface {
	RequestID() string
	Engine() string
	Status() int
	// Header is the engine's answer header.
	Header() http.Header
	// Streamed reports whether the client asked for a streamed answer.
	Streamed() bool
	// Relay copies the engine's body to w, flushing after every read,
	// records the outcome and releases what the request held. ctx is the
	// one Begin was given, or any context that has ended when the client
	// is known to have gone away.
	Relay(ctx context.Context, w http.ResponseWriter)
	// Release frees what the request held.
	Release()
}

// Rejection is a request the pipeline answered with an error.
type Rejection struct {
	Err *protocol.APIError
	// RequestID is the request's id, "" when its own was invalid.
	RequestID string
	// RetryAfter is the Retry-After value to send, "" for none.
	RetryAfter string
}

// reject counts e as an invalid request and answers it.
func reject(p Pipeline, w http.ResponseWriter, e *protocol.APIError) {
	p.Reject(e)
	protocol.WriteError(w, e)
}

// mimeJSON is the usual Content-Type of request bodies, read without a
// copy.
const mimeJSON = "application/json"

// httpRequest is what the HTTP front reads of a client's request,
// whichever HTTP server parsed it (net/http or fasthttp): the pipeline's
// protocol.ClientRequest and the method.
type httpRequest interface {
	protocol.ClientRequest
	// method is the request method.
	method() string
}

// headWriter is a response writer that writes an engine's answer head
// without a header map: the headers set so far, then the engine's headers
// but the hop-by-hop ones (each replacing any of its name set before),
// then X-Switchyard-Engine and X-Request-Id, and the status — what
// copyResponseHeaders, two Sets and WriteHeader do on an http.Header.
type headWriter interface {
	writeHead(status int, engine http.Header, engineName, requestID string)
}

// serveInference is the HTTP front's request path up to the response
// head: it checks the method, runs the pipeline (Pipeline.Begin) and either
// answers its rejection (returning nil) or writes the engine's status and
// headers and returns the answer whose body the caller relays with
// Answer.Relay. ctx ends when the client goes away, if the server can tell.
func serveInference(ctx context.Context, p Pipeline, w http.ResponseWriter, r httpRequest, ep protocol.Endpoint) Answer {
	if m := r.method(); m != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		reject(p, w, protocol.NewAPIError(http.StatusMethodNotAllowed, protocol.ErrTypeInvalidRequest, "method_not_allowed", "",
			fmt.Sprintf("method %s not allowed on %s; use POST", m, ep.Path())))
		return nil
	}
	a, rej := p.Begin(ctx, r, ep)
	if a == nil {
		hdr := w.Header()
		if rej.RequestID != "" {
			hdr.Set(messages.HeaderRequestID, rej.RequestID)
		}
		if rej.RetryAfter != "" {
			hdr.Set("Retry-After", rej.RetryAfter)
		}
		protocol.WriteError(w, rej.Err)
		return nil
	}
	written := false
	defer func() {
		if !written { // a panic writing the head
			a.Release()
		}
	}()
	if hw, ok := w.(headWriter); ok {
		hw.writeHead(a.Status(), a.Header(), a.Engine(), a.RequestID())
	} else {
		hdr := w.Header()
		copyResponseHeaders(hdr, a.Header())
		hdr.Set(messages.HeaderEngine, a.Engine())
		hdr.Set(messages.HeaderRequestID, a.RequestID())
		w.WriteHeader(a.Status())
	}
	written = true
	return a
}

// passedHeaders names the client headers forwarded to engines, in
// canonical form.
func passedHeaders() [5]string {
	return [5]string{"Authorization", "Accept", messages.HeaderSessionID, "Openai-Organization", "Openai-Project"}
}

// isHopHeader reports whether k is a connection-level header, never relayed.
func isHopHeader(k string) bool {
	switch k {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Te", "Trailer", "Upgrade",
		"Proxy-Authenticate", "Proxy-Authorization":
		return true
	}
	return false
}

func copyResponseHeaders(dst, src http.Header) {
	for k, vs := range src {
		if !isHopHeader(k) {
			dst[k] = vs
		}
	}
}
