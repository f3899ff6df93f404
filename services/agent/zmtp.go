package agent

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

// maxZMQFrame bounds one ZMQ frame from an engine: the ZMQ library
// allocates whatever length a frame header claims, so the agent checks
// headers on the byte stream before the library reads them.
const maxZMQFrame = 16 << 20

// maxZMQFrames bounds the frames of one ZMQ message (vLLM sends three).
const maxZMQFrames = 16

// frameGuard wraps an engine's ZMQ connection and fails the read that
// would hand the ZMQ library a frame header claiming more than maxZMQFrame
// bytes, or a message of more than maxZMQFrames frames.
type frameGuard struct {
	net.Conn
	greet  int    // greeting bytes still to pass (64 in ZMTP 3)
	hdr    []byte // the frame header read so far
	body   uint64 // body bytes of the current frame still to pass
	frames int    // frames of the current message so far
}

func newFrameGuard(c net.Conn) *frameGuard { return &frameGuard{Conn: c, greet: 64} }

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
			if size > maxZMQFrame {
				return fmt.Errorf("agent: ZMQ frame of %d bytes from %s (limit %d)", size, g.RemoteAddr(), maxZMQFrame)
			}
			g.frames++
			if g.frames > maxZMQFrames {
				return fmt.Errorf("agent: ZMQ message of more than %d frames from %s", maxZMQFrames, g.RemoteAddr())
			}
			if flags&0x01 == 0 { // no MORE: the message ends with this frame
				g.frames = 0
			}
			g.body = size
		}
	}
	return nil
}

// tcpAddr returns host:port of a tcp:// ZMQ endpoint.
func tcpAddr(endpoint string) (string, error) {
	addr, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return "", fmt.Errorf("ZMQ endpoint %q: want tcp://host:port", endpoint)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", fmt.Errorf("ZMQ endpoint %q: %v", endpoint, err)
	}
	return addr, nil
}

// dialZMQ opens a ZMTP connection of socket type typ to a tcp:// endpoint,
// through a frameGuard. The caller closes the returned net.Conn.
func dialZMQ(ctx context.Context, endpoint string, typ zmq4.SocketType) (*zmq4.Conn, net.Conn, error) {
	addr, err := tcpAddr(endpoint)
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
