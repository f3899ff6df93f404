package messages

import (
	"bytes"
	"errors"
	"math"
	"testing"
)

// TestWorkFieldsOptional checks that a message without the mix fields
// encodes without their keys, so a router or engine that does not measure
// its mix writes what a reader without the fields decodes, and that the
// fields round-trip when set.
func TestWorkFieldsOptional(t *testing.T) {
	for _, m := range []Message{goodSignal(), goodReport(),
		&DemandState{Model: "llama", Cluster: "A", Time: testNow.UnixMilli(), RPS: Window{90, 88},
			Routers: map[string]RouterDemand{"A-1": {LastReport: testNow.UnixMilli(), Seq: 4, RPS: Window{90, 88}}}}} {
		data, err := EncodeAt(m, testNow)
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{"ptok", "pfw", "done", "otok\xcb", "ptps", "drps", "otps", "rvar"} {
			if key == "otok\xcb" && m.MessageKind() == KindSignal {
				continue // the signal's output tokens are not new
			}
			if bytes.Contains(data, []byte(key)) {
				t.Errorf("%s without a mix encodes key %q", m.MessageKind(), key)
			}
		}
	}
	for _, m := range workMessages() {
		data, err := EncodeAt(m, testNow)
		if err != nil {
			t.Fatalf("%s: %v", m.MessageKind(), err)
		}
		got, err := DecodeAt(data, testNow)
		if err != nil {
			t.Fatalf("%s: %v", m.MessageKind(), err)
		}
		again, err := EncodeAt(got, testNow)
		if err != nil || !bytes.Equal(again, data) && m.MessageKind() != KindReport && m.MessageKind() != KindDemandState {
			t.Fatalf("%s: re-encoding differs (%v)", m.MessageKind(), err)
		}
	}
	d := workMessages()[3].(*DemandState)
	if p, o := d.Mix(); math.Abs(p-132000.0/88) > 1e-9 || math.Abs(o-40) > 1e-9 {
		t.Errorf("Mix() = %v, %v, want %v, 40", p, o, 132000.0/88)
	}
	if sd := d.StdDev(); math.Abs(sd-math.Sqrt(90)) > 1e-9 {
		t.Errorf("StdDev() = %v, want %v", sd, math.Sqrt(90))
	}
}

// TestWorkFieldsValidated checks the bounds of the mix fields.
func TestWorkFieldsValidated(t *testing.T) {
	cases := []struct {
		name string
		m    func() Message
	}{
		{"report prompt tokens above the per-request bound", func() Message {
			r := goodReport()
			r.PromptTokens = r.Requests*maxTokensPerRequest + 1
			return r
		}},
		{"report output tokens without completions", func() Message { r := goodReport(); r.OutputTokens = 5; return r }},
		{"report negative completions", func() Message { r := goodReport(); r.Completed = -1; return r }},
		{"signal negative prompt tokens", func() Message { s := goodSignal(); s.PromptTokens = -1; return s }},
		{"signal prefill weight NaN", func() Message { s := goodSignal(); s.PrefillWeight = math.NaN(); return s }},
		{"signal prefill weight too large", func() Message { s := goodSignal(); s.PrefillWeight = 1000; return s }},
		{"demand negative variance", func() Message {
			d := workMessages()[3].(*DemandState)
			d.RPSVar.Slow = -1
			return d
		}},
		{"router's prompt rate infinite", func() Message {
			d := workMessages()[3].(*DemandState)
			r := d.Routers["A-1"]
			r.PromptTPS.Fast = math.Inf(1)
			d.Routers["A-1"] = r
			return d
		}},
	}
	for _, tc := range cases {
		if _, err := EncodeAt(tc.m(), testNow); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", tc.name, err)
		}
	}
}

// TestWork checks the unit's arithmetic and its treatment of bad inputs.
func TestWork(t *testing.T) {
	for _, tc := range []struct{ p, o, w, want float64 }{
		{2000, 30, 0.1, 230}, {256, 64, 0.1, 89.6}, {100, 10, 0, 10}, {-5, 10, 0.1, 10}, {math.NaN(), 10, 0.1, 10}, {100, math.Inf(1), 0.1, 10},
	} {
		if got := Work(tc.p, tc.o, tc.w); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("Work(%v, %v, %v) = %v, want %v", tc.p, tc.o, tc.w, got, tc.want)
		}
	}
}

// TestUpdateVariance checks that the variance window of a Poisson-like
// rate measured over different intervals estimates the same one-second
// variance, and that a steady rate has none.
func TestUpdateVariance(t *testing.T) {
	s := DefaultSmoother()
	var mean, v Window
	for i := range 200 {
		s.UpdateVariance(&mean, &v, 100, 0.25, 0.25, i == 0)
	}
	if v.Slow != 0 {
		t.Errorf("steady rate: variance %v, want 0", v.Slow)
	}
	// Alternating rates λ±σ√(1/dt) measured over dt have a one-second variance σ².
	for _, dt := range []float64{0.25, 1} {
		var mean, v Window
		sd := 10 / math.Sqrt(dt)
		for i := range 2000 {
			x := 100 + sd
			if i%2 == 1 {
				x = 100 - sd
			}
			s.UpdateVariance(&mean, &v, x, dt, dt, i == 0)
		}
		if math.Abs(v.Slow-100) > 10 {
			t.Errorf("dt %v: one-second variance %v, want about 100", dt, v.Slow)
		}
	}
}
