package optimizersvc

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/optimizer"
	"github.com/switchyard-dev/switchyard/router"
)

func engineState(ttft, tbt, otok, load, capacity float64, at int64) *messages.EngineState {
	return &messages.EngineState{Time: at, TTFTMs: messages.Window{Slow: ttft}, TBTMs: messages.Window{Slow: tbt},
		OutputTokens: messages.Window{Slow: otok}, LoadRPS: messages.Window{Slow: load}, CapacityRPS: capacity, Health: 1}
}

func TestFit(t *testing.T) {
	var f fit
	if got := f.baseMs(500, 0); got != 500 {
		t.Errorf("no samples: %v, want the prior 500", got)
	}
	// 800 ms at half load: base 400.
	for i := range 100 {
		f.add(engineState(300, 5, 100, 50, 100, int64(1000+i)), 500)
	}
	if got := f.baseMs(500, 0); math.Abs(got-(2*500+32*400)/34.0) > 1 {
		t.Errorf("after 100 samples of base 400: %v", got)
	}
	before := f.baseMs(500, 0)
	// One outlier barely moves the fit (median), a repeated time is ignored.
	f.add(engineState(30000, 5, 100, 50, 100, 2000), 500)
	f.add(engineState(30000, 5, 100, 50, 100, 2000), 500)
	if got := f.baseMs(500, 0); math.Abs(got-before) > 1 {
		t.Errorf("one outlier moved the fit from %v to %v", before, got)
	}
	// Samples near saturation and without latency are skipped.
	n := len(f.samples)
	f.add(engineState(300, 5, 100, 99, 100, 3000), 500)
	f.add(engineState(0, 0, 0, 10, 100, 3001), 500)
	if len(f.samples) != n {
		t.Errorf("unusable samples were kept")
	}
}

// TestFitFloor: the fit never plans an engine below its own idle-latency
// estimate, however low the samples read, and still raises it above.
func TestFitFloor(t *testing.T) {
	var f fit
	if got := f.baseMs(500, 600); got != 600 {
		t.Errorf("no samples, prior 500, floor 600: %v, want 600", got)
	}
	// 400 ms at 20% load: base 320, below the engine's idle latency 500.
	for i := range 100 {
		f.add(engineState(300, 1, 100, 20, 100, int64(1000+i)), 500)
	}
	if f.base >= 500 {
		t.Fatalf("fitted base %v, want it below 500 for this test", f.base)
	}
	if got := f.baseMs(500, 500); got != 500 {
		t.Errorf("fitted %v, floor 500: %v, want 500", f.base, got)
	}
	if got := f.baseMs(500, 0); got != f.base {
		t.Errorf("no floor: %v, want the fit %v", got, f.base)
	}
	// 1500 ms at 20% load: base 1200, above the floor, is kept.
	for i := range 200 {
		f.add(engineState(300, 12, 100, 20, 100, int64(2000+i)), 500)
	}
	if got := f.baseMs(500, 500); got < 1000 {
		t.Errorf("a slow engine's fit %v is not raised above the floor: %v", f.base, got)
	}
}

func TestDistance(t *testing.T) {
	a := &messages.WeightSnapshot{Weights: map[string]float64{"x": 0.5, "y": 0.5}}
	b := &messages.WeightSnapshot{Weights: map[string]float64{"x": 0.4, "z": 0.5}, ShedFraction: 0.1}
	tv, flip := distance(a, b)
	if math.Abs(tv-0.6) > 1e-12 || !flip {
		t.Errorf("distance %v flip %v, want 0.6 true", tv, flip)
	}
	if tv, flip := distance(a, a); tv != 0 || flip {
		t.Errorf("distance to itself %v %v", tv, flip)
	}
}

func TestDemandOf(t *testing.T) {
	s := &Service{opts: Options{MinDemandRPS: 1}}
	if d := s.demandOf(nil); d != [optimizer.NumPriorities]float64{optimizer.Standard: 1} {
		t.Errorf("no demand: %v", d)
	}
	d := s.demandOf(&messages.DemandState{RPS: messages.Window{Fast: 30}, RPSByPriority: map[string]messages.Window{
		messages.PriorityCritical: {Fast: 10}, messages.PrioritySheddable: {Fast: 20}}})
	if d != [optimizer.NumPriorities]float64{optimizer.Critical: 10, optimizer.Sheddable: 20} {
		t.Errorf("by priority: %v", d)
	}
	if d := s.demandOf(&messages.DemandState{RPS: messages.Window{Fast: 0.25}}); d[optimizer.Standard] != 1 {
		t.Errorf("small demand: %v, want raised to 1", d)
	}
}

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
	if got := strings.Join(snap.SlotEngines, ","); got != "a,b,c" || len(snap.Slots) != 2*router.SlotCount(3) {
		t.Fatalf("slot engines %q, %d slot bytes", got, len(snap.Slots))
	}
	counts := func(s *messages.WeightSnapshot) map[string]int {
		idx, err := router.DecodeSlots(s.Slots)
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
	pi, _ := router.DecodeSlots(snap.Slots)
	ni, _ := router.DecodeSlots(next.Slots)
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
		o.setDefaults()
		err := o.validate()
		if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), "MaxPenaltySpan")) {
			t.Errorf("penalties %+v: validate = %v, want ok=%v", tc.p, err, tc.ok)
		}
	}
}
