//go:build unix

package optimizer

import (
	"syscall"
	"time"
)

// cpuTime returns the CPU time (user and system) the process has used so far: on a machine
// shared with other jobs it measures the solver's work without the time it waited for a core.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
