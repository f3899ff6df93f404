package httpfront

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"testing"
	"testing/iotest"
)

func TestReadBody(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	for _, tc := range []struct {
		name     string
		declared int64
		r        io.Reader
		want     []byte
	}{
		{"declared", int64(len(data)), bytes.NewReader(data), data},
		{"unknown length", -1, bytes.NewReader(data), data},
		{"one byte at a time", 100, iotest.OneByteReader(bytes.NewReader(data[:100])), data[:100]},
		{"shorter than declared", 5000, bytes.NewReader(data[:10]), data[:10]},
		{"longer than declared", 10, bytes.NewReader(data[:5000]), data[:5000]},
		{"empty", 0, bytes.NewReader(nil), []byte{}},
	} {
		got, err := readBody(tc.r, tc.declared)
		if err != nil || !bytes.Equal(got, tc.want) {
			t.Errorf("%s: %d bytes, %v; want %d bytes", tc.name, len(got), err, len(tc.want))
		}
	}
	boom := errors.New("boom")
	if _, err := readBody(iotest.ErrReader(boom), 100); !errors.Is(err, boom) {
		t.Errorf("error %v, want boom", err)
	}
}

// TestReadBodyAllocation: an 8 MiB body of declared length costs at most
// about twice its size in all, and a body that declares 8 MiB and sends
// little costs little.
func TestReadBodyAllocation(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 8<<20)
	measure := func(r io.Reader, declared int64) uint64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		if _, err := readBody(r, declared); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	if n := measure(bytes.NewReader(body), int64(len(body))); n > 2*uint64(len(body))+64<<10 {
		t.Errorf("8 MiB body allocated %d bytes (%.2fx)", n, float64(n)/float64(len(body)))
	}
	if n := measure(bytes.NewReader(body[:100]), int64(len(body))); n > 8<<10 {
		t.Errorf("100 bytes of a declared 8 MiB allocated %d bytes", n)
	}
}
