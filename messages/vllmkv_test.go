package messages

import (
	"errors"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func goodVLLMBatch() VLLMBatch {
	tokens := make([]uint32, 32)
	for i := range tokens {
		tokens[i] = uint32(1000 + i)
	}
	return VLLMBatch{TS: 1.7e9, DPRank: -1, Events: []VLLMEvent{
		{Type: VLLMBlockStored, Hashes: []uint64{11, 1<<64 - 1}, Tokens: tokens, BlockSize: 16, Medium: "GPU"},
		{Type: VLLMBlockStored, Hashes: []uint64{13}, Parent: 1<<64 - 1, HasParent: true, Tokens: tokens[:16], BlockSize: 16, LoraID: 3},
		{Type: VLLMBlockRemoved, Hashes: []uint64{11}},
		{Type: VLLMAllBlocksCleared},
	}}
}

// msgspecArray builds an event as msgspec writes it with array_like=True.
func msgspecArray(t *testing.T, v ...any) []byte {
	t.Helper()
	data, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestVLLMBatchRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name  string
		asMap bool
		rank  int
	}{{"arrays", false, -1}, {"maps", true, -1}, {"arrays with a rank", false, 2}, {"maps with a rank", true, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			b := goodVLLMBatch()
			b.DPRank = tc.rank
			data, err := EncodeVLLMBatch(b, tc.asMap)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeVLLMBatch(data)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, b) {
				t.Fatalf("decoded\n%+v\nwant\n%+v", got, b)
			}
		})
	}
}

// TestVLLMForms decodes the forms other vLLM versions and settings write,
// built field by field as msgspec lays them out.
func TestVLLMForms(t *testing.T) {
	hash32 := make([]byte, 32)
	hash32[31], hash32[24] = 0x01, 0x80
	for _, tc := range []struct {
		name string
		data []byte
		want VLLMBatch
	}{
		{"bytes hashes become their low 64 bits",
			msgspecArray(t, 1.5, []any{[]any{"BlockStored", []any{hash32}, hash32, []int{1, 2}, 2, nil, "GPU"}}),
			VLLMBatch{TS: 1.5, DPRank: -1, Events: []VLLMEvent{{Type: VLLMBlockStored, Hashes: []uint64{1<<63 | 1},
				Parent: 1<<63 | 1, HasParent: true, Tokens: []uint32{1, 2}, BlockSize: 2, Medium: "GPU"}}}},
		{"a negative Python hash keeps its bits",
			msgspecArray(t, 1.5, []any{[]any{"BlockRemoved", []any{-1}}}),
			VLLMBatch{TS: 1.5, DPRank: -1, Events: []VLLMEvent{{Type: VLLMBlockRemoved, Hashes: []uint64{1<<64 - 1}}}}},
		{"omitted trailing defaults (medium) and an integer ts",
			msgspecArray(t, 2, []any{[]any{"BlockStored", []any{5}, nil, []int{9}, 1, nil}}),
			VLLMBatch{TS: 2, DPRank: -1, Events: []VLLMEvent{{Type: VLLMBlockStored, Hashes: []uint64{5}, Tokens: []uint32{9}, BlockSize: 1}}}},
		{"fields a newer vLLM appends are skipped",
			msgspecArray(t, 1.0, []any{[]any{"BlockStored", []any{5}, nil, []int{9}, 1, nil, "GPU", "lora-x", []any{"extra"}}}, 1, "epoch"),
			VLLMBatch{TS: 1, DPRank: 1, Events: []VLLMEvent{{Type: VLLMBlockStored, Hashes: []uint64{5}, Tokens: []uint32{9}, BlockSize: 1, Medium: "GPU"}}}},
		{"an unknown event type is counted and skipped",
			msgspecArray(t, 1.0, []any{[]any{"BlockMoved", 1, 2}, []any{"AllBlocksCleared"}}),
			VLLMBatch{TS: 1, DPRank: -1, Unknown: 1, Events: []VLLMEvent{{Type: VLLMAllBlocksCleared}}}},
		{"a map event with its type last",
			msgspecArray(t, 1.0, []any{map[string]any{"block_hashes": []int{4}, "medium": nil, "type": "BlockRemoved"}}),
			VLLMBatch{TS: 1, DPRank: -1, Events: []VLLMEvent{{Type: VLLMBlockRemoved, Hashes: []uint64{4}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeVLLMBatch(tc.data)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("decoded\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

func TestVLLMBad(t *testing.T) {
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"not a container", []byte{0x01}},
		{"an array claiming 2^32-1 events", []byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff}},
		{"trailing bytes", append(msgspecArray(t, 1.0, []any{}), 0)},
		{"a NaN ts", []byte{0x92, 0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0, 0x90}},
		{"block_size 0", msgspecArray(t, 1.0, []any{[]any{"BlockStored", []any{5}, nil, []int{9}, 0, nil}})},
		{"a negative token", msgspecArray(t, 1.0, []any{[]any{"BlockStored", []any{5}, nil, []int{-9}, 1, nil}})},
		{"a token above 2^32", msgspecArray(t, 1.0, []any{[]any{"BlockStored", []any{5}, nil, []int64{1 << 33}, 1, nil}})},
		{"a nil block hash", msgspecArray(t, 1.0, []any{[]any{"BlockRemoved", []any{nil}}})},
		{"an empty hash", msgspecArray(t, 1.0, []any{[]any{"BlockRemoved", []any{[]byte{}}}})},
		{"an event with no type", msgspecArray(t, 1.0, []any{[]any{}})},
		{"a tag that is not a string", msgspecArray(t, 1.0, []any{[]any{7}})},
		{"a nil events list", msgspecArray(t, 1.0, nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := DecodeVLLMBatch(tc.data); !errors.Is(err, ErrDecode) {
				t.Fatalf("DecodeVLLMBatch = %v, want ErrDecode", err)
			}
		})
	}
	if _, err := DecodeVLLMBatch(make([]byte, MaxVLLMBatchSize+1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("an oversize batch: %v, want ErrTooLarge", err)
	}
}

// FuzzDecodeVLLMBatch checks that no input crashes the decoder of what an
// engine sends over ZMQ, and that whatever decodes re-encodes, in both
// forms, to a batch that decodes the same.
func FuzzDecodeVLLMBatch(f *testing.F) {
	for _, asMap := range []bool{false, true} {
		data, err := EncodeVLLMBatch(goodVLLMBatch(), asMap)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
		f.Add(data[:len(data)/2])
	}
	f.Add([]byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := DecodeVLLMBatch(data)
		if err != nil {
			return
		}
		b.Unknown = 0
		for _, asMap := range []bool{false, true} {
			out, err := EncodeVLLMBatch(b, asMap)
			if err != nil {
				t.Fatalf("decoded batch does not re-encode: %v", err)
			}
			again, err := DecodeVLLMBatch(out)
			if err != nil {
				t.Fatalf("re-encoded batch does not decode: %v", err)
			}
			if len(again.Events) != len(b.Events) {
				t.Fatalf("re-decoded %d events, want %d", len(again.Events), len(b.Events))
			}
		}
	})
}
