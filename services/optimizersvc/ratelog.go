package optimizersvc

import (
	"sync"
	"time"
)

// rateLimiter allows one event per source per interval, remembering at most
// max sources (the oldest are forgotten first when full).
type rateLimiter struct {
	mu       sync.Mutex
	interval time.Duration
	max      int
	last     map[string]time.Time
}

func newRateLimiter(interval time.Duration, max int) *rateLimiter {
	return &rateLimiter{interval: interval, max: max, last: make(map[string]time.Time)}
}

// allow reports whether an event from source may be logged now.
func (r *rateLimiter) allow(source string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.last[source]; ok && now.Sub(t) < r.interval {
		return false
	}
	if len(r.last) >= r.max {
		for k, t := range r.last {
			if now.Sub(t) >= r.interval {
				delete(r.last, k)
			}
		}
		if len(r.last) >= r.max {
			return false
		}
	}
	r.last[source] = now
	return true
}
