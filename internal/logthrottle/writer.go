package logthrottle

import (
	"encoding/json"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// DefaultKeyFields returns the fields that name a log line's source for a
// Writer: a line repeats another when these agree. Free text (errors,
// request ids, keys) is left out, so one failing engine's per-request lines
// are one source.
func DefaultKeyFields() []string {
	return []string{zerolog.LevelFieldName, "component", "cluster", "router", "engine", "model", zerolog.MessageFieldName}
}

// SuppressedField is the field of a summary line holding how many lines
// like it were not written in the interval it covers.
const SuppressedField = "suppressed"

// DefaultWriterMaxLines is a Writer's global cap per interval: a service's
// start (some 30 distinct lines for a whole stack in one process) passes
// whole, and a flood of distinct sources still costs at most ten lines a
// second.
const DefaultWriterMaxLines = 100

// maxSummaries bounds the summary lines of one interval; drops of further
// sources are summed into one more line.
const maxSummaries = 16

// WriterOptions configures a Writer; zero fields take defaults.
type WriterOptions struct {
	// Throttle is the per-source interval, source bound and global cap
	// (defaults: 10 s, 4096 sources, DefaultWriterMaxLines per interval).
	Throttle Options
	// MinLevel is the lowest level throttled; debug and trace lines always
	// pass, since they are asked for on purpose (default zerolog.InfoLevel).
	MinLevel zerolog.Level
	// KeyFields name a line's source (default DefaultKeyFields()).
	KeyFields []string
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Writer is a zerolog.LevelWriter in front of another writer, expecting
// zerolog's JSON lines: it writes the first line of each source per
// interval and counts the others, and at the end of an interval with drops
// writes one summary line per source (its key fields, the count in
// SuppressedField), at most maxSummaries+1 of them. So a warning repeated
// for every failed request becomes a line and a count every interval.
// Close writes what is pending. It is safe for concurrent use.
type Writer struct {
	out      io.Writer
	opts     WriterOptions
	throttle *Throttle

	mu      sync.Mutex
	drops   map[string]*drop // by source key, bounded by the throttle's MaxSources
	order   []string         // keys of drops, first dropped first
	overrun int              // drops of sources past the bound
	timer   *time.Timer
	closed  bool
}

type drop struct {
	level  zerolog.Level
	fields map[string]any
	n      int
}

// NewWriter returns a Writer writing to out.
func NewWriter(out io.Writer, opts WriterOptions) *Writer {
	if opts.MinLevel <= zerolog.DebugLevel {
		opts.MinLevel = zerolog.InfoLevel
	}
	if opts.Throttle.MaxLines <= 0 {
		opts.Throttle.MaxLines = DefaultWriterMaxLines
	}
	if opts.KeyFields == nil {
		opts.KeyFields = DefaultKeyFields()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Writer{out: out, opts: opts, throttle: NewWithOptions(opts.Throttle), drops: make(map[string]*drop)}
}

// Write writes a line of unknown level: it is passed on.
func (w *Writer) Write(p []byte) (int, error) { return w.out.Write(p) }

// WriteLevel writes or counts one line.
func (w *Writer) WriteLevel(level zerolog.Level, p []byte) (int, error) {
	if level < w.opts.MinLevel || level == zerolog.NoLevel {
		return w.writeOut(level, p)
	}
	var line map[string]any
	if err := json.Unmarshal(p, &line); err != nil {
		return w.writeOut(level, p) // not JSON: nothing to key on
	}
	key, fields := w.key(line)
	if w.throttle.Allow(key, w.opts.Now()) {
		return w.writeOut(level, p)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return len(p), nil
	}
	d := w.drops[key]
	switch {
	case d != nil:
		d.n++
	case len(w.drops) < w.throttle.maxSources:
		w.drops[key] = &drop{level: level, fields: fields, n: 1}
		w.order = append(w.order, key)
	default:
		w.overrun++
	}
	if w.timer == nil {
		w.timer = time.AfterFunc(w.throttle.Interval(), w.flush)
	}
	return len(p), nil
}

// Close writes the summaries pending and stops counting.
func (w *Writer) Close() error {
	w.mu.Lock()
	w.closed = true
	if w.timer != nil {
		w.timer.Stop()
	}
	w.mu.Unlock()
	w.flush()
	return nil
}

func (w *Writer) writeOut(level zerolog.Level, p []byte) (int, error) {
	if lw, ok := w.out.(zerolog.LevelWriter); ok {
		return lw.WriteLevel(level, p)
	}
	return w.out.Write(p)
}

func (w *Writer) key(line map[string]any) (string, map[string]any) {
	var b strings.Builder
	fields := make(map[string]any, len(w.opts.KeyFields))
	for _, f := range w.opts.KeyFields {
		v, ok := line[f]
		if !ok {
			continue
		}
		fields[f] = v
		b.WriteString(f)
		b.WriteByte('=')
		s, _ := json.Marshal(v)
		b.Write(s)
		b.WriteByte(' ')
	}
	return b.String(), fields
}

// flush writes one summary line per source with drops, the most dropped
// first, and one line summing the rest past maxSummaries.
func (w *Writer) flush() {
	w.mu.Lock()
	drops := make([]*drop, 0, len(w.order))
	for _, k := range w.order {
		drops = append(drops, w.drops[k])
	}
	overrun := w.overrun
	clear(w.drops)
	w.order, w.overrun, w.timer = w.order[:0], 0, nil
	w.mu.Unlock()
	slices.SortStableFunc(drops, func(a, b *drop) int { return b.n - a.n })
	interval := w.throttle.Interval()
	top := w.opts.MinLevel
	out := zerolog.New(w.out)
	for i, d := range drops {
		if i >= maxSummaries {
			overrun += d.n
			continue
		}
		top = max(top, d.level)
		line := out.WithLevel(d.level).Time(zerolog.TimestampFieldName, w.opts.Now())
		for f, v := range d.fields {
			if f != zerolog.LevelFieldName && f != zerolog.MessageFieldName {
				line = line.Interface(f, v)
			}
		}
		msg, _ := d.fields[zerolog.MessageFieldName].(string)
		line.Int(SuppressedField, d.n).Str("interval", interval.String()).Msg(msg)
	}
	if overrun > 0 {
		out.WithLevel(top).Time(zerolog.TimestampFieldName, w.opts.Now()).
			Int(SuppressedField, overrun).Str("interval", interval.String()).Msg("log lines of other sources suppressed")
	}
}
