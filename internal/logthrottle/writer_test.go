package logthrottle

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// syncBuffer is a bytes.Buffer safe for the Writer's timer goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(s.b.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q is not JSON: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

// fakeClock is a clock a test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func suppressed(lines []map[string]any) (summaries, total int) {
	for _, l := range lines {
		if n, ok := l[SuppressedField].(float64); ok {
			summaries++
			total += int(n)
		}
	}
	return summaries, total
}

// TestWriterAggregates logs through a zerolog.Logger into a Writer and
// checks what reaches the output: every line accounted for, as a line or
// in a summary's count, and no more lines than the rate bound allows.
func TestWriterAggregates(t *testing.T) {
	type event struct {
		level     zerolog.Level
		engine    string
		msg       string
		every     time.Duration // fake time between lines
		n         int
		requestID bool // a field unique per line, not part of the source
	}
	cases := []struct {
		name          string
		events        []event
		wantPassed    int // lines written as they were
		wantSummaries int
		wantCounted   int // sum of the summaries' counts
	}{
		{
			// The drill: an engine failing every request, 991 warnings in 5 minutes.
			name:          "one warning per failed request, 991 in 5 minutes",
			events:        []event{{zerolog.WarnLevel, "engine-b", "forward failed", 300 * time.Second / 991, 991, true}},
			wantPassed:    30, // one per 10 s interval
			wantSummaries: 1,
			wantCounted:   991 - 30,
		},
		{
			name: "distinct sources pass",
			events: []event{
				{zerolog.WarnLevel, "engine-a", "forward failed", 0, 1, false},
				{zerolog.WarnLevel, "engine-b", "forward failed", 0, 1, false},
				{zerolog.InfoLevel, "engine-b", "forward failed", 0, 1, false},
				{zerolog.WarnLevel, "engine-b", "engine ejected", 0, 1, false},
			},
			wantPassed: 4,
		},
		{
			name:       "debug is never throttled",
			events:     []event{{zerolog.DebugLevel, "engine-a", "attempt", time.Millisecond, 500, true}},
			wantPassed: 500,
		},
		{
			name: "two noisy sources, one summary each",
			events: []event{
				{zerolog.WarnLevel, "engine-a", "forward failed", time.Millisecond, 100, true},
				{zerolog.ErrorLevel, "engine-c", "forward failed", time.Millisecond, 50, true},
			},
			wantPassed:    2,
			wantSummaries: 2,
			wantCounted:   148,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := &fakeClock{t: time.Unix(1000, 0)}
			var buf syncBuffer
			w := NewWriter(&buf, WriterOptions{Now: clock.now})
			log := zerolog.New(w).Level(zerolog.DebugLevel).With().Str("component", "router").Logger()
			total := 0
			for _, e := range c.events {
				for i := range e.n {
					ev := log.WithLevel(e.level).Str("engine", e.engine)
					if e.requestID {
						ev = ev.Str("request_id", fmt.Sprint(i))
					}
					ev.Msg(e.msg)
					clock.add(e.every)
					total++
				}
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			lines := buf.lines(t)
			summaries, counted := suppressed(lines)
			if passed := len(lines) - summaries; passed != c.wantPassed || summaries != c.wantSummaries || counted != c.wantCounted {
				t.Fatalf("%d lines logged: %d passed, %d summaries counting %d; want %d, %d, %d",
					total, passed, summaries, counted, c.wantPassed, c.wantSummaries, c.wantCounted)
			}
			if len(lines)-summaries+counted != total {
				t.Fatalf("%d lines logged, %d accounted for", total, len(lines)-summaries+counted)
			}
			for _, l := range lines {
				if _, ok := l[SuppressedField]; ok && (l["component"] != "router" || l["engine"] == nil || l["message"] == nil) {
					t.Fatalf("summary %v lacks the source's fields", l)
				}
			}
		})
	}
}

// TestWriterSummaryOnTimer checks that a summary is written when its
// interval ends, without another line or Close.
func TestWriterSummaryOnTimer(t *testing.T) {
	var buf syncBuffer
	w := NewWriter(&buf, WriterOptions{Throttle: Options{Interval: 50 * time.Millisecond}})
	defer w.Close()
	log := zerolog.New(w)
	for range 10 {
		log.Warn().Str("engine", "engine-b").Msg("forward failed")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		lines := buf.lines(t)
		if s, n := suppressed(lines); s == 1 && n == 9 && len(lines) == 2 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no summary of 9 within 5s of the interval's end: %v", lines)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
