package httpfront

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/upstream"
)

// fastServer serves a Pipeline with fasthttp. The inference endpoints run
// natively on fasthttp's request (no per-request goroutine, context or
// net/http request); every other route goes through fasthttpadaptor to
// the pipeline's net/http mux (Pipeline.ServeHTTP).
//
// A streamed answer is relayed from fasthttp's body stream writer, which
// flushes each event as one chunk; a failed write to the client cancels the
// engine's request. A whole (non-streamed) answer is read into the response
// and sent when complete, as nginx's default buffering does. A client that
// goes away while the engine works — before the first byte, on a whole
// answer, or between events — is noticed by the goneWatcher, which cancels
// the request.
type fastServer struct {
	p      Pipeline
	log    zerolog.Logger
	srv    *fasthttp.Server
	other  fasthttp.RequestHandler
	xs     sync.Pool // *fastExchange
	closed atomic.Bool
	gone   *goneWatcher

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	// inBody holds the requests (by their header, one per connection)
	// whose header is in and whose body is being read, to tell a slow body
	// from a slow header when the read times out.
	inBody map[*fasthttp.RequestHeader]struct{}
}

func newFastServer(p Pipeline, opts ServerOptions) *fastServer {
	s := &fastServer{p: p, log: p.Logger(), other: fasthttpadaptor.NewFastHTTPHandler(p), conns: map[net.Conn]struct{}{},
		inBody: map[*fasthttp.RequestHeader]struct{}{}, gone: newGoneWatcher(goneWatchPeriod)}
	s.xs.New = func() any { return &fastExchange{hdr: make(http.Header, 8)} }
	bodyTimeout := p.BodyReadTimeout()
	s.srv = &fasthttp.Server{
		Handler:      s.serve,
		ErrorHandler: s.serveError,
		// ReadTimeout bounds the wait for the header from a request's first
		// byte; once the header is in, the body gets BodyReadTimeout, as
		// on the net/http server.
		ReadTimeout: opts.ReadHeaderTimeout,
		HeaderReceived: func(rh *fasthttp.RequestHeader) fasthttp.RequestConfig {
			s.mu.Lock()
			s.inBody[rh] = struct{}{}
			s.mu.Unlock()
			return fasthttp.RequestConfig{ReadTimeout: bodyTimeout}
		},
		IdleTimeout: opts.IdleTimeout,
		// The read buffer bounds the header's size.
		ReadBufferSize:               opts.MaxHeaderBytes,
		MaxRequestBodySize:           int(p.MaxBodyBytes()),
		NoDefaultServerHeader:        true,
		NoDefaultContentType:         true,
		DisablePreParseMultipartForm: true,
		CloseOnShutdown:              true,
		ConnState:                    s.connState,
		Logger:                       fastLogger{s.log},
	}
	return s
}

// fastLogger passes fasthttp's own messages to the pipeline's log.
type fastLogger struct{ log zerolog.Logger }

// Printf logs a fasthttp message at debug level: they are about single
// connections (a client that sent garbage or went away).
func (l fastLogger) Printf(format string, args ...any) {
	l.log.Debug().Str("server", string(ServerFast)).Msgf(format, args...)
}

// connState tracks the open connections for Close. fasthttp also reports
// every request's StateActive and StateIdle, which take no lock.
func (s *fastServer) connState(c net.Conn, st fasthttp.ConnState) {
	switch st {
	case fasthttp.StateNew:
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.gone.forget(c)
	}
}

// Serve accepts connections on ln until Shutdown or Close.
func (s *fastServer) Serve(ln net.Listener) error {
	// Connections read and write with raw system calls (see rawConn).
	err := s.srv.Serve(upstream.Listen(ln))
	if err == nil || s.closed.Load() {
		return http.ErrServerClosed
	}
	return fmt.Errorf("router: fasthttp server on %s: %w", ln.Addr(), err)
}

// Shutdown stops accepting, closes idle connections and waits for requests
// in progress until ctx ends.
func (s *fastServer) Shutdown(ctx context.Context) error {
	s.closed.Store(true)
	err := s.srv.ShutdownWithContext(ctx)
	s.gone.close()
	return err
}

// Close closes the listener and every connection.
func (s *fastServer) Close() error {
	s.closed.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = s.srv.ShutdownWithContext(ctx) // closes the listener and idle connections
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.gone.close()
	return nil
}

// bodyRead forgets that rh's body was being read and reports whether it
// was.
func (s *fastServer) bodyRead(rh *fasthttp.RequestHeader) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.inBody[rh]
	delete(s.inBody, rh)
	return ok
}

// recovered ends a request whose handling panicked as net/http does (which
// fasthttp does not: a panic would end the process): the panic is logged
// with its stack and the connection is closed without an answer.
func (s *fastServer) recovered(ctx *fasthttp.RequestCtx, p any) {
	s.log.Error().Str("server", string(ServerFast)).Interface("panic", p).Bytes("stack", debug.Stack()).
		Msg("panic serving a request; connection closed")
	if c := ctx.Conn(); c != nil {
		_ = c.Close()
	}
}

func (s *fastServer) serve(ctx *fasthttp.RequestCtx) {
	defer func() {
		if p := recover(); p != nil {
			s.recovered(ctx, p)
		}
	}()
	s.bodyRead(&ctx.Request.Header)
	ep, ok := protocol.EndpointForPath(string(ctx.Path()))
	if !ok {
		s.other(ctx)
		return
	}
	x := s.xs.Get().(*fastExchange)
	x.ctx = ctx
	// The request's work ends when the client goes away (see goneWatcher),
	// as r.Context() makes it end on the std front.
	rctx := s.p.NewContext()
	watched := &x.watch
	s.gone.watch(watched, ctx.Conn(), rctx)
	a := serveInference(rctx, s.p, x, x, ep)
	if a == nil || !a.Streamed() {
		if a != nil {
			a.Relay(rctx, x)
		}
		s.gone.unwatch(watched)
		rctx.Cancel()
		s.put(x)
		return
	}
	// x is not pooled again: its watch entry lives until the stream ends.
	// A stream is relayed after the handler returns; the watch goes on
	// until its end (and ends with the connection if it never starts).
	conn := ctx.Conn()
	ctx.SetBodyStreamWriter(func(bw *bufio.Writer) {
		defer rctx.Cancel()
		defer s.gone.unwatch(watched)
		defer func() {
			if p := recover(); p != nil {
				s.log.Error().Str("server", string(ServerFast)).Interface("panic", p).Bytes("stack", debug.Stack()).
					Msg("panic relaying a stream; connection closed")
				_ = conn.Close()
			}
		}()
		a.Relay(rctx, &fastStream{bw: bw, gone: rctx.Cancel})
	})
}

func (s *fastServer) put(x *fastExchange) {
	clear(x.hdr)
	x.ctx, x.wrote, x.watch = nil, false, goneEntry{}
	s.xs.Put(x)
}

// serveError answers a request fasthttp could not read, in the OpenAI
// error shape: 413 for a body over the limit (counted as the handler
// counts it), 431 for a header over the limit, 408 for a client too slow to
// send its header, 400 (counted) for one too slow to send its body, 400
// otherwise. fasthttp closes the connection after it.
func (s *fastServer) serveError(ctx *fasthttp.RequestCtx, err error) {
	inBody := s.bodyRead(&ctx.Request.Header)
	x := s.xs.Get().(*fastExchange)
	x.ctx = ctx
	defer s.put(x)
	var ne net.Error
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		reject(s.p, x, protocol.BodyTooLarge(s.p.MaxBodyBytes()))
	case errors.As(err, &small):
		protocol.WriteError(x, protocol.NewAPIError(http.StatusRequestHeaderFieldsTooLarge, protocol.ErrTypeInvalidRequest, "headers_too_large", "",
			fmt.Sprintf("request headers are larger than the limit of %d bytes", s.srv.ReadBufferSize)))
	case errors.As(err, &ne) && ne.Timeout() && inBody:
		// The header is in, the body was not within BodyReadTimeout: as the
		// net/http front answers it.
		reject(s.p, x, protocol.InvalidRequest("", fmt.Sprintf("reading request body: %v", err)))
	case errors.As(err, &ne) && ne.Timeout():
		protocol.WriteError(x, protocol.NewAPIError(http.StatusRequestTimeout, protocol.ErrTypeInvalidRequest, "request_timeout", "",
			fmt.Sprintf("request headers not received in time: %v", err)))
	default:
		protocol.WriteError(x, protocol.InvalidRequest("", fmt.Sprintf("malformed HTTP request: %v", err)))
	}
}

// fastExchange is a fasthttp request as the httpRequest and the
// http.ResponseWriter of serveInference; pooled. Headers set before
// WriteHeader are copied into fasthttp's response there, and the body is
// buffered in it.
type fastExchange struct {
	ctx   *fasthttp.RequestCtx
	hdr   http.Header
	wrote bool
	watch goneEntry // the request's entry in the goneWatcher
}

func (x *fastExchange) method() string {
	if x.ctx.IsPost() {
		return http.MethodPost
	}
	return string(x.ctx.Method())
}

// check has nothing to add: the path named the endpoint, the body the model.
func (x *fastExchange) Check(*protocol.Request) *protocol.APIError { return nil }

func (x *fastExchange) RequestHeader(name string) (string, bool) {
	h := &x.ctx.Request.Header
	if v := h.Peek(name); len(v) > 0 {
		if string(v) == mimeJSON {
			return mimeJSON, true // the usual Content-Type, without a copy
		}
		return string(v), true
	}
	return "", len(h.PeekAll(name)) > 0
}

func (x *fastExchange) PassHeaders() http.Header {
	out := make(http.Header, 4)
	h := &x.ctx.Request.Header
	for _, k := range passedHeaders() {
		if vs := h.PeekAll(k); len(vs) > 0 {
			ss := make([]string, len(vs))
			for i, v := range vs {
				ss[i] = string(v)
			}
			out[k] = ss
		}
	}
	return out
}

// body returns the request body, which fasthttp has read within the limits
// (ErrorHandler answers a body over MaxBodyBytes). It is valid until the
// fasthttp handler returns, which is after the request is forwarded.
func (x *fastExchange) RequestBody() ([]byte, *protocol.APIError) { return x.ctx.PostBody(), nil }

// Header returns the response headers to be sent by WriteHeader.
func (x *fastExchange) Header() http.Header { return x.hdr }

// WriteHeader copies the headers into fasthttp's response and sets its
// status; later calls do nothing.
func (x *fastExchange) WriteHeader(code int) {
	if x.wrote {
		return
	}
	x.wrote = true
	rh := &x.ctx.Response.Header
	for k, vs := range x.hdr {
		setHeaderValues(rh, k, vs)
	}
	x.ctx.SetStatusCode(code)
}

// writeHead writes an engine's answer head straight into fasthttp's
// response (see headWriter); later calls, or calls after WriteHeader, do
// nothing.
func (x *fastExchange) writeHead(code int, engine http.Header, engineName, requestID string) {
	if x.wrote {
		return
	}
	x.wrote = true
	rh := &x.ctx.Response.Header
	for k, vs := range x.hdr {
		if _, ok := engine[k]; ok && !isHopHeader(k) {
			continue // replaced by the engine's
		}
		setHeaderValues(rh, k, vs)
	}
	for k, vs := range engine {
		if !isHopHeader(k) {
			setHeaderValues(rh, k, vs)
		}
	}
	rh.Set(messages.HeaderEngine, engineName)
	rh.Set(messages.HeaderRequestID, requestID)
	x.ctx.SetStatusCode(code)
}

// setHeaderValues sets k to vs in rh (the first value replacing any).
func setHeaderValues(rh *fasthttp.ResponseHeader, k string, vs []string) {
	for i, v := range vs {
		if i == 0 {
			rh.Set(k, v)
		} else {
			rh.Add(k, v)
		}
	}
}

// Write appends p to the response body.
func (x *fastExchange) Write(p []byte) (int, error) {
	x.WriteHeader(http.StatusOK)
	x.ctx.Response.AppendBody(p)
	return len(p), nil
}

// FlushError does nothing: the buffered body is sent when the handler
// returns.
func (x *fastExchange) FlushError() error { return nil }

// fastStream is the http.ResponseWriter of a streamed answer's body inside
// fasthttp's body stream writer: each flush becomes one chunk on the
// connection. A failed write or flush means the client went away and ends
// gone's context.
type fastStream struct {
	bw   *bufio.Writer
	gone context.CancelFunc
	hdr  http.Header
}

// Header returns a header map that is not sent: the head is already out.
func (f *fastStream) Header() http.Header {
	if f.hdr == nil {
		f.hdr = http.Header{}
	}
	return f.hdr
}

// WriteHeader does nothing: the head is already out.
func (f *fastStream) WriteHeader(int) {}

// Write writes p to the stream.
func (f *fastStream) Write(p []byte) (int, error) {
	n, err := f.bw.Write(p)
	if err != nil {
		f.gone()
	}
	return n, err
}

// FlushError sends what was written as one chunk.
func (f *fastStream) FlushError() error {
	if err := f.bw.Flush(); err != nil {
		f.gone()
		return err
	}
	return nil
}
