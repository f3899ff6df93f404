package httpfront

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/switchyard-dev/switchyard/router/protocol"
)

// ServerKind names the HTTP server implementation of a router front.
type ServerKind string

// Server kinds.
const (
	// ServerStd is Go's net/http server.
	ServerStd ServerKind = "std"
	// ServerFast is github.com/valyala/fasthttp's server.
	ServerFast ServerKind = "fasthttp"
)

// DefaultServerKind is the server of a router front whose ServerOptions
// name none.
const DefaultServerKind = ServerFast

// ParseServerKind returns the ServerKind named s ("std" or "fasthttp").
func ParseServerKind(s string) (ServerKind, error) {
	switch k := ServerKind(s); k {
	case ServerStd, ServerFast:
		return k, nil
	}
	return "", fmt.Errorf("router: HTTP server %q: want %q or %q", s, ServerStd, ServerFast)
}

// ServerOptions are the HTTP server settings for a router front. Zero fields
// take defaults.
type ServerOptions struct {
	// Addr is the listen address, e.g. "127.0.0.1:8081".
	Addr string
	// Kind is the server implementation (default DefaultServerKind).
	Kind ServerKind
	// ReadHeaderTimeout bounds reading request headers (default 10s): a
	// client that never finishes its headers is disconnected.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes idle keep-alive client connections (default 120s).
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds request header size (default 64 KiB). The
	// fasthttp server reads each connection through a buffer of this size,
	// held for the connection's life: 64 KiB per open client connection.
	MaxHeaderBytes int
}

// WithDefaults returns o with every zero field set to its default.
func (o ServerOptions) WithDefaults() ServerOptions {
	if o.Kind == "" {
		o.Kind = DefaultServerKind
	}
	if o.ReadHeaderTimeout <= 0 {
		o.ReadHeaderTimeout = 10 * time.Second
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 120 * time.Second
	}
	if o.MaxHeaderBytes <= 0 {
		o.MaxHeaderBytes = 64 << 10
	}
	return o
}

// Server is a router front's HTTP server, whichever its implementation.
type Server interface {
	// Serve accepts connections on ln until Shutdown or Close, then returns
	// http.ErrServerClosed.
	Serve(ln net.Listener) error
	// Shutdown stops accepting, closes idle connections and waits for
	// requests in progress until ctx ends.
	Shutdown(ctx context.Context) error
	// Close closes the listener and every connection at once.
	Close() error
}

// NewServer returns the HTTP server of kind opts.Kind for p with the
// router's limits. Neither kind has a write timeout, which would cut long
// streamed responses: the body read is bounded by Pipeline.BodyReadTimeout
// and the body size by Pipeline.MaxBodyBytes. It fails on an unknown kind.
func NewServer(p Pipeline, opts ServerOptions) (Server, error) {
	opts = opts.WithDefaults()
	switch opts.Kind {
	case ServerStd:
		return &http.Server{
			Addr:              opts.Addr,
			Handler:           p,
			ReadHeaderTimeout: opts.ReadHeaderTimeout,
			IdleTimeout:       opts.IdleTimeout,
			MaxHeaderBytes:    opts.MaxHeaderBytes,
		}, nil
	case ServerFast:
		return newFastServer(p, opts), nil
	}
	return nil, fmt.Errorf("router: new server: unknown kind %q (want %q or %q)", opts.Kind, ServerStd, ServerFast)
}

// InferenceHandler returns the net/http handler of inference endpoint ep
// through p, for p's own mux.
func InferenceHandler(p Pipeline, ep protocol.Endpoint) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { serveStd(p, w, r, ep) })
}

// serveStd serves an inference endpoint on net/http.
func serveStd(p Pipeline, w http.ResponseWriter, r *http.Request, ep protocol.Endpoint) {
	in := stdRequest{p: p, w: w, r: r}
	if a := serveInference(r.Context(), p, w, &in, ep); a != nil {
		a.Relay(r.Context(), w)
	}
}

// stdRequest is a net/http request as an httpRequest.
type stdRequest struct {
	p Pipeline
	w http.ResponseWriter
	r *http.Request
}

func (s *stdRequest) method() string { return s.r.Method }

// check has nothing to add: the path named the endpoint, the body the model.
func (s *stdRequest) Check(*protocol.Request) *protocol.APIError { return nil }

func (s *stdRequest) RequestHeader(name string) (string, bool) {
	vs, ok := s.r.Header[name]
	if !ok || len(vs) == 0 {
		return "", ok
	}
	return vs[0], true
}

func (s *stdRequest) PassHeaders() http.Header {
	out := make(http.Header, 4)
	for _, k := range passedHeaders() {
		if vs, ok := s.r.Header[k]; ok {
			out[k] = vs
		}
	}
	return out
}

// body reads the request body within the size and time limits.
func (s *stdRequest) RequestBody() ([]byte, *protocol.APIError) {
	limit := s.p.MaxBodyBytes()
	if s.r.ContentLength > limit {
		return nil, protocol.BodyTooLarge(limit)
	}
	rc := http.NewResponseController(s.w)
	_ = rc.SetReadDeadline(s.p.Now().Add(s.p.BodyReadTimeout())) // unsupported writers: no deadline
	body, err := readBody(http.MaxBytesReader(s.w, s.r.Body, limit), s.r.ContentLength)
	if err != nil {
		// The deadline stays: net/http, before it writes the answer, would
		// otherwise wait without limit to discard the body's unread rest; it
		// fails at once and closes the connection after the answer.
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, protocol.BodyTooLarge(limit)
		}
		return nil, protocol.InvalidRequest("", fmt.Sprintf("reading request body: %v", err))
	}
	_ = rc.SetReadDeadline(time.Time{})
	return body, nil
}

// readBody reads r whole. Its buffer doubles as data arrives, up to the
// declared length (plus one byte, to read the end without growing): all
// its buffers together cost at most about twice the body's length
// (io.ReadAll grows large buffers by a quarter, some five times the length
// in all), and at any time at most four times what the client sent so far,
// so that a client that declares a large body and sends little costs
// little.
func readBody(r io.Reader, declared int64) ([]byte, error) {
	size := 4 << 10
	if declared >= 0 && declared < int64(size) {
		size = int(declared) + 1
	}
	b := make([]byte, 0, size)
	for {
		if len(b) == cap(b) {
			n := 2 * cap(b)
			if target := declared + 1; declared >= 0 && int64(len(b)) < target && 2*int64(n) > target {
				n = int(target) // the next doubling would pass it: straight to the end
			}
			nb := make([]byte, len(b), n)
			copy(nb, b)
			b = nb
		}
		k, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+k]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}
