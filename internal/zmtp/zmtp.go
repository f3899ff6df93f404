// Package zmtp holds what Switchyard adds to the ZMQ library
// (github.com/go-zeromq/zmq4) to speak to and for vLLM's KV event sockets
// safely: a guard on the byte stream that refuses frames larger than
// MaxFrame before the library allocates them, and dialling and accepting
// ZMTP connections through it.
package zmtp

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

// MaxFrame bounds one ZMQ frame from a peer: the ZMQ library allocates
// whatever length a frame header claims, so headers are checked on the byte
// stream before the library reads them. 16 MiB is twice vLLM's largest
// honest KV event batch (messages.MaxVLLMBatchSize).
const MaxFrame = 16 << 20

// MaxFrames bounds the frames of one ZMQ message (vLLM sends three).
const MaxFrames = 16

// frameGuard wraps a ZMQ connection and fails the read that would hand
// the ZMQ library a frame header claiming more than MaxFrame bytes, or a
// message of more than MaxFrames frames.
type frameGuard struct {
	net.Conn
	greet  int    // greeting bytes still to pass (64 in ZMTP 3)
	hdr    []byte // the frame header read so far
	body   uint64 // body bytes of the current frame still to pass
	frames int    // frames of the current message so far
}

func newFrameGuard(c net.Conn) *frameGuard { return &frameGuard{Conn: c, greet: 64} }

// Read reads from the connection and checks what it read.
func (g *frameGuard) Read(p []byte) (int, error) {
	n, err := g.Conn.Read(p)
	if n > 0 {
		if verr := g.check(p[:n]); verr != nil {
			_ = g.Conn.Close()
			return 0, verr
		}
	}
	return n, err
}

func (g *frameGuard) check(b []byte) error {
	for len(b) > 0 {
		switch {
		case g.greet > 0:
			k := min(g.greet, len(b))
			g.greet -= k
			b = b[k:]
		case g.body > 0:
			k := min(g.body, uint64(len(b)))
			g.body -= k
			b = b[k:]
		default:
			g.hdr = append(g.hdr, b[0])
			b = b[1:]
			flags := g.hdr[0]
			need := 2
			if flags&0x02 != 0 {
				need = 9
			}
			if len(g.hdr) < need {
				continue
			}
			size := uint64(g.hdr[1])
			if need == 9 {
				size = binary.BigEndian.Uint64(g.hdr[1:9])
			}
			g.hdr = g.hdr[:0]
			if size > MaxFrame {
				return fmt.Errorf("zmtp: ZMQ frame of %d bytes from %s (limit %d)", size, g.RemoteAddr(), MaxFrame)
			}
			g.frames++
			if g.frames > MaxFrames {
				return fmt.Errorf("zmtp: ZMQ message of more than %d frames from %s", MaxFrames, g.RemoteAddr())
			}
			if flags&0x01 == 0 { // no MORE: the message ends with this frame
				g.frames = 0
			}
			g.body = size
		}
	}
	return nil
}

// TCPAddr returns host:port of a tcp:// ZMQ endpoint.
func TCPAddr(endpoint string) (string, error) {
	addr, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return "", fmt.Errorf("ZMQ endpoint %q: want tcp://host:port", endpoint)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", fmt.Errorf("ZMQ endpoint %q: %v", endpoint, err)
	}
	return addr, nil
}

// Dial opens a ZMTP connection of socket type typ to a tcp:// endpoint,
// through a frame guard; ctx bounds the dial and the handshake. The caller
// closes the returned net.Conn.
func Dial(ctx context.Context, endpoint string, typ zmq4.SocketType) (*zmq4.Conn, net.Conn, error) {
	addr, err := TCPAddr(endpoint)
	if err != nil {
		return nil, nil, err
	}
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	guarded := newFrameGuard(raw)
	if dl, ok := ctx.Deadline(); ok {
		_ = raw.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = raw.Close() })
	defer stop()
	zc, err := zmq4.Open(guarded, null.Security(), typ, nil, false, nil)
	if err != nil {
		_ = raw.Close()
		return nil, nil, fmt.Errorf("ZMQ handshake with %s: %w", endpoint, err)
	}
	_ = raw.SetDeadline(time.Time{})
	return zc, raw, nil
}

// Listen binds a tcp:// endpoint.
func Listen(endpoint string) (net.Listener, error) {
	addr, err := TCPAddr(endpoint)
	if err != nil {
		return nil, err
	}
	return net.Listen("tcp", addr)
}

// Accept accepts one connection on l and completes the ZMTP handshake as a
// socket of type typ through a frame guard, within timeout. A failed
// handshake closes the connection and returns its error; only a failing
// listener returns a nil net.Conn and an error wrapping net.ErrClosed or
// the accept error.
func Accept(l net.Listener, typ zmq4.SocketType, timeout time.Duration) (*zmq4.Conn, net.Conn, error) {
	raw, err := l.Accept()
	if err != nil {
		return nil, nil, err
	}
	_ = raw.SetDeadline(time.Now().Add(timeout))
	zc, err := zmq4.Open(newFrameGuard(raw), null.Security(), typ, nil, true, nil)
	if err != nil {
		_ = raw.Close()
		return nil, raw, fmt.Errorf("ZMQ handshake with %s: %w", raw.RemoteAddr(), err)
	}
	_ = raw.SetDeadline(time.Time{})
	return zc, raw, nil
}
