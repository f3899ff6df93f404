//go:build unix

package httpfront

import "syscall"

// peekGone peeks at socket fd without blocking or consuming and reports
// whether its peer closed or reset it.
func peekGone(fd uintptr) bool {
	var b [1]byte
	for {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK:
			return false // open, nothing sent
		case err != nil:
			return true // reset
		default:
			return n == 0 // end of stream: closed; bytes: there
		}
	}
}
