package messages

import (
	"bytes"
	"encoding/binary"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// mp builds MessagePack by hand, so that tests can write headers that claim
// more than follows them.
type mp []byte

func (b mp) fixmap(n int) mp   { return append(b, 0x80|byte(n)) }
func (b mp) fixarray(n int) mp { return append(b, 0x90|byte(n)) }
func (b mp) str(s string) mp   { return append(append(b, 0xa0|byte(len(s))), s...) }
func (b mp) u8(v byte) mp      { return append(b, v) }
func (b mp) hdr32(t byte, n uint32) mp {
	return binary.BigEndian.AppendUint32(append(b, t), n)
}
func (b mp) hdr16(t byte, n uint16) mp {
	return binary.BigEndian.AppendUint16(append(b, t), n)
}

// Type bytes of the 32-bit headers.
const (
	tArr32 = 0xdd
	tMap32 = 0xdf
	tStr32 = 0xdb
	tBin32 = 0xc6
	tExt32 = 0xc9
	tArr16 = 0xdc
	tMap16 = 0xde
)

const huge = 1<<31 - 1

// head starts a message of kind k whose map holds n entries, v and k included.
func head(k Kind, n int) mp {
	return mp(nil).fixmap(n).str("v").u8(1).str("k").str(string(k))
}

type poison struct {
	name string
	kind Kind
	data []byte
}

func chain(t byte, n, reps int) []byte {
	var b mp
	for range reps {
		b = b.hdr16(t, uint16(n))
	}
	return b
}

func poisons() []poison {
	ps := []poison{
		{"signal tx array32 2^31-1 (the 21-byte poison)", KindSignal, head(KindSignal, 3).str("tx").hdr32(tArr32, huge)},
		{"signal tx array32 2^32-1", KindSignal, head(KindSignal, 3).str("tx").hdr32(tArr32, 1<<32-1)},
		{"signal tx array16 65535", KindSignal, head(KindSignal, 3).str("tx").hdr16(tArr16, 65535)},
		{"engine_state tx array32", KindEngineState, head(KindEngineState, 3).str("tx").hdr32(tArr32, huge)},
		{"signal tx entry str32", KindSignal, head(KindSignal, 3).str("tx").fixarray(1).fixmap(1).str("k").hdr32(tStr32, huge)},
		{"signal tx entry map32", KindSignal, head(KindSignal, 3).str("tx").fixarray(1).hdr32(tMap32, huge)},
		{"signal model str32", KindSignal, head(KindSignal, 3).str("m").hdr32(tStr32, huge)},
		{"signal model bin32", KindSignal, head(KindSignal, 3).str("m").hdr32(tBin32, huge)},
		{"signal model ext32", KindSignal, head(KindSignal, 3).str("m").hdr32(tExt32, huge)},
		{"report eo map32 2^31-1", KindReport, head(KindReport, 3).str("eo").hdr32(tMap32, huge)},
		{"report eo entry err map32", KindReport, head(KindReport, 3).str("eo").fixmap(1).str("e").fixmap(1).str("err").hdr32(tMap32, huge)},
		{"report eo entry key str32", KindReport, head(KindReport, 3).str("eo").fixmap(1).hdr32(tStr32, huge)},
		{"report pri map32", KindReport, head(KindReport, 3).str("pri").hdr32(tMap32, huge)},
		{"report rtt map16 chain", KindReport, append(head(KindReport, 3).str("rtt"), chain(tMap16, 65535, 1000)...)},
		{"weights w map32", KindWeights, head(KindWeights, 3).str("w").hdr32(tMap32, huge)},
		{"weights se array32", KindWeights, head(KindWeights, 3).str("se").hdr32(tArr32, huge)},
		{"weights se entry str32", KindWeights, head(KindWeights, 3).str("se").fixarray(2).str("a").hdr32(tStr32, huge)},
		{"weights sl bin32", KindWeights, head(KindWeights, 3).str("sl").hdr32(tBin32, huge)},
		{"demand ro entry pri map32", KindDemandState, head(KindDemandState, 3).str("ro").fixmap(1).str("A-1").fixmap(1).str("pri").hdr32(tMap32, huge)},
		{"top-level map32", KindSignal, mp(nil).hdr32(tMap32, huge)},
		{"top-level array32", KindSignal, mp(nil).hdr32(tArr32, huge)},
		{"top-level str32", KindSignal, mp(nil).hdr32(tStr32, huge)},
		{"top-level bin32", KindSignal, mp(nil).hdr32(tBin32, huge)},
		{"top-level ext32", KindSignal, mp(nil).hdr32(tExt32, huge)},
		{"array16 chain", KindSignal, chain(tArr16, 65535, 2000)},
		{"deep fixarray nesting", KindSignal, append(bytes.Repeat([]byte{0x91}, 10000), 0xc0)},
		{"nesting one past the limit", KindSignal, append(bytes.Repeat([]byte{0x91}, MaxNesting+1), 0xc0)},
		{"never-used byte 0xc1", KindSignal, head(KindSignal, 3).str("m").u8(0xc1)},
		{"truncated length", KindSignal, head(KindSignal, 3).str("m").u8(0xda).u8(0x01)},
	}
	for _, m := range goodMessages() {
		data, err := EncodeAt(m, testNow)
		if err != nil {
			panic(err)
		}
		for _, cut := range []int{0, 1, len(data) / 3, len(data) / 2, len(data) - 1} {
			ps = append(ps, poison{"truncated " + string(m.MessageKind()), m.MessageKind(), data[:cut]})
		}
		ps = append(ps, poison{"trailing byte after " + string(m.MessageKind()), m.MessageKind(), append(data[:len(data):len(data)], 0xc0)})
	}
	return ps
}

// allocPerRun reports the bytes f allocates per call, over runs calls.
func allocPerRun(runs int, f func()) uint64 {
	f() // warm up: first calls build msgpack's per-type caches
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / uint64(runs)
}

// TestPoisonRejectedCheaply sends every poison shape through each decode entry
// point services call: each must fail with ErrDecode, quickly, and allocate
// little.
func TestPoisonRejectedCheaply(t *testing.T) {
	const maxBytes = 64 << 10
	for _, p := range poisons() {
		entries := map[string]func() error{
			"DecodeIntoAt": func() error {
				m, err := New(p.kind)
				if err != nil {
					return err
				}
				return DecodeIntoAt(p.data, m, testNow)
			},
			"DecodeAt": func() error { _, err := DecodeAt(p.data, testNow); return err },
			"Peek":     func() error { _, _, err := Peek(p.data); return err },
		}
		for entry, f := range entries {
			if err := f(); !errors.Is(err, ErrDecode) {
				t.Errorf("%s: %s: err %v, want ErrDecode", p.name, entry, err)
				continue
			}
			// The fastest of a few calls, so that a loaded machine does not
			// count: the rejections take microseconds, what they replace
			// took hundreds of milliseconds or ran out of memory.
			fastest := time.Hour
			for range 5 {
				start := time.Now()
				_ = f()
				fastest = min(fastest, time.Since(start))
			}
			if fastest > 5*time.Millisecond {
				t.Errorf("%s: %s took %v", p.name, entry, fastest)
			}
			if n := allocPerRun(20, func() { _ = f() }); n > maxBytes {
				t.Errorf("%s: %s allocated %d bytes per call (limit %d)", p.name, entry, n, maxBytes)
			}
		}
	}
}

// TestPoisonSignalAllocatesLittle pins the figure for the 21-byte signal.
func TestPoisonSignalAllocatesLittle(t *testing.T) {
	data := head(KindSignal, 3).str("tx").hdr32(tArr32, huge)
	if len(data) != 21 {
		t.Fatalf("poison is %d bytes, want 21", len(data))
	}
	var sig EngineSignal
	n := allocPerRun(100, func() { _ = DecodeIntoAt(data, &sig, testNow) })
	t.Logf("21-byte poison: %d bytes allocated per decode", n)
	if n > 4<<10 {
		t.Errorf("21-byte poison allocated %d bytes per decode, want < 4 KiB", n)
	}
	err := DecodeIntoAt(data, &sig, testNow)
	if !strings.Contains(err.Error(), "claims 2147483647") {
		t.Errorf("error %q does not say what the header claimed", err)
	}
}

// TestWellFormedFloodAllocatesProportionally checks the bound that holds once
// the scan accepts: a message whose containers really hold as many entries as
// they claim, in as few bytes as MessagePack allows, allocates a bounded
// multiple of its size.
func TestWellFormedFloodAllocatesProportionally(t *testing.T) {
	const factor = 128
	for _, tc := range []struct {
		name  string
		kind  Kind
		key   string
		entry []byte
		limit int
	}{
		{"report eo of empty outcomes", KindReport, "eo", []byte{0xa0, 0x80}, MaxMessageSize},
		{"report rtt of nils", KindReport, "rtt", []byte{0xa0, 0xc0}, MaxMessageSize},
		{"signal tx of nils", KindSignal, "tx", []byte{0xc0}, MaxMessageSize},
		{"weights se of empty names", KindWeights, "se", []byte{0xa0}, MaxSnapshotSize},
		{"weights w of nils", KindWeights, "w", []byte{0xa0, 0xc0}, MaxSnapshotSize},
	} {
		h := head(tc.kind, 3).str(tc.key)
		n := min((tc.limit-len(h)-5)/len(tc.entry), MaxContainerLen)
		if tc.entry[0] == 0xa0 && len(tc.entry) == 2 {
			h = h.hdr32(tMap32, uint32(n))
		} else {
			h = h.hdr32(tArr32, uint32(n))
		}
		data := append(h, bytes.Repeat(tc.entry, n)...)
		if err := scanMsgpack(data); err != nil {
			t.Fatalf("%s: scan rejects a well-formed message: %v", tc.name, err)
		}
		m, _ := New(tc.kind)
		got := allocPerRun(3, func() { _ = DecodeIntoAt(data, m, testNow) })
		t.Logf("%s: %d entries in %d bytes: %d bytes allocated (%.1fx)", tc.name, n, len(data), got, float64(got)/float64(len(data)))
		if got > uint64(factor*len(data)) && !raceEnabled {
			t.Errorf("%s: %d bytes allocated for %d bytes of input, more than %dx", tc.name, got, len(data), factor)
		}
	}
}

// TestScanContainerLimit checks that MaxContainerLen entries are accepted and
// one more is not, for maps and arrays.
func TestScanContainerLimit(t *testing.T) {
	for _, tc := range []struct {
		t     byte
		entry []byte
	}{{tArr32, []byte{0xc0}}, {tMap32, []byte{0xc0, 0xc0}}} {
		for _, n := range []int{MaxContainerLen, MaxContainerLen + 1} {
			data := append(mp(nil).hdr32(tc.t, uint32(n)), bytes.Repeat(tc.entry, n)...)
			err := scanMsgpack(data)
			if n <= MaxContainerLen && err != nil {
				t.Errorf("0x%02x of %d: %v", tc.t, n, err)
			}
			if n > MaxContainerLen && !errors.Is(err, ErrDecode) {
				t.Errorf("0x%02x of %d: err %v, want ErrDecode", tc.t, n, err)
			}
		}
	}
}

// TestScanAcceptsGoodMessages checks that the scan passes every message this
// package writes, including the largest snapshot, and values of every type.
func TestScanAcceptsGoodMessages(t *testing.T) {
	msgs := append(goodMessages(), snapshotWithSlots(MaxSnapshotSlots), goodPenalty())
	for _, m := range msgs {
		data, err := EncodeAt(m, testNow)
		if err != nil {
			t.Fatal(err)
		}
		if err := scanMsgpack(data); err != nil {
			t.Errorf("%s: %v", m.MessageKind(), err)
		}
	}
	values := []any{
		nil, true, false, 0, 127, -1, -32, -33, 200, 70000, 1 << 40, -1 << 40, uint64(1 << 63), float32(1.5), 2.5,
		"", strings.Repeat("x", 31), strings.Repeat("x", 300), strings.Repeat("x", 70000),
		[]byte{}, []byte{1, 2}, bytes.Repeat([]byte{1}, 70000), []int{}, make([]int, 20), make([]int, MaxContainerLen),
		map[string]int{}, map[string]int{"a": 1}, time.Unix(1, 0), time.Unix(1, 5), time.Unix(1<<40, 5),
		map[string]any{"a": []any{map[string]any{"b": []byte{1}}, nil, 1.0}},
	}
	for _, v := range values {
		data, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := scanMsgpack(data); err != nil {
			t.Errorf("%T: %v", v, err)
		}
	}
	for _, ext := range [][]byte{{0xd4, 1, 0}, {0xd5, 1, 0, 0}, {0xd6, 1, 0, 0, 0, 0}, {0xd7, 1, 0, 0, 0, 0, 0, 0, 0, 0},
		append([]byte{0xd8, 1}, make([]byte, 16)...), {0xc7, 3, 1, 0, 0, 0}, {0xc8, 0, 1, 1, 0}, {0xc9, 0, 0, 0, 0, 1}} {
		if err := scanMsgpack(ext); err != nil {
			t.Errorf("ext % x: %v", ext, err)
		}
	}
}

// TestScanNestingLimit checks that MaxNesting containers are accepted and one
// more is not.
func TestScanNestingLimit(t *testing.T) {
	ok := append(bytes.Repeat([]byte{0x91}, MaxNesting), 0xc0)
	if err := scanMsgpack(ok); err != nil {
		t.Errorf("%d nested arrays: %v", MaxNesting, err)
	}
	deep := append(bytes.Repeat([]byte{0x81, 0xa0}, MaxNesting+1), 0xc0)
	if err := scanMsgpack(deep); !errors.Is(err, ErrDecode) || !strings.Contains(err.Error(), "nested") {
		t.Errorf("%d nested maps: %v, want a nesting error", MaxNesting+1, err)
	}
	// Containers that close before the next opens do not add up.
	var wide mp
	wide = wide.fixarray(15)
	for range 15 {
		wide = append(wide, bytes.Repeat([]byte{0x91}, MaxNesting-1)...).u8(0xc0)
	}
	if err := scanMsgpack(wide); err != nil {
		t.Errorf("siblings each %d deep: %v", MaxNesting, err)
	}
}

// TestScanCountsOwedValues checks that a header is held to the values that
// the containers around it still owe, not just to its own.
func TestScanCountsOwedValues(t *testing.T) {
	// An array of 3 whose first element claims 3 values: 4 bytes would
	// satisfy a check of the inner header alone, but the outer still owes 2.
	data := []byte{0x93, 0x93, 0xc0, 0xc0, 0xc0}
	if err := scanMsgpack(data); !errors.Is(err, ErrDecode) {
		t.Errorf("err %v, want ErrDecode", err)
	}
	if err := scanMsgpack(append(data, 0xc0, 0xc0)); err != nil {
		t.Errorf("complete: %v", err)
	}
}
