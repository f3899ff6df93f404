package natsfront

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// fuzzMaxEvent is the event limit FuzzRelayStream runs with, above any input
// the fuzzer makes.
const fuzzMaxEvent = 1 << 20

// endless yields n bytes of b and no newline.
type endless struct {
	b    byte
	n    int
	read int
}

func (e *endless) Read(p []byte) (int, error) {
	if e.read >= e.n {
		return 0, io.EOF
	}
	k := min(len(p), e.n-e.read)
	for i := range p[:k] {
		p[i] = e.b
	}
	e.read += k
	return k, nil
}

// TestReadSSEBoundsEvents checks that an engine answer with a line or an
// event larger than the limit fails the stream after reading about the
// limit, instead of buffering it whole.
func TestReadSSEBoundsEvents(t *testing.T) {
	const limit = 64 << 10
	line := &endless{b: 'a', n: 64 << 20}
	err := readSSE(io.MultiReader(bytes.NewReader([]byte("data: ")), line), limit, func([]byte) { t.Fatal("event from an endless line") })
	if !errors.Is(err, errEventTooLarge) {
		t.Fatalf("endless line: err %v, want errEventTooLarge", err)
	}
	if line.read > 2*limit+64<<10 {
		t.Fatalf("read %d bytes of an endless line before failing (limit %d)", line.read, limit)
	}
	// Many short data lines that add up to one event beyond the limit.
	body := bytes.Repeat([]byte("data: 0123456789\n"), 2*limit/10)
	if err := readSSE(bytes.NewReader(body), limit, func([]byte) { t.Fatal("oversized event relayed") }); !errors.Is(err, errEventTooLarge) {
		t.Fatalf("long event: err %v, want errEventTooLarge", err)
	}
	// Long lines within the limit still arrive whole.
	big := bytes.Repeat([]byte("x"), limit-10)
	var got [][]byte
	in := append(append([]byte("data: "), big...), "\n\ndata: [DONE]\n\n"...)
	if err := readSSE(bytes.NewReader(in), limit, func(d []byte) { got = append(got, bytes.Clone(d)) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !bytes.Equal(got[0], big) {
		t.Fatalf("got %d events, first of %d bytes; want the %d-byte event and [DONE]", len(got), len(got[0]), len(big))
	}
}

// FuzzRelayStream feeds engine answers to the NATS front's SSE relay
// (relayStream over readSSE), the path that turns an HTTP engine's streamed
// answer into reply messages: it must never fail on a complete body, must end
// with exactly one last message, must never relay [DONE], and what it relays
// must come from the body.
func FuzzRelayStream(f *testing.F) {
	for _, s := range []string{
		"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n",
		"data:x\r\ndata:y\r\n\r\ndata: z\n\n",
		": keep-alive\n\nevent: message\nid: 1\ndata: {}\n\n",
		"data: a\ndata: b",
		"data: ",
		"\n\n\n",
		"data: [DONE]",
		"data:[DONE]\n\ndata: after\n\n",
		"",
		"\r\r\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var events [][]byte
		if err := readSSE(bytes.NewReader(body), fuzzMaxEvent, func(d []byte) { events = append(events, bytes.Clone(d)) }); err != nil {
			t.Fatalf("readSSE on a complete body: %v", err)
		}
		total := 0
		for _, e := range events {
			total += len(e)
			for _, part := range bytes.Split(e, []byte("\n")) {
				if !bytes.Contains(body, part) {
					t.Fatalf("event %q holds %q, which is not in the body", e, part)
				}
			}
		}
		if total > len(body) {
			t.Fatalf("%d bytes of events from a %d-byte body", total, len(body))
		}
		if len(events) > 0 && !bytes.Contains(body, []byte("data:")) {
			t.Fatalf("events %q from a body without data lines", events)
		}

		type sent struct {
			last bool
			data []byte
		}
		var out []sent
		err := (&Front{}).relayStream(bytes.NewReader(body), fuzzMaxEvent, func(last bool, data []byte) {
			out = append(out, sent{last, bytes.Clone(data)})
		})
		if err != nil {
			t.Fatalf("relayStream on a complete body: %v", err)
		}
		if len(out) == 0 || !out[len(out)-1].last {
			t.Fatalf("relayed %d messages, the last not marked last", len(out))
		}
		want := 0
		for _, e := range events {
			if !bytes.Equal(e, []byte("[DONE]")) {
				want++
			}
		}
		if n := len(out); n != max(want, 1) {
			t.Fatalf("relayed %d messages for %d events other than [DONE]", n, want)
		}
		for i, m := range out {
			if m.last != (i == len(out)-1) {
				t.Fatalf("message %d of %d marked last=%v", i, len(out), m.last)
			}
			if bytes.Equal(m.data, []byte("[DONE]")) {
				t.Fatal("relayed [DONE]")
			}
		}
	})
}
