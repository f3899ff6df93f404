//go:build !unix

package httpfront

// peekGone cannot tell on this platform; a client that goes away is noticed
// when the answer is written to it.
func peekGone(uintptr) bool { return false }
