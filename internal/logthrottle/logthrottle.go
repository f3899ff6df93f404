// Package logthrottle limits how often a service logs about one source (a
// subject, a key), so that a stream of bad messages from one publisher yields
// one log line per interval instead of one per message.
package logthrottle

import (
	"sync"
	"time"
)

// Throttle allows one event per source per interval, remembering at most
// max sources (those idle for an interval are forgotten first when full;
// while it is full of active sources, new ones are not logged).
type Throttle struct {
	mu       sync.Mutex
	interval time.Duration
	max      int
	last     map[string]time.Time
}

// New returns a Throttle allowing one event per source per interval for at
// most max sources.
func New(interval time.Duration, max int) *Throttle {
	return &Throttle{interval: interval, max: max, last: make(map[string]time.Time)}
}

// Allow reports whether an event from source may be logged now.
func (r *Throttle) Allow(source string, now time.Time) bool {
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
