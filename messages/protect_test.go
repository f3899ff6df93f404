package messages

import (
	"errors"
	"math"
	"testing"
)

func goodPenalty() *Penalty {
	ms := testNow.UnixMilli()
	return &Penalty{Model: "llama", Engine: "engine-a", Time: ms, Phase: PhasePenalised, Multiplier: 0,
		Reason: ReasonFailures, Detail: "2 failed intervals", Since: ms, Until: ms + 5000, RecoverUntil: ms + 15000, Strikes: 1}
}

func TestProtectionMessagesRoundTrip(t *testing.T) {
	ms := testNow.UnixMilli()
	st := &EngineState{Model: "llama", Engine: "engine-a", Status: StatusUp, Time: ms, Health: 1,
		Outcomes: &EngineOutcomes{LastReport: ms, LastSent: ms, Reports: 3, SentRPS: Window{10, 9},
			ErrorRate: Window{0.5, 0.1}, TimeoutRate: Window{0, 0}, TTFTMs: Window{120, 100}, FailedIntervals: 2}}
	for _, m := range []Message{st, goodPenalty(),
		&Operator{Engine: "engine-a", Action: ActionDrain, Reason: "maintenance", By: "ops@host", Time: ms},
		&Operator{Engine: "engine-a", Model: "llama", Action: ActionHealth, Health: 0.5, Time: ms}} {
		data, err := EncodeAt(m, testNow)
		if err != nil {
			t.Fatalf("%s: encode: %v", m.MessageKind(), err)
		}
		got, err := DecodeAt(data, testNow)
		if err != nil {
			t.Fatalf("%s: decode: %v", m.MessageKind(), err)
		}
		js, err := JSON(got)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := FromJSON(m.MessageKind(), js, testNow); err != nil {
			t.Fatalf("%s: from JSON %s: %v", m.MessageKind(), js, err)
		}
	}
	for _, name := range []string{"penalty", "operator"} {
		if k, err := KindByName(name); err != nil || string(k) != name {
			t.Errorf("KindByName(%q) = %q, %v", name, k, err)
		}
	}
}

func TestProtectionMessagesReject(t *testing.T) {
	ms := testNow.UnixMilli()
	cases := []struct {
		name string
		m    Message
	}{
		{"error rate above 1", &EngineState{Model: "llama", Engine: "e", Status: StatusUp, Time: ms,
			Outcomes: &EngineOutcomes{ErrorRate: Window{1.5, 0}}}},
		{"NaN timeout rate", &EngineState{Model: "llama", Engine: "e", Status: StatusUp, Time: ms,
			Outcomes: &EngineOutcomes{TimeoutRate: Window{math.NaN(), 0}}}},
		{"negative failed intervals", &EngineState{Model: "llama", Engine: "e", Status: StatusUp, Time: ms,
			Outcomes: &EngineOutcomes{FailedIntervals: -1}}},
		{"penalty multiplier above 1", func() Message { p := goodPenalty(); p.Multiplier = 1.5; return p }()},
		{"penalty unknown reason", func() Message { p := goodPenalty(); p.Reason = "bad_luck"; return p }()},
		{"penalty unknown phase", func() Message { p := goodPenalty(); p.Phase = "x"; return p }()},
		{"penalty until before since", func() Message { p := goodPenalty(); p.Until = p.Since - 1; return p }()},
		{"operator unknown action", &Operator{Engine: "e", Action: "reboot", Time: ms}},
		{"operator health above 1", &Operator{Engine: "e", Action: ActionHealth, Health: 2, Time: ms}},
		{"operator drain with health", &Operator{Engine: "e", Action: ActionDrain, Health: 0.5, Time: ms}},
		{"operator bad engine", &Operator{Engine: "e.x", Action: ActionDrain, Time: ms}},
	}
	for _, tc := range cases {
		if _, err := EncodeAt(tc.m, testNow); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err %v, want ErrInvalid", tc.name, err)
		}
	}
}
