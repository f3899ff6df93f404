package messages

import (
	"testing"
)

// FuzzDecode checks that no input crashes the decoder and that whatever decodes
// re-encodes and decodes to a valid message. Its seed corpus runs as a plain test.
func FuzzDecode(f *testing.F) {
	for _, m := range goodMessages() {
		data, err := EncodeAt(m, testNow)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
		f.Add(data[:len(data)/2])
	}
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
