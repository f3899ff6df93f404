// Package procruntime holds the Go runtime settings a Switchyard process
// runs with (GOGC, GOMEMLIMIT, GOMAXPROCS): a process concern, set by the
// commands before they start a service, not by the data-plane library.
package procruntime

import (
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
)

// DefaultGCPercent is the garbage collector target the router command sets
// unless told otherwise (Go's default is 100): the router's live heap is
// small (tables, pools, metrics), so a higher target costs little memory
// and saves collections on the request path.
const DefaultGCPercent = 400

// ParseMemoryLimit parses a memory size as GOMEMLIMIT does: a number of
// bytes with an optional unit B, KiB, MiB, GiB or TiB.
func ParseMemoryLimit(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}
	mult := int64(1)
	num := strings.TrimSpace(s)
	for _, u := range units {
		if strings.HasSuffix(num, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("memory limit %q is not a positive size such as 512MiB", s)
	}
	return n * mult, nil
}

// Options are the Go runtime settings a router process runs with.
// The router is latency-bound and allocates little that lives long, so it
// trades memory for fewer garbage collections; and on a small machine
// shared with its engines, fewer OS threads spinning for work can cut both
// its latency and its CPU per request (see BENCHMARKS.md, "Router: proxy
// overhead"). Zero fields leave the runtime's own setting (or GOGC,
// GOMEMLIMIT, GOMAXPROCS from the environment) alone.
type Options struct {
	// MaxProcs sets GOMAXPROCS when > 0.
	MaxProcs int
	// GCPercent sets the garbage collector's target percentage (GOGC) when
	// > 0; a negative value turns the collector off up to MemoryLimit.
	GCPercent int
	// MemoryLimit sets the soft memory limit (GOMEMLIMIT) in bytes when > 0.
	MemoryLimit int64
}

// Apply sets the process's runtime settings from o.
func (o Options) Apply() {
	if o.MaxProcs > 0 {
		runtime.GOMAXPROCS(o.MaxProcs)
	}
	if o.GCPercent != 0 {
		debug.SetGCPercent(o.GCPercent)
	}
	if o.MemoryLimit > 0 {
		debug.SetMemoryLimit(o.MemoryLimit)
	}
}
