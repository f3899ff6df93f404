package testenv

import (
	"testing"
	"time"
)

// WaitFor polls cond every few milliseconds until it returns true, and fails the
// test with msg if timeout passes first. Use it instead of sleeping.
func WaitFor(tb testing.TB, timeout time.Duration, msg string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	wait := time.Millisecond
	for {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("condition not met within %s: %s", timeout, msg)
		}
		time.Sleep(wait)
		if wait < 50*time.Millisecond {
			wait *= 2
		}
	}
}
