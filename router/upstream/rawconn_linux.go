//go:build linux

package upstream

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// rawConn is a TCP connection whose reads and writes are raw system calls
// on its non-blocking socket, made from the runtime poller's callback
// (syscall.RawConn), so that the Go runtime is not told about them.
//
// Why: net.Conn's Read and Write go through syscall.Syscall, whose
// entersyscall wakes the runtime's sysmon thread whenever it is in its deep
// sleep, which it enters each time every P is idle — that is, each time
// the router waits for a client or an engine. At a few hundred requests a
// second, an idle router thus woke sysmon twice per request (once after the
// client's request arrived, once after the engine's answer), and sysmon
// then slept at least once in 20 µs steps before sleeping deeply again:
// about 4 of the 5.8 voluntary context switches per request, against 2 for
// the request's own two waits (see BENCHMARKS.md, "Router: proxy
// overhead"). A read or write on a non-blocking socket never blocks, so it
// needs none of what entersyscall provides (handing the P to another
// thread while the call blocks); waiting for readiness is still the
// poller's, with deadlines as on the plain connection.
//
// Everything but Read and Write is the embedded *net.TCPConn's; a concurrent
// Read (or Write) waits for the one in progress, as on net.Conn.
type rawConn struct {
	*net.TCPConn
	rc syscall.RawConn

	rmu   sync.Mutex // held across a Read: guards rbuf, rn, rerr
	rbuf  []byte
	rn    int
	rerr  syscall.Errno
	rfunc func(fd uintptr) bool

	wmu   sync.Mutex // held across a Write: guards wbuf, wn, werr
	wbuf  []byte
	wn    int
	werr  syscall.Errno
	wfunc func(fd uintptr) bool
}

// wrapRaw returns c as a rawConn when it is a TCP connection, else c.
func wrapRaw(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	r := &rawConn{TCPConn: tc, rc: rc}
	r.rfunc, r.wfunc = r.readFD, r.writeFD
	return r
}

// readFD reads once into rbuf; false means "not ready, wait".
func (c *rawConn) readFD(fd uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&c.rbuf[0])), uintptr(len(c.rbuf)))
		switch e {
		case 0:
			c.rn = int(n)
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		c.rerr = e
		return true
	}
}

// writeFD writes what is left of wbuf; false means "not writable, wait".
func (c *rawConn) writeFD(fd uintptr) bool {
	for c.wn < len(c.wbuf) {
		p := c.wbuf[c.wn:]
		n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		switch e {
		case 0:
			c.wn += int(n)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			c.werr = e
			return true
		}
	}
	return true
}

// Read reads from the connection as net.Conn's Read does: io.EOF at the
// end of the stream, *net.OpError otherwise (os.ErrDeadlineExceeded past
// the read deadline, net.ErrClosed once closed).
func (c *rawConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.rmu.Lock()
	c.rbuf, c.rn, c.rerr = p, 0, 0
	err := c.rc.Read(c.rfunc)
	n, errno := c.rn, c.rerr
	c.rbuf = nil
	c.rmu.Unlock()
	switch {
	case err != nil:
		return 0, c.opError("read", err)
	case errno != 0:
		return 0, c.opError("read", os.NewSyscallError("read", errno))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of p as net.Conn's Write does, or fails with a
// *net.OpError.
func (c *rawConn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.wmu.Lock()
	c.wbuf, c.wn, c.werr = p, 0, 0
	err := c.rc.Write(c.wfunc)
	n, errno := c.wn, c.werr
	c.wbuf = nil
	c.wmu.Unlock()
	switch {
	case err != nil:
		return n, c.opError("write", err)
	case errno != 0:
		return n, c.opError("write", os.NewSyscallError("write", errno))
	}
	return n, nil
}

// opError wraps err as the plain connection would: the poller's own errors
// come from RawConn inside an OpError of op "raw-read"/"raw-write".
func (c *rawConn) opError(op string, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		err = oe.Err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// rawListener accepts TCP connections as rawConns.
type rawListener struct{ net.Listener }

// Accept waits for the next connection.
func (l rawListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return wrapRaw(c), nil
}

// Listen returns ln accepting its TCP connections as connections that read
// and write with raw system calls, as the transport's own do (rawConn);
// the router's fasthttp front serves through it.
func Listen(ln net.Listener) net.Listener { return rawListener{ln} }
