package router

import (
	"bytes"
	"testing"
)

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
		if err := readSSE(bytes.NewReader(body), func(d []byte) { events = append(events, bytes.Clone(d)) }); err != nil {
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
		err := (&NATSFront{}).relayStream(bytes.NewReader(body), func(last bool, data []byte) {
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
