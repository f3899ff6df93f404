package testenv

import (
	"runtime"
	"syscall"
	"time"
)

// ThreadCPU runs f on one locked OS thread and returns the CPU time that
// thread spent in it, so that a budget check measures the work and not the
// time other processes of a shared machine held the core.
func ThreadCPU(f func()) time.Duration {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var a, b syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_THREAD, &a) != nil {
		start := time.Now()
		f()
		return time.Since(start)
	}
	f()
	_ = syscall.Getrusage(syscall.RUSAGE_THREAD, &b)
	return time.Duration(syscall.TimevalToNsec(b.Utime) + syscall.TimevalToNsec(b.Stime) -
		syscall.TimevalToNsec(a.Utime) - syscall.TimevalToNsec(a.Stime))
}
