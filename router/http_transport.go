package router

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// UpstreamRequest is a request as the router forwards it to an engine.
type UpstreamRequest struct {
	// Endpoint is the OpenAI endpoint to call on the engine.
	Endpoint Endpoint
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

// UpstreamResponse is an engine's answer. The caller must close Body.
type UpstreamResponse struct {
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
	Forward(ctx context.Context, engine Engine, req *UpstreamRequest) (*UpstreamResponse, error)
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

// HTTPTransport forwards over HTTP/1.1 with one tuned, pooled http.Transport:
// keep-alive connections are pooled per engine (host:port).
type HTTPTransport struct {
	rt *http.Transport
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
	dialer := &net.Dialer{Timeout: opts.DialTimeout, KeepAlive: 30 * time.Second}
	return &HTTPTransport{rt: &http.Transport{
		DialContext:           dialer.DialContext,
		MaxIdleConns:          0, // no global cap; the per-engine cap applies
		MaxIdleConnsPerHost:   opts.MaxIdleConnsPerEngine,
		IdleConnTimeout:       opts.IdleConnTimeout,
		ResponseHeaderTimeout: opts.ResponseHeaderTimeout,
		DisableCompression:    true, // pass bodies through as the engine sends them
		ForceAttemptHTTP2:     false,
		WriteBufferSize:       32 << 10,
		ReadBufferSize:        32 << 10,
	}}
}

// Forward posts req.Body to engine.URL + the endpoint's path.
func (t *HTTPTransport) Forward(ctx context.Context, engine Engine, req *UpstreamRequest) (*UpstreamResponse, error) {
	if engine.URL == "" {
		return nil, fmt.Errorf("router: forward to engine %q: no HTTP URL", engine.Name)
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
		hreq.Header.Set(headerRequestID, req.RequestID)
	}
	resp, err := t.rt.RoundTrip(hreq)
	if err != nil {
		return nil, fmt.Errorf("router: forward to engine %q at %q: %w", engine.Name, url, err)
	}
	return &UpstreamResponse{Status: resp.StatusCode, Header: resp.Header, Body: resp.Body}, nil
}

// CloseIdleConnections closes the pooled idle connections.
func (t *HTTPTransport) CloseIdleConnections() { t.rt.CloseIdleConnections() }
