package logthrottle

import (
	"fmt"
	"testing"
	"time"
)

func TestAllow(t *testing.T) {
	base := time.Unix(1000, 0)
	type step struct {
		source string
		after  time.Duration
		want   bool
	}
	cases := []struct {
		name  string
		opts  Options
		steps []step
	}{
		{
			name: "per source",
			opts: Options{Interval: 10 * time.Second, MaxSources: 10, MaxLines: 100},
			steps: []step{
				{"a", 0, true},
				{"a", time.Second, false}, // same source within the interval
				{"b", time.Second, true},  // another source
				{"a", 10 * time.Second, true},
				{"a", 19 * time.Second, false},
				{"b", 11 * time.Second, true},
			},
		},
		{
			name: "global cap",
			opts: Options{Interval: 10 * time.Second, MaxSources: 10, MaxLines: 2},
			steps: []step{
				{"a", 0, true},
				{"b", time.Second, true},
				{"c", 2 * time.Second, false}, // third line of the interval
				{"d", 9 * time.Second, false},
				{"c", 10 * time.Second, true}, // a new interval
				{"d", 10 * time.Second, true},
				{"e", 10 * time.Second, false},
			},
		},
		{
			name: "forgets the oldest source when full",
			opts: Options{Interval: 10 * time.Second, MaxSources: 2, MaxLines: 100},
			steps: []step{
				{"a", 0, true},
				{"b", time.Second, true},
				{"c", 2 * time.Second, true}, // a is forgotten
				{"b", 3 * time.Second, false},
				{"c", 3 * time.Second, false},
				{"a", 3 * time.Second, true}, // forgotten, so allowed; b is forgotten now
				{"b", 4 * time.Second, true},
			},
		},
		{
			name: "clock going backwards does not silence a source",
			opts: Options{Interval: 10 * time.Second, MaxSources: 10, MaxLines: 100},
			steps: []step{
				{"a", 20 * time.Second, true},
				{"a", 5 * time.Second, true},
				{"a", 6 * time.Second, false},
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			th := NewWithOptions(c.opts)
			for i, s := range c.steps {
				if got := th.Allow(s.source, base.Add(s.after)); got != s.want {
					t.Fatalf("step %d: Allow(%q) at +%s = %v, want %v", i, s.source, s.after, got, s.want)
				}
			}
		})
	}
}

// TestFloodOfDistinctSources is the shape that flooded the log: thousands
// of one-off sources in a few seconds yield at most MaxLines lines per
// interval, one summary counting the rest, and bounded memory.
func TestFloodOfDistinctSources(t *testing.T) {
	base := time.Unix(1000, 0)
	cases := []struct {
		name       string
		opts       Options
		events     int
		spread     time.Duration // events are evenly spread over this span
		wantLines  int
		maxSources int
	}{
		{"defaults, 3000 in 3s", Options{}, 3000, 3 * time.Second, DefaultMaxLines, DefaultMaxSources},
		{"small cap, 3000 in 3s", Options{MaxLines: 5, MaxSources: 100}, 3000, 3 * time.Second, 5, 100},
		{"12000 over 25s", Options{MaxLines: 5, MaxSources: 100}, 12000, 25 * time.Second, 15, 100},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			th := NewWithOptions(c.opts)
			lines, summarised, summaries := 0, 0, 0
			var last time.Time
			for i := range c.events {
				now := base.Add(c.spread * time.Duration(i) / time.Duration(c.events))
				last = now
				if th.Allow(fmt.Sprintf("sy.signal.m.e%d", i), now) {
					lines++
				}
				if s, ok := th.Summary(now); ok {
					summaries++
					summarised += s.Dropped
				}
				if n := th.Sources(); n > c.maxSources {
					t.Fatalf("event %d: %d sources remembered, bound %d", i, n, c.maxSources)
				}
			}
			s, ok := th.Summary(last.Add(th.Interval()))
			if !ok {
				t.Fatal("no summary after the flood")
			}
			summaries++
			summarised += s.Dropped
			if lines != c.wantLines {
				t.Errorf("%d lines allowed, want %d", lines, c.wantLines)
			}
			if lines+summarised != c.events {
				t.Errorf("%d allowed + %d summarised as dropped != %d events", lines, summarised, c.events)
			}
			if want := (c.spread + th.Interval() - 1) / th.Interval(); summaries != int(want) {
				t.Errorf("%d summaries, want one per interval (%d)", summaries, want)
			}
			if _, again := th.Summary(last.Add(3 * th.Interval())); again {
				t.Error("a summary with nothing dropped")
			}
		})
	}
}

func TestSummaryCounts(t *testing.T) {
	base := time.Unix(1000, 0)
	th := NewWithOptions(Options{Interval: 10 * time.Second, MaxSources: 3, MaxLines: 1})
	th.Allow("a", base)                    // allowed
	th.Allow("a", base.Add(time.Second))   // same source: dropped
	th.Allow("b", base.Add(2*time.Second)) // over the cap: dropped
	th.Allow("b", base.Add(3*time.Second))
	if _, ok := th.Summary(base.Add(9 * time.Second)); ok {
		t.Fatal("summary before the interval ended")
	}
	s, ok := th.Summary(base.Add(10 * time.Second))
	if !ok || s.Dropped != 3 || s.Sources != 2 || s.SourcesCapped || !s.Start.Equal(base) {
		t.Fatalf("summary %+v %v, want 3 dropped from 2 sources starting at %s", s, ok, base)
	}
	// More distinct dropped sources than can be counted.
	t2 := base.Add(20 * time.Second)
	for i := range 10 {
		th.Allow(fmt.Sprint("s", i), t2)
	}
	s, ok = th.Summary(t2.Add(10 * time.Second))
	if !ok || s.Dropped != 9 || s.Sources != 3 || !s.SourcesCapped {
		t.Fatalf("summary %+v, want 9 dropped, 3 sources counted, capped", s)
	}
}
