package natsfront

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/internal/poison"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/upstream"
	"github.com/switchyard-dev/switchyard/streams"
)

// Pipeline is the router's request pipeline as the NATS front calls it
// (router.Handler implements it).
type Pipeline interface {
	// Begin runs the pipeline up to the engine's answer: the request's
	// checks, its route and its forward with retries. It returns the
	// answer to relay, or the rejection to send, already counted.
	Begin(ctx context.Context, r protocol.ClientRequest) (Answer, *Rejection)
	// MaxBodyBytes is the request body limit.
	MaxBodyBytes() int64
	// Now reads the pipeline's clock.
	Now() time.Time
	// Registry receives the front's metrics.
	Registry() prometheus.Registerer
}

// Answer is a request an engine answered: the front relays Body with the
// head (Status, Engine, RequestID), then calls Record and Release.
type Answer interface {
	RequestID() string
	Engine() string
	Status() int
	// Streamed reports whether the client asked for a streamed answer.
	Streamed() bool
	Body() io.Reader
	// Record ends the answer's bookkeeping: n bytes relayed, the first
	// sent at first, err the relay's failure on the engine's side.
	Record(ctx context.Context, n int64, first time.Time, err error)
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

// Options configures New. Conn, Cluster and Pipeline are required.
type Options struct {
	// Conn is the NATS connection; the caller owns it.
	Conn *nats.Conn
	// Names is the NATS layout (default streams.DefaultNames()).
	Names streams.Names
	// Cluster is the router's frontend cluster.
	Cluster string
	// Pipeline is the router's request pipeline, shared with the HTTP
	// front: its tables, selection, live guard, transport, observer and
	// metrics.
	Pipeline Pipeline
	// MaxConcurrent bounds the requests served at once (default 4096);
	// beyond it requests get a fast 429.
	MaxConcurrent int
	// RequestTimeout bounds one request end to end, as a NATS client cannot
	// signal that it went away (default 5 minutes).
	RequestTimeout time.Duration
	// Logger receives the front's logs (component=router and cluster are added).
	Logger zerolog.Logger
}

// Front takes OpenAI requests over NATS on
// <prefix>.req.<cluster>.<model>, in the queue group "sy-router-<cluster>"
// shared by the cluster's routers. The request body is the OpenAI JSON
// (chat when it has "messages", else completions); the optional headers
// x-session-id and x-request-id act as over HTTP. The engine is chosen
// exactly as by the HTTP front. Answers follow the engines' protocol:
// every reply message carries messages.HeaderStatus (and x-switchyard-engine,
// x-request-id), the last carries messages.HeaderLast; a streamed answer is one
// message per chunk (the JSON of one SSE event, without "data: " and
// without the closing [DONE]); errors are one OpenAI error JSON message
// (404 unknown model, 400 malformed, 413 too large, 503 no engine, 502
// engine failure, 429 router overloaded).
type Front struct {
	opts   Options
	p      Pipeline
	log    zerolog.Logger
	poison *poison.Guard
	sem    chan struct{}
	wg     sync.WaitGroup
}

// QueueGroup returns the queue group of cluster's routers.
func QueueGroup(cluster string) string { return streams.RequestQueue(cluster) }

// New returns a NATS front for opts; Run starts it.
func New(opts Options) (*Front, error) {
	if opts.Conn == nil || opts.Pipeline == nil {
		return nil, errors.New("router: new NATS front: Conn and Pipeline are required")
	}
	if err := messages.CheckName("cluster", opts.Cluster); err != nil {
		return nil, fmt.Errorf("router: new NATS front: %w", err)
	}
	if opts.Names.Prefix == "" {
		opts.Names = streams.DefaultNames()
	}
	if opts.MaxConcurrent <= 0 {
		opts.MaxConcurrent = 4096
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = 5 * time.Minute
	}
	log := opts.Logger.With().Str("component", "router").Str("cluster", opts.Cluster).Logger()
	guard, err := poison.New(poison.Options{Component: "router", Logger: log, Registerer: opts.Pipeline.Registry(), Now: opts.Pipeline.Now})
	if err != nil {
		return nil, fmt.Errorf("router: new NATS front: %w", err)
	}
	return &Front{
		opts:   opts,
		p:      opts.Pipeline,
		log:    log,
		poison: guard,
		sem:    make(chan struct{}, opts.MaxConcurrent),
	}, nil
}

// Subject returns the wildcard subject the front subscribes to.
func (f *Front) Subject() string { return f.opts.Names.Prefix + ".req." + f.opts.Cluster + ".*" }

// Run serves requests until ctx ends, then unsubscribes and waits for the
// requests in progress, which are cancelled.
func (f *Front) Run(ctx context.Context) error {
	sub, err := f.opts.Conn.QueueSubscribe(f.Subject(), QueueGroup(f.opts.Cluster), func(m *nats.Msg) {
		f.accept(ctx, m)
	})
	if err != nil {
		return fmt.Errorf("router: NATS front: subscribe to %s: %w", f.Subject(), err)
	}
	<-ctx.Done()
	_ = sub.Unsubscribe()
	f.wg.Wait()
	return nil
}

// accept hands a request to its own goroutine, or answers 429 at once when
// MaxConcurrent requests are in progress.
func (f *Front) accept(ctx context.Context, m *nats.Msg) {
	if m.Reply == "" || ctx.Err() != nil {
		return // a publish, not a request: nobody to answer
	}
	select {
	case f.sem <- struct{}{}:
	default:
		hdr := nats.Header{}
		hdr.Set("Retry-After", "1")
		f.replyError(m, hdr, protocol.NewAPIError(http.StatusTooManyRequests, protocol.ErrTypeUnavailable, "router_overloaded", "",
			fmt.Sprintf("the router is serving %d NATS requests, its limit", f.opts.MaxConcurrent)), "")
		return
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer func() { <-f.sem }()
		// A request whose handling panics gets a final 500 (after any part
		// of its answer already sent) instead of ending the process.
		defer f.poison.Recover("nats_front", m.Subject, func() {
			f.replyError(m, nil, protocol.NewAPIError(http.StatusInternalServerError, protocol.ErrTypeServer, "internal_error", "",
				"the router failed while serving this request"), "")
		})
		f.serve(ctx, m)
	}()
}

// replyError answers e as one final OpenAI error message.
func (f *Front) replyError(m *nats.Msg, hdr nats.Header, e *protocol.APIError, reqID string) {
	body, _ := json.Marshal(struct {
		Error *protocol.APIError `json:"error"`
	}{e})
	if hdr == nil {
		hdr = nats.Header{}
	}
	if reqID != "" {
		hdr.Set(messages.NATSHeaderRequestID, reqID)
	}
	f.publish(m.Reply, hdr, e.Status, true, body)
}

func (f *Front) publish(subject string, hdr nats.Header, status int, last bool, body []byte) {
	out := &nats.Msg{Subject: subject, Header: nats.Header{}, Data: body}
	for k, vs := range hdr {
		out.Header[k] = vs
	}
	out.Header.Set(messages.HeaderStatus, strconv.Itoa(status))
	if last {
		out.Header.Set(messages.HeaderLast, "true")
	}
	if err := f.opts.Conn.PublishMsg(out); err != nil {
		f.log.Debug().Err(err).Msg("NATS reply not sent")
	}
}

// natsRequest is a NATS request message as the pipeline's protocol.ClientRequest:
// its headers (x-request-id, x-session-id, x-switchyard-priority and the
// API key headers authorization, api-key, x-api-key; no others are
// read), no header forwarded but the session, and the body within the
// handler's limit once its subject is checked.
type natsRequest struct {
	f *Front
	m *nats.Msg
	// model is the model the subject names, set by body.
	model string
}

func (r *natsRequest) RequestHeader(name string) (string, bool) {
	switch name {
	case messages.HeaderRequestID:
		return upstream.Header(r.m.Header, messages.NATSHeaderRequestID)
	case messages.HeaderSessionID:
		return upstream.Header(r.m.Header, messages.NATSHeaderSessionID)
	case messages.HeaderPriority:
		return upstream.Header(r.m.Header, messages.NATSHeaderPriority)
	case messages.HeaderAuthorization: // the front door's API key (router/tenant)
		return upstream.Header(r.m.Header, messages.NATSHeaderAuthorization)
	case messages.HeaderAPIKey:
		return upstream.Header(r.m.Header, messages.NATSHeaderAPIKey)
	case messages.HeaderXAPIKey:
		return upstream.Header(r.m.Header, messages.NATSHeaderXAPIKey)
	}
	return "", false
}

func (r *natsRequest) PassHeaders() http.Header {
	hdr := make(http.Header, 1)
	if session, _ := r.RequestHeader(messages.HeaderSessionID); session != "" {
		hdr.Set(messages.HeaderSessionID, session)
	}
	return hdr
}

func (r *natsRequest) RequestBody() ([]byte, *protocol.APIError) {
	f := r.f
	toks, ok := f.opts.Names.ParseSubject(r.m.Subject, "req", 2)
	if !ok {
		return nil, protocol.InvalidRequest("", fmt.Sprintf("subject %q is not %s.req.<cluster>.<model>", r.m.Subject, f.opts.Names.Prefix))
	}
	r.model = toks[1]
	if limit := f.p.MaxBodyBytes(); int64(len(r.m.Data)) > limit {
		return nil, protocol.BodyTooLarge(limit)
	}
	return r.m.Data, nil
}

func (r *natsRequest) Check(req *protocol.Request) *protocol.APIError {
	if req.Model != r.model {
		return protocol.InvalidRequest("model", fmt.Sprintf("'model' is %q but the request was sent to the subject of model %q", req.Model, r.model))
	}
	return nil
}

// serve runs the pipeline for one NATS request and relays the answer as
// reply messages.
func (f *Front) serve(ctx context.Context, m *nats.Msg) {
	rctx, cancel := context.WithTimeout(ctx, f.opts.RequestTimeout)
	defer cancel()
	in := natsRequest{f: f, m: m}
	a, rej := f.p.Begin(rctx, &in)
	if a == nil {
		hdr := nats.Header{}
		if rej.RetryAfter != "" {
			hdr.Set("Retry-After", rej.RetryAfter)
		}
		f.replyError(m, hdr, rej.Err, rej.RequestID)
		return
	}
	defer a.Release()
	out := nats.Header{}
	out.Set(messages.NATSHeaderRequestID, a.RequestID())
	out.Set(messages.NATSHeaderEngine, a.Engine())
	status := a.Status()
	var first time.Time
	var n int64
	send := func(last bool, data []byte) {
		if first.IsZero() {
			first = f.p.Now()
		}
		n += int64(len(data))
		f.publish(m.Reply, out, status, last, data)
	}
	rbody := a.Body()
	var err error
	if a.Streamed() && status == http.StatusOK {
		err = f.relayStream(rbody, f.maxReplyChunk(), send)
	} else {
		err = f.relayWhole(rbody, send)
	}
	a.Record(rctx, n, first, err)
}

// maxReplyChunk bounds one reply message's body below the server's payload
// limit, leaving room for headers.
func (f *Front) maxReplyChunk() int {
	n := int(f.opts.Conn.MaxPayload()) - 4096
	if n < 1024 {
		n = 1024
	}
	return n
}

// relayWhole sends a non-streamed answer: the body in as few messages as
// the payload limit allows, the last one marked.
func (f *Front) relayWhole(body io.Reader, send func(last bool, data []byte)) error {
	data, err := io.ReadAll(io.LimitReader(body, 256<<20))
	if err != nil {
		send(true, nil) // the receiver must not hang
		return err
	}
	max := f.maxReplyChunk()
	for len(data) > max {
		send(false, data[:max])
		data = data[max:]
	}
	send(true, data)
	return nil
}

// relayStream sends a streamed answer, one message per chunk. Replies from
// a NATS engine are relayed as they are; an SSE body is split into its
// events' data, dropping [DONE], each event at most maxEvent bytes. The
// last message is marked; when the stream breaks, an empty last message
// ends it so the client never hangs.
func (f *Front) relayStream(body io.Reader, maxEvent int, send func(last bool, data []byte)) error {
	if rs, ok := body.(upstream.Replies); ok {
		for {
			data, last, err := rs.NextReply()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				send(true, nil)
				return err
			}
			send(last, data)
		}
	}
	var held []byte
	haveHeld := false
	err := readSSE(body, maxEvent, func(data []byte) {
		if bytes.Equal(data, []byte("[DONE]")) {
			return
		}
		if haveHeld {
			send(false, held)
		}
		held, haveHeld = data, true
	})
	send(true, held)
	return err
}

// errEventTooLarge fails an SSE stream with an event larger than the limit.
var errEventTooLarge = errors.New("router: SSE event larger than the reply limit")

// readSSE calls fn with the data of every event of an SSE stream (several
// data lines of one event are joined with newlines). An event whose data
// exceeds maxEvent bytes fails the stream with errEventTooLarge: it could
// not be relayed as one reply message, and reading lines without a bound
// would let one engine answer grow the router's memory without limit.
func readSSE(r io.Reader, maxEvent int, fn func(data []byte)) error {
	br := bufio.NewReaderSize(r, 32<<10)
	var data, long []byte
	have := false
	// A line may hold "data:", a space and the event's data, and its end.
	maxLine := maxEvent + len("data: \r\n")
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull || len(long) > 0 {
			// A line longer than the buffer: gather it, within the bound.
			if len(long)+len(line) > maxLine {
				return fmt.Errorf("%w: a line of more than %d bytes", errEventTooLarge, maxLine)
			}
			long = append(long, line...)
			if err == bufio.ErrBufferFull {
				continue
			}
			line = long
		}
		if len(line) > 0 {
			line = bytes.TrimRight(line, "\r\n")
			switch {
			case len(line) == 0:
				if have {
					fn(data)
					data, have = nil, false
				}
			case bytes.HasPrefix(line, []byte("data:")):
				v := bytes.TrimPrefix(line[5:], []byte(" "))
				if have {
					data = append(data, '\n')
				}
				if len(data)+len(v) > maxEvent {
					return fmt.Errorf("%w: more than %d bytes", errEventTooLarge, maxEvent)
				}
				data = append(data, v...)
				have = true
			}
		}
		long = long[:0]
		if err == io.EOF {
			if have {
				fn(data)
			}
			return nil
		}
		if err != nil {
			return err
		}
	}
}
