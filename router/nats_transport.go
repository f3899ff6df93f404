package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Headers of the NATS inference protocol, shared with engines (they equal
// the engine SDK's engine.HeaderLast and engine.HeaderStatus; the router
// does not import the SDK).
const (
	// HeaderLast marks the last reply message of a NATS inference request,
	// with the value "true".
	HeaderLast = "Sy-Last"
	// HeaderStatus carries an HTTP-like status code on every reply message.
	HeaderStatus = "Sy-Status"
)

// NATSTransportOptions tunes NewNATSTransport. Conn is required.
type NATSTransportOptions struct {
	// Conn is the NATS connection; the caller owns it.
	Conn *nats.Conn
	// FirstReplyTimeout bounds the wait for an engine's first reply message
	// (default 60 s: a non-streamed answer arrives whole).
	FirstReplyTimeout time.Duration
	// IdleTimeout bounds the wait between two reply messages of a streamed
	// answer (default 60 s).
	IdleTimeout time.Duration
	// PendingLimit bounds the reply messages buffered per request (default
	// 65536).
	PendingLimit int
}

// NATSTransport forwards requests by NATS request-reply to the engine's
// inference subject (Engine.Subject): it subscribes to a fresh inbox,
// publishes the request body with the inbox as reply subject, and relays
// the reply messages in order as the response body. Every reply carries
// HeaderStatus; the last carries HeaderLast. A streamed answer (status 200
// to a request with "stream": true) is rendered as SSE, one "data:" event
// per reply message and a closing "data: [DONE]"; any other answer is the
// replies' bodies concatenated. NATS has no cancel message: when ctx ends,
// the router unsubscribes and the engine's further replies go nowhere.
type NATSTransport struct {
	opts NATSTransportOptions
}

// NewNATSTransport returns a NATS transport for opts.
func NewNATSTransport(opts NATSTransportOptions) (*NATSTransport, error) {
	if opts.Conn == nil {
		return nil, errors.New("router: new NATS transport: Conn is nil")
	}
	if opts.FirstReplyTimeout <= 0 {
		opts.FirstReplyTimeout = 60 * time.Second
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = 60 * time.Second
	}
	if opts.PendingLimit <= 0 {
		opts.PendingLimit = 65536
	}
	return &NATSTransport{opts: opts}, nil
}

// errNoResponders means nobody listens on the engine's subject.
var errNoResponders = errors.New("no responders on the engine's NATS subject")

// Forward publishes req to engine.Subject and returns once the first reply
// has arrived.
func (t *NATSTransport) Forward(ctx context.Context, engine Engine, req *UpstreamRequest) (*UpstreamResponse, error) {
	if engine.Subject == "" {
		return nil, fmt.Errorf("router: forward to engine %q: no NATS subject", engine.Name)
	}
	nc := t.opts.Conn
	if !nc.IsConnected() {
		return nil, fmt.Errorf("router: forward to engine %q over NATS: %w", engine.Name, nats.ErrConnectionClosed)
	}
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("router: forward to engine %q: subscribe to reply inbox: %w", engine.Name, err)
	}
	_ = sub.SetPendingLimits(t.opts.PendingLimit, 256<<20)
	msg := nats.NewMsg(engine.Subject)
	msg.Reply = inbox
	msg.Data = req.Body
	if req.RequestID != "" {
		msg.Header.Set(natsHeaderRequestID, req.RequestID)
	}
	if s := req.Header.Get(headerSessionID); s != "" {
		msg.Header.Set(natsHeaderSessionID, s)
	}
	if err := nc.PublishMsg(msg); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("router: forward to engine %q on %s: %w", engine.Name, engine.Subject, err)
	}
	fctx, cancel := context.WithTimeout(ctx, t.opts.FirstReplyTimeout)
	first, err := sub.NextMsgWithContext(fctx)
	cancel()
	if err != nil {
		_ = sub.Unsubscribe()
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			err = errFirstReplyTimeout
		}
		return nil, fmt.Errorf("router: forward to engine %q on %s: %w", engine.Name, engine.Subject, err)
	}
	if first.Header.Get("Status") == "503" && len(first.Data) == 0 {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("router: forward to engine %q on %s: %w", engine.Name, engine.Subject, errNoResponders)
	}
	status := replyStatus(first)
	b := &natsBody{ctx: ctx, sub: sub, next: first, idle: t.opts.IdleTimeout, sse: req.Stream && status == http.StatusOK}
	hdr := make(http.Header, 2)
	if b.sse {
		hdr.Set("Content-Type", "text/event-stream")
		hdr.Set("Cache-Control", "no-cache")
	} else {
		hdr.Set("Content-Type", "application/json")
	}
	if e, _ := natsHeader(first.Header, natsHeaderEngine); e != "" {
		hdr.Set(headerEngine, e)
	}
	return &UpstreamResponse{Status: status, Header: hdr, Body: b}, nil
}

// replyStatus reads HeaderStatus; a reply without a valid one is a 502.
func replyStatus(m *nats.Msg) int {
	s, err := strconv.Atoi(m.Header.Get(HeaderStatus))
	if err != nil || s < 100 || s > 599 {
		return http.StatusBadGateway
	}
	return s
}

// natsBody relays reply messages as a response body.
type natsBody struct {
	ctx  context.Context
	sub  *nats.Subscription
	idle time.Duration
	sse  bool

	mu     sync.Mutex
	next   *nats.Msg // a received message not yet consumed
	buf    []byte    // rendered bytes not yet read
	done   bool      // the last message has been consumed
	closed bool
}

// nextReply returns the next reply message, waiting at most the idle
// timeout, or io.EOF after the last one.
func (b *natsBody) nextReply() (*nats.Msg, error) {
	if b.done {
		return nil, io.EOF
	}
	m := b.next
	b.next = nil
	if m == nil {
		ctx, cancel := context.WithTimeout(b.ctx, b.idle)
		var err error
		m, err = b.sub.NextMsgWithContext(ctx)
		cancel()
		if err != nil {
			if b.ctx.Err() != nil {
				return nil, b.ctx.Err()
			}
			if errors.Is(err, context.DeadlineExceeded) {
				return nil, fmt.Errorf("engine reply stream: %w", errFirstReplyTimeout)
			}
			return nil, fmt.Errorf("engine reply stream: %w", err)
		}
	}
	if m.Header.Get(HeaderLast) == "true" {
		b.done = true
		_ = b.sub.Unsubscribe()
	}
	return m, nil
}

// Read renders reply messages into p.
func (b *natsBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.buf) == 0 {
		if b.closed {
			return 0, io.ErrClosedPipe
		}
		m, err := b.nextReply()
		if err == io.EOF {
			return 0, io.EOF
		}
		if err != nil {
			return 0, err
		}
		if b.sse {
			if len(m.Data) > 0 {
				b.buf = append(b.buf, "data: "...)
				b.buf = append(b.buf, m.Data...)
				b.buf = append(b.buf, "\n\n"...)
			}
			if b.done {
				b.buf = append(b.buf, "data: [DONE]\n\n"...)
			}
		} else {
			b.buf = append(b.buf, m.Data...)
		}
	}
	n := copy(p, b.buf)
	b.buf = b.buf[n:]
	if len(b.buf) == 0 {
		b.buf = b.buf[:0:0]
	}
	return n, nil
}

// Close stops receiving replies.
func (b *natsBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.closed = true
		if !b.done {
			_ = b.sub.Unsubscribe()
		}
	}
	return nil
}

// TransportPolicy chooses how to reach each engine. The rule: prefer HTTP
// when the engine advertises an HTTP URL (pooled keep-alive connections,
// and a client disconnect reaches the engine as a closed connection), else
// NATS request-reply on its subject; PreferNATS reverses the preference.
// The engine's live endpoints (from its signals) win over those in the
// table, which were current when the table was built.
type TransportPolicy struct {
	// HTTP forwards to engines with a URL (nil: never over HTTP).
	HTTP Transport
	// NATS forwards to engines with a subject (nil: never over NATS).
	NATS Transport
	// Endpoints resolves engines' live endpoints (optional).
	Endpoints EndpointResolver
	// PreferNATS prefers NATS when an engine offers both.
	PreferNATS bool
}

// Forward resolves engine's endpoints and forwards req on the chosen
// transport.
func (p *TransportPolicy) Forward(ctx context.Context, engine Engine, req *UpstreamRequest) (*UpstreamResponse, error) {
	if p.Endpoints != nil {
		if ep, ok := p.Endpoints.Endpoints(req.Model, engine.Name); ok {
			if ep.URL != "" {
				engine.URL = ep.URL
			}
			if ep.Subject != "" {
				engine.Subject = ep.Subject
			}
		}
	}
	useHTTP := engine.URL != "" && p.HTTP != nil
	useNATS := engine.Subject != "" && p.NATS != nil
	switch {
	case useHTTP && useNATS && p.PreferNATS:
		return p.NATS.Forward(ctx, engine, req)
	case useHTTP:
		return p.HTTP.Forward(ctx, engine, req)
	case useNATS:
		return p.NATS.Forward(ctx, engine, req)
	}
	return nil, fmt.Errorf("router: forward to engine %q: no usable transport (url %q, subject %q)",
		engine.Name, engine.URL, engine.Subject)
}
