package messages

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// allKinds lists every kind of message, in the order FuzzDecodeInto tries them.
var allKinds = []Kind{KindSignal, KindReport, KindEngineState, KindDemandState, KindRTTState, KindWeights, KindPenalty, KindOperator, KindKVEvents}

// fuzzSeeds adds the good messages, their halves and every poison shape.
func fuzzSeeds(f *testing.F) {
	for _, m := range append(goodMessages(), goodPenalty(), snapshotWithSlots(MinSnapshotSlots)) {
		data, err := EncodeAt(m, testNow)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
		f.Add(data[:len(data)/2])
	}
	for _, p := range poisons() {
		f.Add(p.data)
	}
}

// FuzzDecode checks that no input crashes DecodeAt (what the aggregator's
// state restore and `switchyard decode` call) and that whatever decodes
// re-encodes and decodes to a valid message. Its seed corpus runs as a plain
// test.
func FuzzDecode(f *testing.F) {
	fuzzSeeds(f)
	f.Add([]byte{})
	f.Add([]byte{0xc1})
	f.Add([]byte{0x81, 0xa1, 'v', 0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeAt(data, testNow)
		if err != nil {
			return
		}
		out, err := EncodeAt(m, testNow)
		if err != nil {
			t.Fatalf("decoded message does not re-encode: %v", err)
		}
		if _, err := DecodeAt(out, testNow); err != nil {
			t.Fatalf("re-encoded message does not decode: %v", err)
		}
		if _, err := JSON(m); err != nil {
			t.Fatalf("decoded message does not render as JSON: %v", err)
		}
	})
}

// FuzzDecodeInto feeds every input to DecodeIntoAt into each kind of
// message, the call routers, the aggregator, the optimizer service and the
// dashboard make on what they receive, and to Peek, which the optimizer
// service and the dashboard call on KV values. Whatever fails must fail with
// one of the package's sentinel errors; whatever decodes must validate,
// re-encode and decode again to the same message.
func FuzzDecodeInto(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		_, pk, perr := Peek(data)
		if perr != nil && !errors.Is(perr, ErrDecode) && !errors.Is(perr, ErrTooLarge) {
			t.Fatalf("Peek: error %v wraps no sentinel", perr)
		}
		for _, k := range allKinds {
			m, _ := New(k)
			err := DecodeIntoAt(data, m, testNow)
			if err != nil {
				if !errors.Is(err, ErrDecode) && !errors.Is(err, ErrVersion) && !errors.Is(err, ErrKind) &&
					!errors.Is(err, ErrInvalid) && !errors.Is(err, ErrTooLarge) {
					t.Fatalf("%s: error %v wraps no sentinel", k, err)
				}
				continue
			}
			if perr != nil || pk != k {
				t.Fatalf("%s decodes, but Peek says %q, %v", k, pk, perr)
			}
			out, err := EncodeAt(m, testNow)
			if err != nil {
				t.Fatalf("%s: decoded message does not re-encode: %v", k, err)
			}
			again, _ := New(k)
			if err := DecodeIntoAt(out, again, testNow); err != nil {
				t.Fatalf("%s: re-encoded message does not decode: %v", k, err)
			}
			// Maps encode in random order, so compare what decodes.
			out2, err := EncodeAt(again, testNow)
			if err != nil {
				t.Fatalf("%s: re-decoded message does not encode: %v", k, err)
			}
			third, _ := New(k)
			if err := DecodeIntoAt(out2, third, testNow); err != nil || !reflect.DeepEqual(again, third) {
				t.Fatalf("%s: round trip not stable: %+v then %+v (%v)", k, again, third, err)
			}
		}
	})
}

// FuzzScan checks the pre-scan against the msgpack library: what the scan
// accepts, the library skips as exactly one value, and what the library
// skips as exactly one value the scan accepts unless it nests deeper than
// MaxNesting or holds a container longer than MaxContainerLen.
func FuzzScan(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		err := scanMsgpack(data)
		if err != nil && !errors.Is(err, ErrDecode) {
			t.Fatalf("scan error %v is not ErrDecode", err)
		}
		if err != nil && len(data) > 0 && scanLimitError(err) {
			return
		}
		r := bytes.NewReader(data)
		dec := msgpack.NewDecoder(r)
		serr := dec.Skip()
		skipped := serr == nil && r.Len() == 0
		if err == nil && !skipped {
			t.Fatalf("scan accepts % x, msgpack does not skip it as one value (%v, %d bytes left)", data, serr, r.Len())
		}
		if err != nil && skipped {
			t.Fatalf("msgpack skips % x as one value, scan says %v", data, err)
		}
	})
}

// FuzzFromJSON checks that the JSON parser behind `switchyard encode` never crashes.
func FuzzFromJSON(f *testing.F) {
	f.Add(`{"model":"llama","engine":"engine-a","time_ms":1780000000000,"ttft_ms":100,"health":1}`)
	f.Add(`{"model":"llama","cluster":"A","generation":1,"time_ms":1780000000000,"weights":{"e":1}}`)
	f.Add(`{`)
	f.Add(`null`)
	f.Fuzz(func(t *testing.T, in string) {
		for _, k := range []Kind{KindSignal, KindWeights, KindReport} {
			m, err := FromJSON(k, []byte(in), testNow)
			if err != nil {
				continue
			}
			if _, err := EncodeAt(m, testNow); err != nil {
				t.Fatalf("accepted JSON does not encode: %v", err)
			}
		}
	})
}

// scanLimitError reports whether the scan rejected well-formed MessagePack
// for exceeding MaxNesting or MaxContainerLen.
func scanLimitError(err error) bool {
	s := err.Error()
	return strings.Contains(s, "nested deeper than") || strings.Contains(s, "entries (limit")
}
