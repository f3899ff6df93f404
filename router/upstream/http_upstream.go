package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/protocol"
)

// The router's own HTTP/1.1 client for plain-http engines. Unlike
// net/http's Transport, which runs a read loop and a write loop goroutine
// per connection and hands every request and response between them and the
// caller through channels, it writes the request and reads the response in
// the caller's goroutine, on a keep-alive connection taken from the engine's
// pool. A cancelled context closes the connection (context.AfterFunc),
// which unblocks any read or write on it; a connection goes back to the
// pool only when its response was read to the end and nothing went wrong.

// Bounds on an engine's response head.
const (
	maxResponseHeaderLines = 256
	maxResponseHeadBytes   = 64 << 10
	max1xxResponses        = 5
)

// errUpstreamClosed marks a reused keep-alive connection the engine closed
// before sending a byte of the response: the request is sent again on a new
// connection (the engine had dropped an idle connection).
var errUpstreamClosed = errors.New("engine closed the kept-alive connection before answering")

// upstreamPool is the keep-alive pool of one engine base URL.
type upstreamPool struct {
	addr   string // host:port to dial
	host   string // Host header
	prefix string // base URL path, without a trailing slash

	mu   sync.Mutex
	idle []*upstreamConn // most recently used last
}

// upstreamConn is one connection to an engine.
type upstreamConn struct {
	nc        net.Conn
	br        *bufio.Reader
	bw        *bufio.Writer
	idleSince time.Time
	reused    bool
}

// newUpstreamPool returns the pool of the engine base URL u, or an error
// saying why it cannot be used (only plain http is).
func newUpstreamPool(u *url.URL) (*upstreamPool, error) {
	if u.Scheme != "http" {
		return nil, fmt.Errorf("scheme %q is not http", u.Scheme)
	}
	if u.Hostname() == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("base URL %q is not http://host[:port][/path]", u.Redacted())
	}
	port := u.Port()
	if port == "" {
		port = "80"
	}
	return &upstreamPool{addr: net.JoinHostPort(u.Hostname(), port), host: u.Host, prefix: trimSlash(u.EscapedPath())}, nil
}

func trimSlash(s string) string {
	for len(s) > 0 && s[len(s)-1] == '/' {
		s = s[:len(s)-1]
	}
	return s
}

// get returns an idle connection of the pool younger than idleTimeout, or
// nil; it closes the expired ones.
func (p *upstreamPool) get(now time.Time, idleTimeout time.Duration) *upstreamConn {
	p.mu.Lock()
	n := len(p.idle)
	if n == 0 {
		p.mu.Unlock()
		return nil
	}
	c := p.idle[n-1]
	p.idle[n-1] = nil
	p.idle = p.idle[:n-1]
	var expired []*upstreamConn
	if now.Sub(c.idleSince) >= idleTimeout {
		// The newest is expired, so all are.
		expired = append(p.idle, c)
		p.idle = nil
		c = nil
	}
	p.mu.Unlock()
	for _, e := range expired {
		_ = e.nc.Close()
	}
	return c
}

// put returns c to the pool, or closes it when the pool holds max.
func (p *upstreamPool) put(c *upstreamConn, now time.Time, max int) {
	c.idleSince = now
	c.reused = true
	p.mu.Lock()
	if len(p.idle) < max {
		p.idle = append(p.idle, c)
		c = nil
	}
	p.mu.Unlock()
	if c != nil {
		_ = c.nc.Close()
	}
}

// closeIdle closes the idle connections idle since before cutoff (all of
// them for a zero cutoff).
func (p *upstreamPool) closeIdle(cutoff time.Time) {
	p.mu.Lock()
	var closing []*upstreamConn
	keep := p.idle[:0]
	for _, c := range p.idle {
		if cutoff.IsZero() || c.idleSince.Before(cutoff) {
			closing = append(closing, c)
		} else {
			keep = append(keep, c)
		}
	}
	clear(p.idle[len(keep):])
	p.idle = keep
	p.mu.Unlock()
	for _, c := range closing {
		_ = c.nc.Close()
	}
}

// dial opens a new connection to the pool's engine.
func (t *HTTPTransport) dial(ctx context.Context, p *upstreamPool) (*upstreamConn, error) {
	nc, err := t.dialer.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	nc = wrapRaw(nc) // reads and writes with raw system calls (see rawConn)
	return &upstreamConn{nc: nc, br: bufio.NewReaderSize(nc, t.opts.bufSize()), bw: bufio.NewWriterSize(nc, t.opts.bufSize())}, nil
}

// roundTrip forwards req to the pool's engine, on a pooled connection when
// one is idle, and sends it once more on a new connection when a reused
// one turns out closed by the engine.
func (t *HTTPTransport) roundTrip(ctx context.Context, p *upstreamPool, req *Request) (*Response, error) {
	for {
		c := p.get(t.now(), t.opts.IdleConnTimeout)
		if c == nil {
			var err error
			if c, err = t.dial(ctx, p); err != nil {
				return nil, err
			}
		}
		resp, err := t.exchange(ctx, p, c, req)
		if errors.Is(err, errUpstreamClosed) && ctx.Err() == nil {
			continue
		}
		return resp, err
	}
}

// exchange writes req on c and reads the response head. On success the
// response's body owns c; on error c is closed.
func (t *HTTPTransport) exchange(ctx context.Context, p *upstreamPool, c *upstreamConn, req *Request) (*Response, error) {
	stop := CloseOnCancel(ctx, c.nc)
	fail := func(err error) (*Response, error) {
		stop.StopClose()
		_ = c.nc.Close()
		if cerr := ctx.Err(); cerr != nil {
			return nil, fmt.Errorf("%w (%w)", cerr, err)
		}
		return nil, err
	}
	writeRequestHead(c.bw, p, req)
	_, _ = c.bw.Write(req.Body)
	if err := c.bw.Flush(); err != nil {
		if c.reused {
			return fail(fmt.Errorf("%w: write: %w", errUpstreamClosed, err))
		}
		return fail(fmt.Errorf("write request: %w", err))
	}
	if d := t.opts.ResponseHeaderTimeout; d > 0 {
		_ = c.nc.SetReadDeadline(t.now().Add(d))
	}
	if _, err := c.br.Peek(1); err != nil {
		if c.reused && !isTimeout(err) {
			return fail(fmt.Errorf("%w: %w", errUpstreamClosed, err))
		}
		return fail(fmt.Errorf("read response: %w", err))
	}
	head, err := readResponseHead(c.br)
	if err != nil {
		return fail(err)
	}
	if t.opts.ResponseHeaderTimeout > 0 {
		_ = c.nc.SetReadDeadline(time.Time{})
	}
	b := &upstreamBody{t: t, p: p, c: c, stop: stop, keep: head.keepAlive, left: head.contentLength}
	switch {
	case head.noBody:
		b.done = true
	case head.chunked:
		b.chunks = httputil.NewChunkedReader(c.br)
	case head.contentLength < 0:
		b.keep = false // delimited by the connection's end
	}
	return &Response{Status: head.status, Header: head.header, Body: b}, nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// writeRequestHead writes the request line and headers of req.
func writeRequestHead(w *bufio.Writer, p *upstreamPool, req *Request) {
	_, _ = w.WriteString("POST ")
	_, _ = w.WriteString(p.prefix)
	_, _ = w.WriteString(req.Endpoint.Path())
	_, _ = w.WriteString(" HTTP/1.1\r\nHost: ")
	_, _ = w.WriteString(p.host)
	_, _ = w.WriteString("\r\nContent-Type: application/json\r\nContent-Length: ")
	_, _ = w.Write(strconv.AppendInt(w.AvailableBuffer(), int64(len(req.Body)), 10))
	_, _ = w.WriteString("\r\n")
	if req.RequestID != "" && validFieldValue(req.RequestID) {
		writeField(w, messages.HeaderRequestID, req.RequestID)
	}
	for k, vs := range req.Header {
		switch k {
		case "Host", "Content-Type", "Content-Length", "Transfer-Encoding", "Connection", messages.HeaderRequestID:
			continue
		}
		if !validFieldName(k) {
			continue
		}
		for _, v := range vs {
			if validFieldValue(v) {
				writeField(w, k, v)
			}
		}
	}
	_, _ = w.WriteString("\r\n")
}

func writeField(w *bufio.Writer, k, v string) {
	_, _ = w.WriteString(k)
	_, _ = w.WriteString(": ")
	_, _ = w.WriteString(v)
	_, _ = w.WriteString("\r\n")
}

// validFieldName reports whether k is an HTTP token.
func validFieldName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if !isTokenByte(k[i]) {
			return false
		}
	}
	return true
}

func isTokenByte(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

// validFieldValue reports whether v holds no control bytes but tab.
func validFieldValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// responseHead is a parsed response status line and header.
type responseHead struct {
	status        int
	header        http.Header
	contentLength int64 // -1 when unknown
	chunked       bool
	noBody        bool
	keepAlive     bool
}

// readResponseHead reads an HTTP/1.x response head from r, skipping 1xx
// interim responses. It rejects what it cannot frame safely: a malformed
// status line or header line, an unsupported transfer coding, conflicting
// or invalid Content-Length values, a 101 (no upgrade is asked for), or a
// head larger than maxResponseHeadBytes.
func readResponseHead(r *bufio.Reader) (responseHead, error) {
	for interim := 0; ; interim++ {
		h, err := readOneHead(r)
		if err != nil {
			return h, err
		}
		if h.status >= 100 && h.status < 200 {
			if h.status == http.StatusSwitchingProtocols {
				return h, errors.New("engine response: unexpected 101 Switching Protocols")
			}
			if interim >= max1xxResponses {
				return h, fmt.Errorf("engine response: more than %d interim 1xx responses", max1xxResponses)
			}
			continue
		}
		return h, nil
	}
}

func readOneHead(r *bufio.Reader) (responseHead, error) {
	h := responseHead{contentLength: -1}
	total := 0
	line, err := readLine(r, &total)
	if err != nil {
		return h, fmt.Errorf("engine response: read status line: %w", err)
	}
	// HTTP/1.x SP 3DIGIT [SP reason]
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || (line[7] != '0' && line[7] != '1') ||
		line[8] != ' ' || (len(line) > 12 && line[12] != ' ') {
		return h, fmt.Errorf("engine response: malformed status line %q", protocol.Clip(line))
	}
	h.keepAlive = line[7] == '1'
	code := 0
	for _, c := range line[9:12] {
		if c < '0' || c > '9' {
			return h, fmt.Errorf("engine response: malformed status code in %q", protocol.Clip(line))
		}
		code = code*10 + int(c-'0')
	}
	if code < 100 {
		return h, fmt.Errorf("engine response: status code %d out of range", code)
	}
	h.status = code
	h.header = make(http.Header, 8)
	var slab []string // backing store of single header values, as textproto does
	for lines := 0; ; lines++ {
		line, err := readLine(r, &total)
		if err != nil {
			return h, fmt.Errorf("engine response: read header: %w", err)
		}
		if len(line) == 0 {
			break
		}
		if lines >= maxResponseHeaderLines {
			return h, fmt.Errorf("engine response: more than %d header lines", maxResponseHeaderLines)
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			return h, fmt.Errorf("engine response: malformed header line %q", protocol.Clip(line))
		}
		name := line[:colon]
		for _, c := range name {
			if !isTokenByte(c) {
				return h, fmt.Errorf("engine response: malformed header name %q", protocol.Clip(name))
			}
		}
		value := bytes.Trim(line[colon+1:], " \t")
		for _, c := range value {
			if (c < ' ' && c != '\t') || c == 0x7f {
				return h, fmt.Errorf("engine response: control byte in header %q", protocol.Clip(name))
			}
		}
		key := headerKey(name)
		if vs, ok := h.header[key]; ok {
			h.header[key] = append(vs, headerValue(value))
			continue
		}
		if len(slab) == cap(slab) {
			slab = make([]string, 0, 8)
		}
		slab = append(slab, headerValue(value))
		h.header[key] = slab[len(slab)-1 : len(slab) : len(slab)]
	}
	if err := h.frame(); err != nil {
		return h, err
	}
	return h, nil
}

// headerKey returns the canonical form of the header name b, without
// allocating for the names engines usually send.
func headerKey(b []byte) string {
	var buf [32]byte
	if len(b) <= len(buf) {
		k := buf[:len(b)]
		upper := true
		for i, c := range b {
			switch {
			case upper && c >= 'a' && c <= 'z':
				c -= 'a' - 'A'
			case !upper && c >= 'A' && c <= 'Z':
				c += 'a' - 'A'
			}
			k[i] = c
			upper = c == '-'
		}
		switch string(k) {
		case "Content-Type":
			return "Content-Type"
		case "Content-Length":
			return "Content-Length"
		case "Date":
			return "Date"
		case "Transfer-Encoding":
			return "Transfer-Encoding"
		case "Connection":
			return "Connection"
		case "Cache-Control":
			return "Cache-Control"
		case "X-Request-Id":
			return messages.HeaderRequestID
		case "X-Switchyard-Engine":
			return messages.HeaderEngine
		}
	}
	return textproto.CanonicalMIMEHeaderKey(string(b))
}

// headerValue returns the header value b as a string, without allocating
// for the values engines usually send.
func headerValue(b []byte) string {
	switch string(b) {
	case "application/json":
		return "application/json"
	case "text/event-stream":
		return "text/event-stream"
	case "no-cache":
		return "no-cache"
	case "chunked":
		return "chunked"
	case "keep-alive":
		return "keep-alive"
	case "close":
		return "close"
	}
	return string(b)
}

// frame works out the body's framing and the connection's reuse from the
// header, and removes Transfer-Encoding (the body is handed on decoded).
func (h *responseHead) frame() error {
	for _, v := range h.header["Connection"] {
		for _, tok := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "close") {
				h.keepAlive = false
			}
		}
	}
	te := h.header["Transfer-Encoding"]
	delete(h.header, "Transfer-Encoding")
	if len(te) > 0 {
		if len(te) != 1 || !strings.EqualFold(strings.TrimSpace(te[0]), "chunked") {
			return fmt.Errorf("engine response: unsupported Transfer-Encoding %q", te)
		}
		// A Content-Length beside chunked is ignored, and the connection
		// is not reused (RFC 9112 6.3).
		if _, ok := h.header["Content-Length"]; ok {
			delete(h.header, "Content-Length")
			h.keepAlive = false
		}
		h.chunked = true
	}
	if cls := h.header["Content-Length"]; len(cls) > 0 && !h.chunked {
		n, err := parseContentLength(cls[0])
		if err != nil {
			return err
		}
		for _, v := range cls[1:] {
			if m, err := parseContentLength(v); err != nil || m != n {
				return fmt.Errorf("engine response: conflicting Content-Length values %q", cls)
			}
		}
		h.contentLength = n
	}
	if h.status == http.StatusNoContent || h.status == http.StatusNotModified {
		h.noBody, h.chunked, h.contentLength = true, false, 0
	}
	if !h.chunked && h.contentLength == 0 {
		h.noBody = true
	}
	return nil
}

func parseContentLength(v string) (int64, error) {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > 18 {
		return 0, fmt.Errorf("engine response: invalid Content-Length %q", v)
	}
	var n int64
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, fmt.Errorf("engine response: invalid Content-Length %q", v)
		}
		n = n*10 + int64(v[i]-'0')
	}
	return n, nil
}

// readLine reads one CRLF- (or LF-) terminated line without its ending,
// adding its length to *total and failing past maxResponseHeadBytes. The
// line aliases r's buffer until the next read.
func readLine(r *bufio.Reader, total *int) ([]byte, error) {
	line, err := r.ReadSlice('\n')
	*total += len(line)
	if errors.Is(err, bufio.ErrBufferFull) || *total > maxResponseHeadBytes {
		return nil, fmt.Errorf("response head larger than %d bytes", maxResponseHeadBytes)
	}
	if err != nil {
		if err == io.EOF && len(line) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// upstreamBody is an engine response's body, read from its connection in
// the reader's goroutine. Close returns the connection to its pool when the
// body was read to its end, else closes it.
type upstreamBody struct {
	t      *HTTPTransport
	p      *upstreamPool
	c      *upstreamConn
	stop   CloseStopper
	chunks io.Reader // chunked bodies; nil otherwise
	left   int64     // Content-Length bodies: bytes not yet read; -1: until the connection ends
	keep   bool      // the connection may be reused once the body is read
	done   bool      // the body was read to its end
	err    error     // sticky read error
	closed bool
}

// Read reads the body.
func (b *upstreamBody) Read(p []byte) (int, error) {
	if b.closed {
		return 0, errors.New("read on closed engine response body")
	}
	if b.done {
		return 0, io.EOF
	}
	if b.err != nil {
		return 0, b.err
	}
	var n int
	var err error
	switch {
	case b.chunks != nil:
		n, err = b.chunks.Read(p)
		if err == io.EOF {
			if terr := b.readTrailer(); terr != nil {
				err = terr
			}
		}
	case b.left >= 0:
		if int64(len(p)) > b.left {
			p = p[:b.left]
		}
		n, err = b.c.br.Read(p)
		b.left -= int64(n)
		if b.left == 0 {
			err = io.EOF
		} else if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
	default:
		n, err = b.c.br.Read(p)
	}
	switch {
	case err == io.EOF:
		b.done = true
	case err != nil:
		b.keep = false
		b.err = err
	}
	return n, err
}

// readTrailer consumes a chunked body's trailer section (dropped).
func (b *upstreamBody) readTrailer() error {
	total := 0
	for {
		line, err := readLine(b.c.br, &total)
		if err != nil {
			return fmt.Errorf("engine response: read chunked trailer: %w", err)
		}
		if len(line) == 0 {
			return nil
		}
	}
}

// Close releases the body's connection: back to the pool when the body was
// read to its end on a reusable connection and its context is live, else
// closed.
func (b *upstreamBody) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	live := b.stop.StopClose()
	if live && b.done && b.keep && b.c.br.Buffered() == 0 {
		b.p.put(b.c, b.t.now(), b.t.opts.MaxIdleConnsPerEngine)
		return nil
	}
	_ = b.c.nc.Close()
	return nil
}
