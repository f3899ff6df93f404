//go:build !linux

package upstream

import "net"

// wrapRaw returns c: raw-syscall connections exist on Linux only.
func wrapRaw(c net.Conn) net.Conn { return c }

// Listen returns ln.
func Listen(ln net.Listener) net.Listener { return ln }
