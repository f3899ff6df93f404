package optimizersvc

import (
	"math"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
)

func defaultPenalties() *PenaltyOptions {
	o := &PenaltyOptions{SlowTTFT: true}
	*o = o.WithDefaults()
	return o
}

func TestPenaltyRules(t *testing.T) {
	o := defaultPenalties()
	w := func(f float64) messages.Window { return messages.Window{Fast: f, Slow: f} }
	cases := []struct {
		name   string
		out    *messages.EngineOutcomes
		fleet  fleet
		expect float64
		reason string
		mult   float64
	}{
		{"no evidence", nil, fleet{}, 0, "", 1},
		{"healthy", &messages.EngineOutcomes{ErrorRate: w(0.01), TTFTMs: w(100)}, fleet{}, 100, "", 1},
		{"consecutive failures", &messages.EngineOutcomes{FailedIntervals: 1, ErrorRate: w(0.3)}, fleet{}, 0, messages.ReasonFailures, 0},
		{"error rate above the floor", &messages.EngineOutcomes{ErrorRate: w(0.2)}, fleet{errorMedian: 0.01}, 0, messages.ReasonErrorRate, 0.25},
		{"heavy error rate", &messages.EngineOutcomes{ErrorRate: w(0.6)}, fleet{}, 0, messages.ReasonErrorRate, 0},
		{"error rate within 3x a bad fleet", &messages.EngineOutcomes{ErrorRate: w(0.2)}, fleet{errorMedian: 0.1}, 0, "", 1},
		{"error rate below the floor", &messages.EngineOutcomes{ErrorRate: w(0.04)}, fleet{errorMedian: 0.001}, 0, "", 1},
		{"timeouts", &messages.EngineOutcomes{TimeoutRate: w(0.1)}, fleet{}, 0, messages.ReasonTimeouts, 0.25},
		{"all time out", &messages.EngineOutcomes{TimeoutRate: w(1)}, fleet{}, 0, messages.ReasonTimeouts, 0},
		{"slow TTFT", &messages.EngineOutcomes{TTFTMs: w(400)}, fleet{}, 100, messages.ReasonSlowTTFT, 0.5},
		{"TTFT within 3x plus slack", &messages.EngineOutcomes{TTFTMs: w(340)}, fleet{}, 100, "", 1},
		{"TTFT without a profile", &messages.EngineOutcomes{TTFTMs: w(4000)}, fleet{}, 0, "", 1},
		{"worst reason wins", &messages.EngineOutcomes{TTFTMs: w(4000), ErrorRate: w(0.7)}, fleet{}, 100, messages.ReasonErrorRate, 0},
	}
	for _, tc := range cases {
		v := o.assess(tc.out, tc.fleet, tc.expect)
		if v.reason != tc.reason || v.multiplier != tc.mult {
			t.Errorf("%s: got %q × %v (%s), want %q × %v", tc.name, v.reason, v.multiplier, v.detail, tc.reason, tc.mult)
		}
	}
}

func TestPenaltyDuration(t *testing.T) {
	o := defaultPenalties()
	want := []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second,
		160 * time.Second, 5 * time.Minute, 5 * time.Minute}
	for i, w := range want {
		if got := o.duration(i + 1); got != w {
			t.Errorf("strike %d: %s, want %s", i+1, got, w)
		}
	}
	if got := o.duration(1000); got != 5*time.Minute {
		t.Errorf("strike 1000: %s", got)
	}
}

func TestPenaltySlowStart(t *testing.T) {
	t0 := time.UnixMilli(1_780_000_000_000)
	p := &penalty{strikes: 1, mult: 0, since: t0, until: t0.Add(5 * time.Second), recoverUntil: t0.Add(15 * time.Second)}
	for _, tc := range []struct {
		at   time.Duration
		want float64
	}{{0, 0}, {4 * time.Second, 0}, {5 * time.Second, 0.1}, {10 * time.Second, 0.55}, {14 * time.Second, 0.91}, {15 * time.Second, 1}, {time.Hour, 1}} {
		if got := p.multiplier(t0.Add(tc.at), 0.1); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("at +%s: %v, want %v", tc.at, got, tc.want)
		}
	}
	if got := (*penalty)(nil).multiplier(t0, 0.1); got != 1 {
		t.Errorf("no penalty: %v", got)
	}
	q := &penalty{strikes: 1, mult: 0.25, since: t0, until: t0.Add(5 * time.Second), recoverUntil: t0.Add(15 * time.Second)}
	if got := q.multiplier(t0.Add(5*time.Second), 0.1); got != 0.25 {
		t.Errorf("ramp of a 0.25 penalty starts at %v, want 0.25", got)
	}
}

func failing(at time.Time) *messages.EngineOutcomes {
	return &messages.EngineOutcomes{LastSent: at.UnixMilli(), FailedIntervals: 2, ErrorRate: messages.Window{Fast: 1, Slow: 1}}
}

func healthy(at time.Time) *messages.EngineOutcomes {
	return &messages.EngineOutcomes{LastSent: at.UnixMilli(), ErrorRate: messages.Window{Fast: 0.001}}
}

func TestPenaltyRepeatAndEvidence(t *testing.T) {
	o := defaultPenalties()
	t0 := time.UnixMilli(1_780_000_000_000)
	pens := map[string]*penalty{}
	keys := []string{"m.a", "m.b", "m.c"}
	outs := map[string]*messages.EngineOutcomes{"m.a": failing(t0), "m.b": healthy(t0), "m.c": healthy(t0)}
	ev := o.judge(pens, keys, outs, nil, t0)
	if len(ev) != 1 || ev[0].key != "m.a" || ev[0].p.strikes != 1 || ev[0].p.until.Sub(t0) != 5*time.Second {
		t.Fatalf("first judgement: %+v", ev)
	}
	// The same (old) evidence after the penalty does not count again.
	if ev := o.judge(pens, keys, outs, nil, t0.Add(6*time.Second)); len(ev) != 0 {
		t.Errorf("old evidence judged again: %+v", ev)
	}
	// New failures after the penalty: second strike, twice as long.
	t1 := t0.Add(7 * time.Second)
	outs["m.a"] = failing(t1)
	ev = o.judge(pens, keys, outs, nil, t1)
	if len(ev) != 1 || ev[0].p.strikes != 2 || ev[0].p.until.Sub(t1) != 10*time.Second || ev[0].p.recoverUntil.Sub(t1) != 20*time.Second {
		t.Fatalf("second judgement: %+v", ev)
	}
	// Behaving during the slow start: no new penalty, the ramp goes on.
	t2 := t1.Add(12 * time.Second)
	outs["m.a"] = healthy(t2)
	if ev := o.judge(pens, keys, outs, nil, t2); len(ev) != 0 {
		t.Errorf("healthy engine penalised: %+v", ev)
	}
	if m := pens["m.a"].multiplier(t2, o.RecoveryFloor); m <= 0.1 || m >= 1 {
		t.Errorf("multiplier during slow start %v", m)
	}
}

func TestPenaltyFleetCap(t *testing.T) {
	o := defaultPenalties()
	t0 := time.UnixMilli(1_780_000_000_000)
	keys := []string{"m.a", "m.b", "m.c", "m.d", "m.e", "m.f"}
	outs := map[string]*messages.EngineOutcomes{}
	rates := map[string]float64{"m.a": 0.2, "m.b": 0.3, "m.c": 0.9, "m.d": 0.4, "m.e": 0, "m.f": 0}
	for k, r := range rates {
		outs[k] = &messages.EngineOutcomes{LastSent: t0.UnixMilli(), ErrorRate: messages.Window{Fast: r}}
	}
	pens := map[string]*penalty{}
	ev := o.judge(pens, keys, outs, nil, t0)
	got := penalisedKeys(pens, t0)
	// Median of {0,0,0.2,0.3,0.4,0.9} is 0.25, so the limit is 0.75: only c
	// is an outlier by the fleet rule... with a fleet-wide problem the rule
	// itself holds back.
	if len(ev) != 1 || len(got) != 1 || got[0] != "m.c" {
		t.Errorf("penalised %v (%d events), want [m.c]", got, len(ev))
	}
	// Four engines failing outright: at most half of six (three), the worst.
	for _, k := range []string{"m.a", "m.b", "m.d"} {
		outs[k] = &messages.EngineOutcomes{LastSent: t0.UnixMilli() + 1000, FailedIntervals: 1, ErrorRate: messages.Window{Fast: rates[k]}}
	}
	outs["m.e"] = &messages.EngineOutcomes{LastSent: t0.UnixMilli() + 1000, FailedIntervals: 3, ErrorRate: messages.Window{Fast: 0.05}}
	o.judge(pens, keys, outs, nil, t0.Add(time.Second))
	got = penalisedKeys(pens, t0.Add(time.Second))
	if len(got) != 3 || got[0] != "m.b" || got[1] != "m.c" || got[2] != "m.d" {
		t.Errorf("penalised %v, want three: m.c (already) and the two worst new ones (highest error rates), m.b and m.d", got)
	}
}
