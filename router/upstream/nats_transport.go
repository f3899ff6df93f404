package upstream

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

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/selection"
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
// messages.HeaderStatus; the last carries messages.HeaderLast. A streamed answer (status 200
// to a request with "stream": true) is rendered as SSE, one "data:" event
// per reply message and a closing "data: [DONE]"; any other answer is the
// replies' bodies concatenated. NATS has no cancel message: when ctx ends,
// the router unsubscribes and the engine's further replies go nowhere.
type NATSTransport struct {
	opts NATSTransportOptions
	mux  *replyMux
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
	return &NATSTransport{opts: opts, mux: newReplyMux(opts.Conn, opts.PendingLimit)}, nil
}

// errNoResponders means nobody listens on the engine's subject.
var errNoResponders = errors.New("no responders on the engine's NATS subject")

// Forward publishes req to engine.Subject and returns once the first reply
// has arrived.
func (t *NATSTransport) Forward(ctx context.Context, engine selection.Engine, req *Request) (*Response, error) {
	if engine.Subject == "" {
		return nil, fmt.Errorf("router: forward to engine %q: no NATS subject", engine.Name)
	}
	nc := t.opts.Conn
	if !nc.IsConnected() {
		return nil, fmt.Errorf("router: forward to engine %q over NATS: %w", engine.Name, nats.ErrConnectionClosed)
	}
	sub, inbox, err := t.mux.open()
	if err != nil {
		return nil, fmt.Errorf("router: forward to engine %q: subscribe to replies: %w", engine.Name, err)
	}
	msg := nats.NewMsg(engine.Subject)
	msg.Reply = inbox
	msg.Data = req.Body
	if req.RequestID != "" {
		msg.Header.Set(messages.NATSHeaderRequestID, req.RequestID)
	}
	if s := req.Header.Get(messages.HeaderSessionID); s != "" {
		msg.Header.Set(messages.NATSHeaderSessionID, s)
	}
	if err := nc.PublishMsg(msg); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("router: forward to engine %q on %s: %w", engine.Name, engine.Subject, err)
	}
	first, err := sub.next(ctx, t.opts.FirstReplyTimeout)
	if err != nil {
		_ = sub.Unsubscribe()
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			err = ErrFirstReplyTimeout
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
	if e, _ := Header(first.Header, messages.NATSHeaderEngine); e != "" {
		hdr.Set(messages.HeaderEngine, e)
	}
	return &Response{Status: status, Header: hdr, Body: b}, nil
}

// replyStatus reads messages.HeaderStatus; a reply without a valid one is a 502.
func replyStatus(m *nats.Msg) int {
	s, err := strconv.Atoi(m.Header.Get(messages.HeaderStatus))
	if err != nil || s < 100 || s > 599 {
		return http.StatusBadGateway
	}
	return s
}

// Replies is a response body that is a stream of reply messages (a NATS
// engine's answer): a front that relays messages reads them one by one
// rather than as bytes.
type Replies interface {
	NextReply() (data []byte, last bool, err error)
}

// natsBody relays reply messages as a response body.
type natsBody struct {
	ctx  context.Context
	sub  *replyQueue
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
		var err error
		m, err = b.sub.next(b.ctx, b.idle)
		if err != nil {
			if b.ctx.Err() != nil {
				return nil, b.ctx.Err()
			}
			if errors.Is(err, context.DeadlineExceeded) {
				return nil, fmt.Errorf("engine reply stream: %w", ErrFirstReplyTimeout)
			}
			return nil, fmt.Errorf("engine reply stream: %w", err)
		}
	}
	if m.Header.Get(messages.HeaderLast) == "true" {
		b.done = true
		_ = b.sub.Unsubscribe()
	}
	return m, nil
}

// NextReply returns the data of the next reply message, whether it is the
// last, or io.EOF after the last one (Replies).
func (b *natsBody) NextReply() (data []byte, last bool, err error) {
	m, err := b.nextReply()
	if err != nil {
		return nil, false, err
	}
	return m.Data, b.done, nil
}

// FirstInHand reports true: Forward returns only once the first reply
// arrived.
func (b *natsBody) FirstInHand() bool { return true }

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

// ErrFirstReplyTimeout is wrapped by transports when an engine does not
// start answering in time.
var ErrFirstReplyTimeout = errors.New("no reply from the engine within the first-reply timeout")

// ErrNoTransport is returned (wrapped) by TransportPolicy.Forward for an
// engine it knows no way to reach: no URL and no subject, from the table
// or the engine's signals. It is the router's lack of an address, not the
// engine's failure: the handler passes over the engine without counting
// anything against it.
var ErrNoTransport = errors.New("no usable transport")

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
	Endpoints control.EndpointResolver
	// PreferNATS prefers NATS when an engine offers both.
	PreferNATS bool
}

// Forward resolves engine's endpoints and forwards req on the chosen
// transport.
func (p *TransportPolicy) Forward(ctx context.Context, engine selection.Engine, req *Request) (*Response, error) {
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
	return nil, fmt.Errorf("router: forward to engine %q: %w (url %q, subject %q)",
		engine.Name, ErrNoTransport, engine.URL, engine.Subject)
}

// replyMux receives the replies of every request a transport forwards on one
// wildcard inbox subscription, as nats.go's own Request does, and hands each
// to the queue of its request by the last token of its subject. A
// subscription per request would cost a subscribe and an unsubscribe on the
// server and a large channel allocation in the client for every request.
type replyMux struct {
	nc      *nats.Conn
	pending int

	mu     sync.Mutex
	prefix string // "<inbox>." once subscribed
	sub    *nats.Subscription
	seq    uint64
	queues map[string]*replyQueue
}

func newReplyMux(nc *nats.Conn, pending int) *replyMux {
	return &replyMux{nc: nc, pending: pending, queues: make(map[string]*replyQueue)}
}

// open registers a new request and returns its queue and reply subject.
func (m *replyMux) open() (*replyQueue, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sub == nil {
		prefix := m.nc.NewInbox() + "."
		sub, err := m.nc.Subscribe(prefix+"*", m.deliver)
		if err != nil {
			return nil, "", err
		}
		_ = sub.SetPendingLimits(-1, -1)
		m.prefix, m.sub = prefix, sub
	}
	m.seq++
	token := strconv.FormatUint(m.seq, 36)
	q := &replyQueue{mux: m, token: token, limit: m.pending, ready: make(chan struct{}, 1)}
	m.queues[token] = q
	return q, m.prefix + token, nil
}

// deliver routes one reply message to its request's queue; replies to
// requests already closed are dropped.
func (m *replyMux) deliver(msg *nats.Msg) {
	token := msg.Subject[len(m.prefix):]
	m.mu.Lock()
	q := m.queues[token]
	m.mu.Unlock()
	if q != nil {
		q.push(msg)
	}
}

func (m *replyMux) close(token string) {
	m.mu.Lock()
	delete(m.queues, token)
	m.mu.Unlock()
}

// replyQueue holds one request's reply messages until they are read.
type replyQueue struct {
	mux   *replyMux
	token string
	limit int
	ready chan struct{}

	mu       sync.Mutex
	msgs     []*nats.Msg
	overflow bool
}

// errReplyOverflow means an engine sent more reply messages than the
// pending limit before the router read them.
var errReplyOverflow = errors.New("too many unread reply messages")

func (q *replyQueue) push(m *nats.Msg) {
	q.mu.Lock()
	if len(q.msgs) >= q.limit {
		q.overflow = true
	} else {
		q.msgs = append(q.msgs, m)
	}
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// next returns the next reply, waiting at most timeout.
func (q *replyQueue) next(ctx context.Context, timeout time.Duration) (*nats.Msg, error) {
	var timer *time.Timer
	for {
		q.mu.Lock()
		if q.overflow {
			q.mu.Unlock()
			return nil, errReplyOverflow
		}
		if len(q.msgs) > 0 {
			m := q.msgs[0]
			q.msgs[0] = nil
			q.msgs = q.msgs[1:]
			q.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			return m, nil
		}
		q.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(timeout)
			defer timer.Stop()
		}
		select {
		case <-q.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer.C:
			return nil, context.DeadlineExceeded
		}
	}
}

// Unsubscribe stops delivery to this request; it never fails.
func (q *replyQueue) Unsubscribe() error {
	q.mux.close(q.token)
	return nil
}
