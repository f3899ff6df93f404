package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/selection"
)

// Request is a request as the router forwards it to an engine.
type Request struct {
	// Endpoint is the OpenAI endpoint to call on the engine.
	Endpoint protocol.Endpoint
	// Model is the requested model.
	Model string
	// Stream reports whether the client asked for a streamed answer.
	Stream bool
	// RequestID is the request's x-request-id.
	RequestID string
	// Body is the client's request body, forwarded unchanged.
	Body []byte
	// Header holds the client headers passed through to the engine
	// (Authorization, Accept, x-session-id, ...), never nil.
	Header http.Header
}

// Response is an engine's answer. The caller must close Body.
type Response struct {
	// Status is the engine's HTTP status code (or its equivalent).
	Status int
	// Header holds the engine's response headers, never nil.
	Header http.Header
	// Body streams the response body as the engine produces it.
	Body io.ReadCloser
}

// Transport forwards a request to one engine. Cancelling ctx must abort the
// engine's work (the client went away). Implementations: HTTPTransport; a
// NATS request-reply transport can sit beside it.
type Transport interface {
	// Forward sends req to engine and returns the engine's response once its
	// status is known; the body may still be streaming.
	Forward(ctx context.Context, engine selection.Engine, req *Request) (*Response, error)
}

// HTTPTransportOptions tunes NewHTTPTransport. Zero fields take defaults.
type HTTPTransportOptions struct {
	// MaxIdleConnsPerEngine is the keep-alive pool size per engine (default 256).
	MaxIdleConnsPerEngine int
	// IdleConnTimeout closes pooled connections idle this long (default 90s).
	IdleConnTimeout time.Duration
	// DialTimeout bounds connecting to an engine (default 3s).
	DialTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for an engine's response headers
	// (default 0: no limit, as a non-streamed generation may take minutes).
	ResponseHeaderTimeout time.Duration
}

// bufSize is the read and write buffer size of a connection.
func (HTTPTransportOptions) bufSize() int { return 32 << 10 }

// HTTPTransport forwards over HTTP/1.1 with keep-alive connections pooled
// per engine base URL. Plain-http engines are served by the router's own
// client (http_upstream.go), which writes a request and reads its response
// in the caller's goroutine; https engines by a tuned net/http Transport.
type HTTPTransport struct {
	opts   HTTPTransportOptions
	dialer *net.Dialer
	now    func() time.Time
	pools  sync.Map // engine base URL → *upstreamPool, or error when not plain http
	sweep  atomic.Int64
	std    atomic.Pointer[http.Transport] // https engines, made on first use
}

// NewHTTPTransport returns an HTTP transport with the given options.
func NewHTTPTransport(opts HTTPTransportOptions) *HTTPTransport {
	if opts.MaxIdleConnsPerEngine <= 0 {
		opts.MaxIdleConnsPerEngine = 256
	}
	if opts.IdleConnTimeout <= 0 {
		opts.IdleConnTimeout = 90 * time.Second
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 3 * time.Second
	}
	return &HTTPTransport{
		opts:   opts,
		dialer: &net.Dialer{Timeout: opts.DialTimeout, KeepAlive: 30 * time.Second},
		now:    time.Now,
	}
}

// pool returns the keep-alive pool of the engine base URL base, or nil
// when base is not a plain-http URL.
func (t *HTTPTransport) pool(base string) *upstreamPool {
	if v, ok := t.pools.Load(base); ok {
		p, _ := v.(*upstreamPool)
		return p
	}
	var v any = errNotPlainHTTP
	if u, err := url.Parse(base); err == nil {
		if p, err := newUpstreamPool(u); err == nil {
			v = p
		}
	}
	v, _ = t.pools.LoadOrStore(base, v)
	p, _ := v.(*upstreamPool)
	return p
}

var errNotPlainHTTP = errors.New("not a plain http URL")

// Forward posts req.Body to engine.URL + the endpoint's path.
func (t *HTTPTransport) Forward(ctx context.Context, engine selection.Engine, req *Request) (*Response, error) {
	if engine.URL == "" {
		return nil, fmt.Errorf("router: forward to engine %q: no HTTP URL", engine.Name)
	}
	t.maybeSweep()
	p := t.pool(engine.URL)
	if p == nil {
		return t.forwardStd(ctx, engine, req)
	}
	resp, err := t.roundTrip(ctx, p, req)
	if err != nil {
		return nil, fmt.Errorf("router: forward to engine %q at %q: %w", engine.Name, engine.URL, err)
	}
	return resp, nil
}

// maybeSweep closes, at most every half IdleConnTimeout, the connections
// idle longer than IdleConnTimeout in every pool, so that the pools of
// engines no longer routed to do not keep connections open.
func (t *HTTPTransport) maybeSweep() {
	now := t.now()
	last := t.sweep.Load()
	if now.UnixNano()-last < int64(t.opts.IdleConnTimeout/2) || !t.sweep.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	if last == 0 {
		return // first request: nothing idle yet
	}
	cutoff := now.Add(-t.opts.IdleConnTimeout)
	t.pools.Range(func(_, v any) bool {
		if p, ok := v.(*upstreamPool); ok {
			p.closeIdle(cutoff)
		}
		return true
	})
}

// forwardStd forwards over net/http's Transport (https engines).
func (t *HTTPTransport) forwardStd(ctx context.Context, engine selection.Engine, req *Request) (*Response, error) {
	rt := t.std.Load()
	if rt == nil {
		rt = &http.Transport{
			DialContext:           t.dialer.DialContext,
			MaxIdleConns:          0, // no global cap; the per-engine cap applies
			MaxIdleConnsPerHost:   t.opts.MaxIdleConnsPerEngine,
			IdleConnTimeout:       t.opts.IdleConnTimeout,
			ResponseHeaderTimeout: t.opts.ResponseHeaderTimeout,
			DisableCompression:    true, // pass bodies through as the engine sends them
			ForceAttemptHTTP2:     false,
			WriteBufferSize:       t.opts.bufSize(),
			ReadBufferSize:        t.opts.bufSize(),
		}
		if !t.std.CompareAndSwap(nil, rt) {
			rt = t.std.Load()
		}
	}
	url := strings.TrimSuffix(engine.URL, "/") + req.Endpoint.Path()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(req.Body))
	if err != nil {
		return nil, fmt.Errorf("router: forward to engine %q at %q: %w", engine.Name, url, err)
	}
	for k, vs := range req.Header {
		hreq.Header[k] = vs
	}
	hreq.Header.Set("Content-Type", "application/json")
	if req.RequestID != "" {
		hreq.Header.Set(messages.HeaderRequestID, req.RequestID)
	}
	resp, err := rt.RoundTrip(hreq)
	if err != nil {
		return nil, fmt.Errorf("router: forward to engine %q at %q: %w", engine.Name, url, err)
	}
	return &Response{Status: resp.StatusCode, Header: resp.Header, Body: resp.Body}, nil
}

// CloseIdleConnections closes the pooled idle connections.
func (t *HTTPTransport) CloseIdleConnections() {
	t.pools.Range(func(_, v any) bool {
		if p, ok := v.(*upstreamPool); ok {
			p.closeIdle(time.Time{})
		}
		return true
	})
	if rt := t.std.Load(); rt != nil {
		rt.CloseIdleConnections()
	}
}
