package messages

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

var testNow = time.UnixMilli(1_780_000_000_000)

func goodSignal() *EngineSignal {
	return &EngineSignal{
		Model: "llama", Engine: "engine-a", Region: "r1", Time: testNow.UnixMilli(), Seq: 7,
		TTFTMs: 120, TBTMs: 20, Queue: 3, Running: 12, MaxRunning: 32, KVUse: 0.4, CapacityRPS: 100, LoadRPS: 80,
		OutputTokens: 200, Replicas: 1, Health: 1,
		Transports: []Transport{{Kind: TransportHTTP, Address: "http://127.0.0.1:9001"}},
	}
}

func goodReport() *RouterReport {
	return &RouterReport{
		Model: "llama", Cluster: "A", Router: "A-1", Time: testNow.UnixMilli(), Seq: 1, IntervalS: 1,
		Requests: 90, DemandByPriority: map[string]int64{"standard": 80, "critical": 10}, Shed: 1, Retries: 2,
		Engines: map[string]EngineOutcome{"engine-a": {Sent: 90, Succeeded: 89, Errors: map[string]int64{"5xx": 1}, LatencyMs: 500, TTFTMs: 100}},
		RTTMs:   map[string]float64{"engine-a": 1.2},
	}
}

func goodSnapshot() *WeightSnapshot {
	return &WeightSnapshot{
		Model: "llama", Cluster: "B", Generation: 3, Time: testNow.UnixMilli(),
		Weights: map[string]float64{"engine-b": 0.7, "engine-c": 0.3}, DemandRPS: 120,
		Utilisation: map[string]float64{"engine-b": 0.84}, LatencyMs: map[string]float64{"engine-b": 700},
	}
}

func goodMessages() []Message {
	return append([]Message{
		goodSignal(), goodReport(), goodSnapshot(),
		&EngineState{Model: "llama", Engine: "engine-a", Status: StatusUp, Time: testNow.UnixMilli(),
			LastSignal: testNow.UnixMilli(), TTFTMs: Window{100, 110}, KVUse: Window{0.2, 0.3}, CapacityRPS: 100, Health: 1},
		&DemandState{Model: "llama", Cluster: "A", Time: testNow.UnixMilli(), RPS: Window{90, 88},
			Routers: map[string]RouterDemand{"A-1": {LastReport: testNow.UnixMilli(), Seq: 4, RPS: Window{90, 88}}}},
		&RTTState{Cluster: "A", Engine: "engine-b", Time: testNow.UnixMilli(), RTTMs: Window{5, 5.1}, Samples: 3},
		&KVEvents{Model: "llama", Engine: "engine-a", Time: testNow.UnixMilli(), Epoch: testNow.UnixMilli() - 1000, Seq: 7,
			BlockSize: 16, Removed: []uint64{3}, Stored: []uint64{1, 1 << 63}},
	}, workMessages()...)
}

// workMessages are good messages that carry the mix and variance fields.
func workMessages() []Message {
	sig := goodSignal()
	sig.PromptTokens, sig.PrefillWeight = 1500, 0.08
	rep := goodReport()
	rep.PromptTokens, rep.Completed, rep.OutputTokens = 90*1500, 85, 85*40
	mix := RouterDemand{LastReport: testNow.UnixMilli(), Seq: 4, RPS: Window{90, 88},
		PromptTPS: Window{135000, 132000}, DoneRPS: Window{85, 86}, OutputTPS: Window{3400, 3440}, RPSVar: Window{95, 90}}
	return []Message{sig, rep,
		&EngineState{Model: "llama", Engine: "engine-a", Status: StatusUp, Time: testNow.UnixMilli(),
			LastSignal: testNow.UnixMilli(), CapacityRPS: 100, Health: 1, PromptTokens: Window{1500, 1400}, PrefillWeight: 0.08},
		&DemandState{Model: "llama", Cluster: "A", Time: testNow.UnixMilli(), RPS: mix.RPS, PromptTPS: mix.PromptTPS,
			DoneRPS: mix.DoneRPS, OutputTPS: mix.OutputTPS, RPSVar: mix.RPSVar, Routers: map[string]RouterDemand{"A-1": mix}},
	}
}

func TestRoundTrip(t *testing.T) {
	for _, m := range goodMessages() {
		t.Run(string(m.MessageKind()), func(t *testing.T) {
			data, err := EncodeAt(m, testNow)
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			got, err := DecodeAt(data, testNow)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			again, err := EncodeAt(got, testNow)
			if err != nil {
				t.Fatalf("re-encode: %v", err)
			}
			if !bytes.Equal(data, again) && m.MessageKind() != KindReport && m.MessageKind() != KindWeights && m.MessageKind() != KindDemandState {
				t.Fatalf("re-encoding differs")
			}
			js, err := JSON(got)
			if err != nil {
				t.Fatal(err)
			}
			back, err := FromJSON(m.MessageKind(), js, testNow)
			if err != nil {
				t.Fatalf("from JSON %s: %v", js, err)
			}
			js2, _ := JSON(back)
			if !bytes.Equal(js, js2) {
				t.Fatalf("JSON round trip differs:\n%s\n%s", js, js2)
			}
		})
	}
}

func TestWireUsesShortKeyMaps(t *testing.T) {
	data, err := EncodeAt(goodSignal(), testNow)
	if err != nil {
		t.Fatal(err)
	}
	var generic map[string]any
	if err := msgpack.Unmarshal(data, &generic); err != nil {
		t.Fatalf("signal is not a msgpack map: %v", err)
	}
	for _, k := range []string{"v", "k", "m", "e", "t", "ttft", "tbt", "q", "run", "kv", "cap", "h"} {
		if _, ok := generic[k]; !ok {
			t.Errorf("key %q missing from wire map %v", k, generic)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	enc := func(m map[string]any) []byte {
		b, err := msgpack.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	base := func() map[string]any {
		return map[string]any{"v": 1, "k": "signal", "m": "llama", "e": "engine-a", "t": testNow.UnixMilli(),
			"n": 1, "ttft": 100.0, "tbt": 20.0, "q": 0, "run": 1, "kv": 0.5, "cap": 100.0, "rps": 10.0, "rep": 1, "h": 1.0}
	}
	with := func(k string, v any) []byte {
		m := base()
		m[k] = v
		return enc(m)
	}
	cases := []struct {
		name string
		data []byte
		want error
		in   string
	}{
		{"garbage", []byte("\xc1\xc1 not msgpack"), ErrDecode, ""},
		{"empty", nil, ErrDecode, ""},
		{"array", enc(map[string]any{"v": []int{1}}), ErrDecode, ""},
		{"bad version", with("v", 2), ErrVersion, "v=2"},
		{"unknown kind", with("k", "nope"), ErrKind, "nope"},
		{"NaN", with("ttft", math.NaN()), ErrInvalid, "ttft_ms"},
		{"Inf", with("tbt", math.Inf(1)), ErrInvalid, "tbt_ms"},
		{"negative rate", with("rps", -1.0), ErrInvalid, "load_rps"},
		{"negative max running", with("mrun", -1), ErrInvalid, "max_running"},
		{"kv over 1", with("kv", 1.5), ErrInvalid, "kv_use"},
		{"health negative", with("h", -0.1), ErrInvalid, "health"},
		{"engine with dot", with("e", "engine.a"), ErrInvalid, "engine.a"},
		{"engine with space", with("e", "engine a"), ErrInvalid, "engine"},
		{"white space in model", with("m", "llama 3"), ErrInvalid, "white-space"},
		{"control character in model", with("m", "llama\x01"), ErrInvalid, "control"},
		{"future", with("t", testNow.Add(time.Hour).UnixMilli()), ErrInvalid, "future"},
		{"zero time", with("t", 0), ErrInvalid, "time_ms"},
		{"unknown field", with("zz", 1), ErrDecode, "zz"},
		{"wrong type", with("q", "three"), ErrDecode, ""},
		{"oversize", with("r", strings.Repeat("x", MaxMessageSize)), ErrTooLarge, ""},
		{"bad transport", with("tx", []map[string]any{{"k": "carrier-pigeon", "a": "x"}}), ErrInvalid, "carrier-pigeon"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeAt(tc.data, testNow)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if tc.in != "" && !strings.Contains(err.Error(), tc.in) {
				t.Fatalf("error %q does not mention %q", err, tc.in)
			}
		})
	}
	if _, err := DecodeAt(with("ttft", 100.0), testNow); err != nil {
		t.Fatalf("baseline signal rejected: %v", err)
	}
}

func TestSnapshotWeightsMustSumToOne(t *testing.T) {
	s := goodSnapshot()
	s.Weights["engine-b"] = 0.9
	if _, err := EncodeAt(s, testNow); !errors.Is(err, ErrInvalid) {
		t.Fatalf("got %v, want ErrInvalid", err)
	}
	s = goodSnapshot()
	s.Weights = map[string]float64{"engine-b": 0.5}
	s.ShedFraction = 0.5
	if _, err := EncodeAt(s, testNow); err != nil {
		t.Fatalf("weights plus shed summing to 1 rejected: %v", err)
	}
	s.Generation = 0
	if _, err := EncodeAt(s, testNow); !errors.Is(err, ErrInvalid) {
		t.Fatalf("generation 0 accepted: %v", err)
	}
}

func TestDecodeIntoWrongKind(t *testing.T) {
	data, err := EncodeAt(goodSignal(), testNow)
	if err != nil {
		t.Fatal(err)
	}
	var r RouterReport
	if err := DecodeIntoAt(data, &r, testNow); err == nil {
		t.Fatal("signal decoded as a report")
	}
}

func TestFromJSONRejects(t *testing.T) {
	cases := map[string]string{
		"unknown field": `{"model":"m","engine":"e","time_ms":1,"bogus":1}`,
		"trailing":      `{"model":"m","engine":"e","time_ms":1,"health":1} {}`,
		"wrong kind":    `{"k":"report","model":"m","engine":"e","time_ms":1}`,
		"bad name":      `{"model":"m.x","engine":"e","time_ms":1}`,
	}
	for name, in := range cases {
		if _, err := FromJSON(KindSignal, []byte(in), testNow); err == nil {
			t.Errorf("%s: accepted %s", name, in)
		}
	}
}

func TestValidName(t *testing.T) {
	for _, s := range []string{"a", "engine-a", "A", "llama_3-70b", strings.Repeat("x", MaxNameLen)} {
		if !ValidName(s) {
			t.Errorf("ValidName(%q) = false", s)
		}
	}
	for _, s := range []string{"", "a.b", "a b", "*", ">", "a\x00", "é", strings.Repeat("x", MaxNameLen+1)} {
		if ValidName(s) {
			t.Errorf("ValidName(%q) = true", s)
		}
	}
}

// slotBytes encodes slot indexes as a snapshot carries them.
func slotBytes(idx []uint16) []byte {
	b := make([]byte, 2*len(idx))
	for i, v := range idx {
		b[2*i], b[2*i+1] = byte(v), byte(v>>8)
	}
	return b
}

func snapshotWithSlots(n int) *WeightSnapshot {
	s := goodSnapshot()
	s.SlotEngines = []string{"engine-c", "engine-b"}
	idx := make([]uint16, n)
	for i := range idx {
		if i%10 < 7 {
			idx[i] = 1
		}
	}
	s.Slots = slotBytes(idx)
	return s
}

func TestSnapshotSlotsRoundTrip(t *testing.T) {
	s := snapshotWithSlots(MinSnapshotSlots)
	data, err := EncodeAt(s, testNow)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	var generic map[string]any
	if err := msgpack.Unmarshal(data, &generic); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"se", "sl"} {
		if _, ok := generic[k]; !ok {
			t.Errorf("key %q missing from wire map", k)
		}
	}
	var got WeightSnapshot
	if err := DecodeIntoAt(data, &got, testNow); err != nil {
		t.Fatalf("decode: %v", err)
	}
	if !bytes.Equal(got.Slots, s.Slots) || strings.Join(got.SlotEngines, ",") != "engine-c,engine-b" {
		t.Fatalf("slots did not survive msgpack: %v %d bytes", got.SlotEngines, len(got.Slots))
	}
	js, err := JSON(&got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(js, []byte(`"slot_engines"`)) || !bytes.Contains(js, []byte(`"slots"`)) {
		t.Fatalf("JSON lacks slot fields: %.200s", js)
	}
	back, err := FromJSON(KindWeights, js, testNow)
	if err != nil {
		t.Fatalf("from JSON: %v", err)
	}
	if !bytes.Equal(back.(*WeightSnapshot).Slots, s.Slots) {
		t.Fatal("slots did not survive JSON")
	}
	// Without slots the fields stay off the wire.
	data, err = EncodeAt(goodSnapshot(), testNow)
	if err != nil {
		t.Fatal(err)
	}
	clear(generic)
	if err := msgpack.Unmarshal(data, &generic); err != nil {
		t.Fatal(err)
	}
	if _, ok := generic["se"]; ok {
		t.Error("empty slot_engines encoded")
	}
	if _, ok := generic["sl"]; ok {
		t.Error("empty slots encoded")
	}
}

func TestSnapshotSlotsValidation(t *testing.T) {
	for _, n := range []int{MinSnapshotSlots, 4096, MaxSnapshotSlots} {
		if err := snapshotWithSlots(n).Validate(testNow); err != nil {
			t.Errorf("%d slots rejected: %v", n, err)
		}
	}
	cases := []struct {
		name string
		mod  func(s *WeightSnapshot)
		in   string
	}{
		{"engines without slots", func(s *WeightSnapshot) { s.Slots = nil }, "slots"},
		{"slots without engines", func(s *WeightSnapshot) { s.SlotEngines = nil }, "slot_engines"},
		{"engine not weighted", func(s *WeightSnapshot) { s.SlotEngines[0] = "engine-z" }, "engine-z"},
		{"engine repeated", func(s *WeightSnapshot) { s.SlotEngines[0] = "engine-b" }, "repeats"},
		{"engine bad name", func(s *WeightSnapshot) { s.SlotEngines[0] = "engine.c" }, "slot_engines[0]"},
		{"odd length", func(s *WeightSnapshot) { s.Slots = s.Slots[:len(s.Slots)-1] }, "slots"},
		{"not a power of two", func(s *WeightSnapshot) { s.Slots = s.Slots[:len(s.Slots)-2] }, "power-of-two"},
		{"too few", func(s *WeightSnapshot) { s.Slots = s.Slots[:MinSnapshotSlots] }, "power-of-two"},
		{"too many", func(s *WeightSnapshot) { s.Slots = slotBytes(make([]uint16, 2*MaxSnapshotSlots)) }, "power-of-two"},
		{"index out of range", func(s *WeightSnapshot) { s.Slots[2*17] = 2 }, "slot 17"},
		{"high byte out of range", func(s *WeightSnapshot) { s.Slots[2*5+1] = 1 }, "slot 5"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := snapshotWithSlots(MinSnapshotSlots)
			tc.mod(s)
			err := s.Validate(testNow)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("got %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.in) {
				t.Fatalf("error %q does not mention %q", err, tc.in)
			}
			if _, err := EncodeAt(s, testNow); !errors.Is(err, ErrInvalid) {
				t.Fatalf("encode: got %v, want ErrInvalid", err)
			}
		})
	}
}
