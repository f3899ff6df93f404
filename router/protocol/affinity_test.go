package protocol

import (
	"fmt"
	"strings"
	"testing"
)

func mustParse(t testing.TB, ep Endpoint, body string) *Request {
	t.Helper()
	req, err := ParseRequest(ep, []byte(body))
	if err != nil {
		t.Fatalf("ParseRequest(%s): %v", body, err)
	}
	return req
}

func TestAffinityKeySources(t *testing.T) {
	long := strings.Repeat("x", 3*MaxPrefixBytes)
	cases := []struct {
		name    string
		session string
		ep      Endpoint
		body    string
		want    KeySource
	}{
		{"session wins", "s1", EndpointChat, `{"model":"m","user":"u","messages":[{"role":"user","content":"hi"}]}`, KeySession},
		{"user", "", EndpointChat, `{"model":"m","user":"u","messages":[{"role":"user","content":"hi"}]}`, KeyUser},
		{"chat prefix", "", EndpointChat, `{"model":"m","messages":[{"role":"system","content":"be nice"},{"role":"user","content":"hi"}]}`, KeyPrefix},
		{"chat parts", "", EndpointChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`, KeyPrefix},
		{"chat empty", "", EndpointChat, `{"model":"m","messages":[{"role":"user","content":""}]}`, KeyNone},
		{"completion string", "", EndpointCompletions, `{"model":"m","prompt":"once upon"}`, KeyPrefix},
		{"completion tokens", "", EndpointCompletions, `{"model":"m","prompt":[1,2,3]}`, KeyPrefix},
		{"completion none", "", EndpointCompletions, `{"model":"m"}`, KeyNone},
		{"long prompt", "", EndpointCompletions, `{"model":"m","prompt":"` + long + `"}`, KeyPrefix},
		{"responses conversation", "", EndpointResponses, `{"model":"m","user":"u","conversation":"c1","input":"hi"}`, KeySession},
		{"responses previous", "", EndpointResponses, `{"model":"m","user":"u","previous_response_id":"resp_1","input":"hi"}`, KeySession},
		{"chat prompt_cache_key", "", EndpointChat, `{"model":"m","user":"u","prompt_cache_key":"k","messages":[{"role":"user","content":"hi"}]}`, KeySession},
		{"responses user", "", EndpointResponses, `{"model":"m","user":"u","input":"hi"}`, KeyUser},
		{"responses string", "", EndpointResponses, `{"model":"m","input":"hi"}`, KeyPrefix},
		{"responses instructions only", "", EndpointResponses, `{"model":"m","instructions":"be brief"}`, KeyPrefix},
		{"responses items", "", EndpointResponses, `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}]}`, KeyPrefix},
		{"responses none", "", EndpointResponses, `{"model":"m","input":[{"type":"function_call_output","output":"x"}]}`, KeyNone},
		{"embeddings ignore session and user", "s1", EndpointEmbeddings, `{"model":"m","user":"u","input":"hi"}`, KeyNone},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := mustParse(t, c.ep, c.body)
			k1, src := AffinityKey(c.session, req)
			if src != c.want {
				t.Fatalf("source %v, want %v", src, c.want)
			}
			if k2, _ := AffinityKey(c.session, mustParse(t, c.ep, c.body)); k1 != k2 {
				t.Fatalf("key %x then %x for the same request", k1, k2)
			}
		})
	}
}

func TestAffinityKeyPrefix(t *testing.T) {
	chat := func(sys, first, second string) *Request {
		return mustParse(t, EndpointChat, `{"model":"m","messages":[{"role":"system","content":"`+sys+
			`"},{"role":"user","content":"`+first+`"},{"role":"assistant","content":"`+second+`"}]}`)
	}
	k := func(r *Request) uint64 { key, _ := AffinityKey("", r); return key }
	base := k(chat("sys", "q1", "a1"))
	if got := k(chat("sys", "q1", "another turn")); got != base {
		t.Errorf("later turns changed the key: %x vs %x", got, base)
	}
	if got := k(chat("sys", "q2", "a1")); got == base {
		t.Errorf("a different first message kept the key %x", got)
	}
	if got := k(chat("sy", "sq1", "a1")); got == base {
		t.Errorf("moving bytes between system and first message kept the key %x", got)
	}
	// Only the first MaxPrefixBytes bytes count.
	p := strings.Repeat("a", MaxPrefixBytes)
	c1 := mustParse(t, EndpointCompletions, `{"model":"m","prompt":"`+p+`tail one"}`)
	c2 := mustParse(t, EndpointCompletions, `{"model":"m","prompt":"`+p+`tail two"}`)
	if k(c1) != k(c2) {
		t.Errorf("bytes past MaxPrefixBytes changed the key")
	}
}

func TestAffinityKeyAllocs(t *testing.T) {
	req := mustParse(t, EndpointChat, `{"model":"m","messages":[{"role":"system","content":"be nice"},{"role":"user","content":"hi"}]}`)
	if n := testing.AllocsPerRun(100, func() { AffinityKey("", req) }); n != 0 {
		t.Fatalf("AffinityKey allocates %.1f times", n)
	}
}

func FuzzAffinityKey(f *testing.F) {
	f.Add("", `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}]}`, false)
	f.Add("sess", `{"model":"m","prompt":"hello"}`, true)
	f.Add("", `{"model":"m","prompt":[[1,2],[3]]}`, true)
	f.Add("", `{"model":"m","user":"u","messages":[{"role":"user","content":[{"type":"image_url"},{"type":"text","text":"x"}]}]}`, false)
	f.Fuzz(func(t *testing.T, session, body string, completions bool) {
		ep := EndpointChat
		if completions {
			ep = EndpointCompletions
		}
		req, err := ParseRequest(ep, []byte(body))
		if err != nil { // try it as a Responses API request
			req, err = ParseRequest(EndpointResponses, []byte(body))
		}
		if err != nil {
			req = nil
		}
		k1, s1 := AffinityKey(session, req)
		k2, s2 := AffinityKey(session, req)
		if k1 != k2 || s1 != s2 {
			t.Fatalf("nondeterministic key: %x/%v then %x/%v", k1, s1, k2, s2)
		}
		if session != "" && s1 != KeySession && (req == nil || req.Endpoint != EndpointEmbeddings) {
			t.Fatalf("session %q given, source %v", session, s1)
		}
		if s1 == KeyNone && k1 != 0 {
			t.Fatalf("source none with key %x", k1)
		}
	})
}

// BenchmarkAffinityKey measures key extraction from a parsed chat request
// with a long system prompt.
func BenchmarkAffinityKey(b *testing.B) {
	req := mustParse(b, EndpointChat, `{"model":"m","messages":[{"role":"system","content":"`+
		fmt.Sprintf("%0900d", 0)+`"},{"role":"user","content":"`+fmt.Sprintf("%01500d", 1)+`"}]}`)
	b.ReportAllocs()
	for b.Loop() {
		AffinityKey("", req)
	}
}
