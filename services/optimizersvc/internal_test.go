package optimizersvc

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/selection"
)

func TestSanitizeName(t *testing.T) {
	for _, in := range []string{"host.example.com-42", "a b*c", string(make([]byte, 100)) + "-7"} {
		got := sanitizeName(in)
		if !messages.ValidName(got) {
			t.Errorf("sanitizeName(%q) = %q, not a valid name", in, got)
		}
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	for name, o := range map[string]Options{
		"no conn":       {},
		"bad cluster":   {Clusters: []string{"a.b"}},
		"bad network":   {NetworkMs: map[string]map[string]float64{"A": {"e": math.NaN()}}},
		"bad intervals": {MinInterval: 3e9, MaxInterval: 1e9},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("%s: New accepted %+v", name, o)
		}
	}
}

func TestWithSlots(t *testing.T) {
	at := time.UnixMilli(messages.EpochMs + 1)
	snap := &messages.WeightSnapshot{Model: "m", Cluster: "A", Generation: 1, Time: at.UnixMilli(),
		Weights: map[string]float64{"a": 0.5, "b": 0.3, "c": 0.1, "z": 0}, ShedFraction: 0.1}
	withSlots(snap, nil)
	if err := snap.Validate(at); err != nil {
		t.Fatalf("snapshot with slots invalid: %v", err)
	}
	if got := strings.Join(snap.SlotEngines, ","); got != "a,b,c" || len(snap.Slots) != 2*selection.SlotCount(3) {
		t.Fatalf("slot engines %q, %d slot bytes", got, len(snap.Slots))
	}
	counts := func(s *messages.WeightSnapshot) map[string]int {
		idx, err := selection.DecodeSlots(s.Slots)
		if err != nil {
			t.Fatal(err)
		}
		c := map[string]int{}
		for _, j := range idx {
			c[s.SlotEngines[j]]++
		}
		return c
	}
	if c := counts(snap); c["a"] != 2276 || c["b"] != 1365 || c["c"] != 455 {
		t.Errorf("counts %v, want 4096 slots shared 5:3:1", c)
	}
	// The next snapshot continues from this one: several weights change,
	// an engine joins; the moved slots are exactly the required ones.
	next := &messages.WeightSnapshot{Model: "m", Cluster: "A", Generation: 2, Time: at.UnixMilli(),
		Weights: map[string]float64{"a": 0.3, "b": 0.35, "c": 0.05, "d": 0.3}}
	withSlots(next, snap)
	before, after := counts(snap), counts(next)
	need := 0
	for e, n := range before {
		need += max(0, n-after[e])
	}
	pi, _ := selection.DecodeSlots(snap.Slots)
	ni, _ := selection.DecodeSlots(next.Slots)
	moved := 0
	for s := range pi {
		if snap.SlotEngines[pi[s]] != next.SlotEngines[ni[s]] {
			moved++
		}
	}
	if moved != need {
		t.Errorf("%d slots moved, %d needed", moved, need)
	}
	// Tables never shrink.
	big := &messages.WeightSnapshot{Weights: map[string]float64{}}
	for i := range 300 {
		big.Weights[fmt.Sprintf("e%d", i)] = 1.0 / 300
	}
	withSlots(big, nil)
	small := &messages.WeightSnapshot{Weights: map[string]float64{"e1": 0.5, "e2": 0.5}}
	withSlots(small, big)
	if len(small.Slots) != len(big.Slots) || len(big.Slots) != 2*8192 {
		t.Errorf("slots %d after %d, want the table kept at 8192 slots", len(small.Slots)/2, len(big.Slots)/2)
	}
	// No weight: no table.
	none := &messages.WeightSnapshot{Weights: map[string]float64{"a": 0}, ShedFraction: 1, SlotEngines: []string{"a"}, Slots: []byte{0, 0}}
	withSlots(none, snap)
	if none.SlotEngines != nil || none.Slots != nil {
		t.Errorf("a snapshot without weight got a slot table")
	}
}

// TestPenaltySpanBounded: penalties longer than a penalty record may claim
// (messages.MaxPenaltySpan) are refused, since their records would not
// validate.
func TestPenaltySpanBounded(t *testing.T) {
	for _, tc := range []struct {
		p  PenaltyOptions
		ok bool
	}{
		{PenaltyOptions{}, true},
		{PenaltyOptions{Max: messages.MaxPenaltySpan, SlowStart: messages.MaxPenaltySpan}, true},
		{PenaltyOptions{Max: 48 * time.Hour}, false},
		{PenaltyOptions{SlowStart: messages.MaxPenaltySpan + time.Second}, false},
	} {
		o := Options{Conn: &nats.Conn{}, Penalties: tc.p}
		o = o.WithDefaults()
		err := o.Validate()
		if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), "MaxPenaltySpan")) {
			t.Errorf("penalties %+v: validate = %v, want ok=%v", tc.p, err, tc.ok)
		}
	}
}
