//go:build !linux

package router

import "net"

// wrapRaw returns c: raw-syscall connections exist on Linux only.
func wrapRaw(c net.Conn) net.Conn { return c }

// rawListen returns ln.
func rawListen(ln net.Listener) net.Listener { return ln }
