package zmtp

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// TestFrameGuard feeds the guard ZMTP byte streams: frames within the
// limits pass, a header claiming more than MaxFrame bytes or a message of
// too many frames fails before the ZMQ library could allocate.
func TestFrameGuard(t *testing.T) {
	greeting := make([]byte, 64)
	long := func(size uint64) []byte {
		h := []byte{0x02, 0, 0, 0, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint64(h[1:], size)
		return h
	}
	many := []byte{}
	for range MaxFrames + 1 {
		many = append(many, 0x01, 0)
	}
	for _, tc := range []struct {
		name   string
		stream []byte
		ok     bool
	}{
		{"short frames", append(append([]byte{}, greeting...), 0x01, 2, 'a', 'b', 0x00, 1, 'c'), true},
		{"a long frame within the limit", append(append(append([]byte{}, greeting...), long(3)...), 'x', 'y', 'z'), true},
		{"a header claiming 2^62 bytes", append(append([]byte{}, greeting...), long(1<<62)...), false},
		{"a header claiming one byte over the limit", append(append([]byte{}, greeting...), long(MaxFrame+1)...), false},
		{"too many frames in one message", append(append([]byte{}, greeting...), many...), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Fed one byte at a time and all at once: headers split across reads too.
			for _, step := range []int{1, len(tc.stream)} {
				c, peer := net.Pipe()
				defer c.Close()
				defer peer.Close()
				g := newFrameGuard(c)
				var err error
				for i := 0; i < len(tc.stream) && err == nil; i += step {
					err = g.check(tc.stream[i:min(i+step, len(tc.stream))])
				}
				if (err == nil) != tc.ok {
					t.Fatalf("step %d: check = %v, want ok %v", step, err, tc.ok)
				}
			}
		})
	}
}

// TestAcceptHostile accepts a peer that completes the handshake and then
// claims a frame of 2^40 bytes: the read fails, nothing is allocated, and
// the listener goes on accepting.
func TestAcceptHostile(t *testing.T) {
	l, err := Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for range 2 {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		greeting := make([]byte, 64)
		greeting[0], greeting[9], greeting[10] = 0xff, 0x7f, 3
		copy(greeting[12:], "NULL")
		ready := []byte("\x05READY\x0bSocket-Type\x00\x00\x00\x03SUB")
		hostile := []byte{0x02, 0, 0, 1, 0, 0, 0, 0, 0}
		if _, err := c.Write(append(append(append(greeting, 0x04, byte(len(ready))), ready...), hostile...)); err != nil {
			t.Fatal(err)
		}
		zc, raw, err := Accept(l, zmq4.Pub, 5*time.Second)
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		if _, err := zc.RecvMsg(); err == nil {
			t.Fatal("a frame of 2^40 bytes was read")
		}
		_ = raw.Close()
		_ = c.Close()
	}
	if _, err := TCPAddr("ipc:///tmp/x"); err == nil {
		t.Fatal("an ipc endpoint passed as tcp")
	}
}
