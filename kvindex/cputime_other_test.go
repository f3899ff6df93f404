//go:build !linux

package kvindex

import "time"

// threadCPU runs f and returns the wall time it took (other systems: no
// per-thread CPU clock here).
func threadCPU(f func()) time.Duration {
	start := time.Now()
	f()
	return time.Since(start)
}
