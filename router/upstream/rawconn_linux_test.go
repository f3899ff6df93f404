//go:build linux

package upstream

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/selection"
)

// rawPair returns a connected pair over loopback TCP: the accepted side as
// a rawConn, the dialled side plain.
func rawPair(t *testing.T) (raw, plain net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	plain, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plain.Close() })
	c, err := Listen(ln).Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, ok := c.(*rawConn); !ok {
		t.Fatalf("Listen accepted a %T, want *rawConn", c)
	}
	return c, plain
}

// TestRawConnTransfersBytes: many megabytes each way, concurrently, in
// reads and writes of random sizes, arrive intact — the writes larger than
// the socket buffers (partial writes, waits for writability) and the reads
// that find nothing (waits for readability) included.
func TestRawConnTransfersBytes(t *testing.T) {
	raw, plain := rawPair(t)
	const size = 8 << 20
	out, in := make([]byte, size), make([]byte, size)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range out {
		out[i] = byte(rng.Uint32())
	}
	for i := range in {
		in[i] = byte(rng.Uint32())
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	chunks := func(w io.Writer, b []byte, seed uint64) {
		defer wg.Done()
		r := rand.New(rand.NewPCG(seed, seed))
		for len(b) > 0 {
			n := min(len(b), 1+r.IntN(1<<20))
			m, err := w.Write(b[:n])
			if err != nil || m != n {
				errs <- errors.Join(err, errors.New("short write"))
				return
			}
			b = b[n:]
		}
	}
	got := func(r io.Reader, want []byte) {
		defer wg.Done()
		buf := make([]byte, 0, len(want))
		p := make([]byte, 70000)
		for len(buf) < len(want) {
			n, err := r.Read(p)
			buf = append(buf, p[:n]...)
			if err != nil {
				errs <- err
				return
			}
		}
		if !bytes.Equal(buf, want) {
			errs <- errors.New("bytes differ")
		}
	}
	wg.Add(4)
	go chunks(raw, out, 3)
	go chunks(plain, in, 4)
	go got(plain, out)
	go got(raw, in)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestRawConnErrors: the end of the stream, a reset, deadlines and a closed
// connection read as on a plain TCP connection.
func TestRawConnErrors(t *testing.T) {
	t.Run("eof", func(t *testing.T) {
		raw, plain := rawPair(t)
		if _, err := plain.Write([]byte("hi")); err != nil {
			t.Fatal(err)
		}
		_ = plain.Close()
		b, err := io.ReadAll(raw)
		if err != nil || string(b) != "hi" {
			t.Fatalf("ReadAll = %q, %v; want the bytes sent and a clean end", b, err)
		}
		if n, err := raw.Read(make([]byte, 8)); n != 0 || err != io.EOF {
			t.Fatalf("Read after the end = %d, %v; want 0, io.EOF", n, err)
		}
	})
	t.Run("reset", func(t *testing.T) {
		raw, plain := rawPair(t)
		_ = plain.(*net.TCPConn).SetLinger(0)
		_ = plain.Close()
		_, err := raw.Read(make([]byte, 8))
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("Read after a reset: %v; want ECONNRESET", err)
		}
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "read" {
			t.Fatalf("Read after a reset: %#v; want a *net.OpError of op read", err)
		}
	})
	t.Run("write after reset", func(t *testing.T) {
		raw, plain := rawPair(t)
		_ = plain.(*net.TCPConn).SetLinger(0)
		_ = plain.Close()
		// The first writes may land before the reset is seen; SIGPIPE is
		// the runtime's to ignore, as for a plain connection.
		var err error
		for i := 0; i < 100 && err == nil; i++ {
			_, err = raw.Write([]byte("x"))
			if err == nil {
				time.Sleep(5 * time.Millisecond)
			}
		}
		if !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("Write to a reset connection: %v; want EPIPE or ECONNRESET", err)
		}
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "write" {
			t.Fatalf("Write to a reset connection: %#v; want a *net.OpError of op write", err)
		}
	})
	t.Run("read deadline", func(t *testing.T) {
		raw, _ := rawPair(t)
		_ = raw.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
		start := time.Now()
		_, err := raw.Read(make([]byte, 8))
		checkTimeout(t, "read", err)
		if time.Since(start) < 20*time.Millisecond {
			t.Fatalf("Read timed out after %v, before its deadline", time.Since(start))
		}
		// Cleared, the connection reads again.
		_ = raw.SetReadDeadline(time.Time{})
	})
	t.Run("write deadline", func(t *testing.T) {
		raw, _ := rawPair(t) // the peer never reads
		big := make([]byte, 64<<20)
		_ = raw.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
		n, err := raw.Write(big)
		checkTimeout(t, "write", err)
		if n <= 0 || n >= len(big) {
			t.Fatalf("Write wrote %d of %d bytes before its deadline; want some, not all", n, len(big))
		}
	})
	t.Run("closed", func(t *testing.T) {
		raw, _ := rawPair(t)
		done := make(chan error, 1)
		go func() {
			_, err := raw.Read(make([]byte, 8))
			done <- err
		}()
		time.Sleep(20 * time.Millisecond) // let the read wait (it must end either way)
		_ = raw.Close()
		select {
		case err := <-done:
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("Read blocked when closed: %v; want net.ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not end a waiting Read")
		}
		if _, err := raw.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Write after Close: %v; want net.ErrClosed", err)
		}
	})
}

func checkTimeout(t *testing.T, op string, err error) {
	t.Helper()
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%s past its deadline: %v; want a timeout (os.ErrDeadlineExceeded)", op, err)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != op || oe.Net != "tcp" {
		t.Fatalf("%s past its deadline: %#v; want a *net.OpError of op %s", op, err, op)
	}
}

// TestWrapRawOnlyTCP: a connection that is not TCP is left as it is.
func TestWrapRawOnlyTCP(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if c := wrapRaw(a); c != a {
		t.Fatalf("wrapRaw(pipe) = %T, want the pipe itself", c)
	}
}

// TestTransportUsesRawConns: the HTTP transport reaches engines over
// rawConns (the point of rawConn: no sysmon wake-up per request).
func TestTransportUsesRawConns(t *testing.T) {
	engineLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	answer := `{"id":"x","object":"chat.completion","choices":[]}`
	engine := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer)
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = engine.Serve(engineLn) }()
	t.Cleanup(func() { _ = engine.Close() })
	engineURL := "http://" + engineLn.Addr().String()

	tr := NewHTTPTransport(HTTPTransportOptions{})
	resp, err := tr.Forward(context.Background(), selection.Engine{Name: "e", URL: engineURL, Weight: 1},
		&Request{Endpoint: protocol.EndpointChat, Model: "m", Body: []byte(`{"model":"m"}`), Header: http.Header{}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.Status != http.StatusOK || string(body) != answer {
		t.Fatalf("through the transport: %d %q, want 200 and the engine's answer", resp.Status, body)
	}
	p := tr.pool(engineURL)
	p.mu.Lock()
	idle := len(p.idle)
	for _, c := range p.idle {
		if _, ok := c.nc.(*rawConn); !ok {
			t.Errorf("the transport reaches the engine over a %T, want *rawConn", c.nc)
		}
	}
	p.mu.Unlock()
	if idle == 0 {
		t.Error("the transport pooled no connection to the engine after a request")
	}
}
