// Package logthrottle limits how often a service logs about bad input: one
// line per source (a subject, a key) per interval, and at most a fixed number
// of lines per interval over all sources, so that neither one noisy publisher
// nor thousands of publishers on distinct subjects can flood the log. What
// was not logged is counted and handed back as a Summary, for one line per
// interval that says how much was dropped.
//
// The throttle's memory is bounded: it remembers at most a fixed number of
// sources, forgetting the one it logged longest ago when full, and counts
// distinct dropped sources up to the same bound.
package logthrottle

import (
	"container/list"
	"sync"
	"time"
)

// Defaults used for zero Options fields.
const (
	// DefaultInterval is the per-source interval: ten seconds keeps one
	// line per bad publisher readable while a person is watching the log.
	DefaultInterval = 10 * time.Second
	// DefaultMaxSources bounds the sources remembered; 4096 entries are a
	// few hundred KiB at most, and more distinct bad sources than that in
	// one interval are an attack whose every source need not be named.
	DefaultMaxSources = 4096
	// DefaultMaxLines is the global cap per interval: enough lines to show
	// a sample of distinct sources, few enough that a flood from thousands
	// of subjects costs the log two lines a second.
	DefaultMaxLines = 20
)

// Options configures a Throttle; zero fields take the defaults above.
type Options struct {
	// Interval is both the per-source interval and the period of the global cap.
	Interval time.Duration
	// MaxSources bounds how many sources are remembered.
	MaxSources int
	// MaxLines is the most events allowed per Interval over all sources.
	MaxLines int
}

// Summary counts what a Throttle dropped over one or more intervals.
type Summary struct {
	// Dropped is the number of events not allowed.
	Dropped int
	// Sources is the number of distinct sources among them, counted per
	// interval (at most the throttle's MaxSources each, see SourcesCapped)
	// and summed over the intervals summarised.
	Sources int
	// SourcesCapped is true when more distinct sources were dropped than
	// could be counted, so Sources is a lower bound.
	SourcesCapped bool
	// Start and End bound the intervals summarised.
	Start, End time.Time
}

// Throttle allows one event per source per interval and at most MaxLines
// events per interval in total. It is safe for concurrent use. Callers pass
// the time, so that a test can drive it with an injected clock.
type Throttle struct {
	mu         sync.Mutex
	interval   time.Duration
	maxSources int
	maxLines   int

	// order holds the remembered sources, least recently allowed first;
	// bySource indexes it.
	order    *list.List
	bySource map[string]*list.Element

	windowStart time.Time // start of the current global window; zero before the first event
	lines       int       // events allowed in the current window
	dropped     int
	droppedSrc  map[string]struct{}
	srcCapped   bool
	pending     Summary // drops of windows that ended, not yet taken
}

type entry struct {
	source string
	last   time.Time
}

// New returns a Throttle allowing one event per source per interval,
// remembering at most maxSources sources, with the default global cap
// (DefaultMaxLines per interval). Non-positive arguments take the defaults.
func New(interval time.Duration, maxSources int) *Throttle {
	return NewWithOptions(Options{Interval: interval, MaxSources: maxSources})
}

// NewWithOptions returns a Throttle for opts.
func NewWithOptions(opts Options) *Throttle {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.MaxSources <= 0 {
		opts.MaxSources = DefaultMaxSources
	}
	if opts.MaxLines <= 0 {
		opts.MaxLines = DefaultMaxLines
	}
	return &Throttle{
		interval:   opts.Interval,
		maxSources: opts.MaxSources,
		maxLines:   opts.MaxLines,
		order:      list.New(),
		bySource:   make(map[string]*list.Element),
		droppedSrc: make(map[string]struct{}),
	}
}

// Interval returns the throttle's interval.
func (r *Throttle) Interval() time.Duration { return r.interval }

// Allow reports whether an event from source may be logged now: the source
// has not been allowed within the interval and the global cap of the
// current interval is not reached. An event not allowed is counted for the
// next Summary.
func (r *Throttle) Allow(source string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rollLocked(now)
	el, known := r.bySource[source]
	if known && now.Sub(el.Value.(*entry).last) < r.interval && !now.Before(el.Value.(*entry).last) {
		r.dropLocked(source)
		return false
	}
	if r.lines >= r.maxLines {
		r.dropLocked(source)
		return false
	}
	r.lines++
	if known {
		el.Value.(*entry).last = now
		r.order.MoveToBack(el)
		return true
	}
	if r.order.Len() >= r.maxSources {
		// Forget the source allowed longest ago: at worst it is logged again
		// early, and the global cap still bounds the lines.
		oldest := r.order.Front()
		delete(r.bySource, oldest.Value.(*entry).source)
		r.order.Remove(oldest)
	}
	r.bySource[source] = r.order.PushBack(&entry{source: source, last: now})
	return true
}

// Summary returns what was dropped in the intervals that ended by now and
// were not summarised yet, and whether there is anything to report; it
// resets the counts it returns. Call it once per interval (from a ticker,
// or after each Allow): it returns false until an interval with drops ends.
func (r *Throttle) Summary(now time.Time) (Summary, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rollLocked(now)
	s := r.pending
	if s.Dropped == 0 {
		return Summary{}, false
	}
	r.pending = Summary{}
	return s, true
}

// Sources returns how many sources the throttle remembers (at most MaxSources).
func (r *Throttle) Sources() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.order.Len()
}

func (r *Throttle) dropLocked(source string) {
	r.dropped++
	if _, ok := r.droppedSrc[source]; ok {
		return
	}
	if len(r.droppedSrc) >= r.maxSources {
		r.srcCapped = true
		return
	}
	r.droppedSrc[source] = struct{}{}
}

// rollLocked ends the current global window when an interval has passed
// (or the clock went backwards), moving its drops into pending.
func (r *Throttle) rollLocked(now time.Time) {
	if !r.windowStart.IsZero() && now.Sub(r.windowStart) < r.interval && !now.Before(r.windowStart) {
		return
	}
	if r.dropped > 0 {
		p := &r.pending
		if p.Dropped == 0 {
			p.Start = r.windowStart
		}
		p.Dropped += r.dropped
		p.Sources += len(r.droppedSrc)
		p.SourcesCapped = p.SourcesCapped || r.srcCapped
		p.End = now
	}
	r.windowStart, r.lines, r.dropped, r.srcCapped = now, 0, 0, false
	clear(r.droppedSrc)
}
