package protocol

import (
	"fmt"
	"strings"
	"testing"
)

func TestTextPrefix(t *testing.T) {
	long := strings.Repeat("ab", 3000)
	esc := strings.Repeat(`\u00e9x`, 3000) // é x, escaped
	for _, tc := range []struct{ raw, want string }{
		{`"hi"`, "hi"},
		{`""`, ""},
		{`"a\nb"`, "a\nb"},
		{`"` + long + `"`, long[:MaxPrefixBytes]},
		{`"` + esc + `"`, strings.Repeat("éx", 3000)[:MaxPrefixBytes]},
		{`"` + strings.Repeat(`\u0041`, 5000) + `"`, strings.Repeat("A", MaxPrefixBytes)},
		{`"` + strings.Repeat(`\ud83d\ude00`, 3000) + `"`, strings.Repeat("😀", 3000)[:MaxPrefixBytes]},
		{"\"\xff" + long + "\"", ("\uFFFD" + long)[:MaxPrefixBytes]},
	} {
		got, ok := textPrefix([]byte(tc.raw), MaxPrefixBytes)
		if !ok || got != tc.want {
			t.Errorf("textPrefix(%.20q...) = %.20q... (%d bytes), want %.20q... (%d bytes)", tc.raw, got, len(got), tc.want, len(tc.want))
		}
	}
	if _, ok := textPrefix([]byte(`5`), 10); ok {
		t.Error("a number is a string")
	}
}

// TestAffinityKeyUnchangedByKeptPrefix: the key of a request whose
// messages and prompts are longer than the parser keeps is the key of the
// whole content.
func TestAffinityKeyUnchangedByKeptPrefix(t *testing.T) {
	sys := strings.Repeat("s", 1500)
	user := strings.Repeat("u", 5000)
	body := fmt.Sprintf(`{"model":"m","messages":[{"role":"assistant","content":"x"},{"role":"system","content":%q},{"role":"user","content":[{"type":"text","text":%q},{"type":"text","text":"more"}]}]}`, sys, user)
	req, err := ParseRequest(EndpointChat, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	full := &Request{Endpoint: EndpointChat, Model: "m", Messages: []Message{
		{Role: "assistant", Text: []string{"x"}}, {Role: "system", Text: []string{sys}}, {Role: "user", Text: []string{user, "more"}}}}
	if a, b := mustKey(AffinityKey("", req)), mustKey(AffinityKey("", full)); a != b {
		t.Errorf("key %x, of the whole content %x", a, b)
	}
	creq, err := ParseRequest(EndpointCompletions, []byte(fmt.Sprintf(`{"model":"m","prompt":[%q,"b"]}`, user)))
	if err != nil {
		t.Fatal(err)
	}
	cfull := &Request{Endpoint: EndpointCompletions, Model: "m", Prompts: []string{user, "b"}}
	if a, b := mustKey(AffinityKey("", creq)), mustKey(AffinityKey("", cfull)); a != b {
		t.Errorf("completions key %x, of the whole prompt %x", a, b)
	}
}

func mustKey(k uint64, _ KeySource) uint64 { return k }
