//go:build !linux

package testenv

import "time"

// ThreadCPU runs f and returns the wall time it took (other systems: no
// per-thread CPU clock here).
func ThreadCPU(f func()) time.Duration {
	start := time.Now()
	f()
	return time.Since(start)
}
