package logthrottle

import (
	"testing"
	"time"
)

func TestAllow(t *testing.T) {
	now := time.Unix(1000, 0)
	th := New(10*time.Second, 2)
	steps := []struct {
		source string
		after  time.Duration
		want   bool
	}{
		{"a", 0, true},
		{"a", time.Second, false},        // same source within the interval
		{"b", time.Second, true},         // another source
		{"c", 2 * time.Second, false},    // full of active sources
		{"a", 11 * time.Second, true},    // a's interval passed
		{"c", 12 * time.Second, true},    // b went idle and is forgotten
		{"b", 12 * time.Second, false},   // full again: a and c are active
		{"b", 12*time.Second + 1, false}, // still full
		{"a", 11*time.Second + 1, false}, // a logged 1ns ago
		{"d", 30 * time.Second, true},    // everyone idle
		{"d", 30*time.Second + 9*time.Second, false},
	}
	for i, s := range steps {
		if got := th.Allow(s.source, now.Add(s.after)); got != s.want {
			t.Fatalf("step %d: Allow(%q) at +%s = %v, want %v", i, s.source, s.after, got, s.want)
		}
	}
}
