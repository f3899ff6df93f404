package protocol

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/switchyard-dev/switchyard/kvindex"
)

func chatBody(t testing.TB, msgs ...string) string {
	t.Helper()
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var m []msg
	for i, c := range msgs {
		role := "user"
		switch {
		case i == 0:
			role = "system"
		case i%2 == 0:
			role = "assistant"
		}
		m = append(m, msg{role, c})
	}
	b, err := json.Marshal(map[string]any{"model": "m", "messages": m})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestPrefixKeys: a conversation's next turn repeats its keys and adds
// some; a long shared system prompt is several blocks, and conversations
// after it differ; token prompts give kvindex's keys.
func TestPrefixKeys(t *testing.T) {
	sys := strings.Repeat("You are a careful assistant. ", 110) // ~3 KB
	keys := func(body string, ep Endpoint) []uint64 {
		k, _ := PrefixKeys(nil, mustParse(t, ep, body))
		return k
	}
	t1 := keys(chatBody(t, sys, "What is a KV cache?"), EndpointChat)
	t2 := keys(chatBody(t, sys, "What is a KV cache?", "It stores attention keys.", "And a prefix cache?"), EndpointChat)
	other := keys(chatBody(t, sys, "How do I bake bread?"), EndpointChat)
	if len(t1) < 7 {
		t.Fatalf("turn 1 has %d keys, want at least 7 (a 3 KB system prompt is 6 or more blocks, then the user's)", len(t1))
	}
	if !slices.Equal(t2[:len(t1)], t1) || len(t2) != len(t1)+2 {
		t.Fatalf("turn 2's keys %v do not extend turn 1's %v by two messages", t2, t1)
	}
	n := len(t1) - 1
	if !slices.Equal(other[:n], t1[:n]) || other[n] == t1[n] {
		t.Fatal("another conversation after the same system prompt: want the same system blocks, then a different key")
	}
	long := keys(`{"model":"m","prompt":"`+strings.Repeat("x", 2*TextBlockBytes+10)+`"}`, EndpointCompletions)
	if len(long) != 3 {
		t.Fatalf("a completions prompt of 2 blocks and a bit: %d keys, want 3", len(long))
	}
	req := mustParse(t, EndpointCompletions, `{"model":"m","prompt":[`+strings.TrimSuffix(strings.Repeat("7, ", 40), ", ")+`]}`)
	tk, tokens := PrefixKeys(nil, req)
	want := kvindex.BlockKeys(nil, 0, slices.Repeat([]uint32{7}, 40), TokenBlockSize)
	if !tokens || !slices.Equal(tk, want) {
		t.Fatalf("token prompt: keys %v (tokens %v), want kvindex's %v", tk, tokens, want)
	}
	if k, _ := PrefixKeys(nil, mustParse(t, EndpointEmbeddings, `{"model":"m","input":"hi"}`)); len(k) != 0 {
		t.Fatalf("embeddings have %d keys", len(k))
	}
	r := mustParse(t, EndpointChat, chatBody(t, sys, "hi"))
	buf := make([]uint64, 0, MaxPrefixKeys)
	if a := testing.AllocsPerRun(100, func() { buf, _ = PrefixKeys(buf[:0], r) }); a != 0 {
		t.Fatalf("PrefixKeys allocates %v times", a)
	}
}

// FuzzPrefixKeys: any body the parser accepts gives at most MaxPrefixKeys
// keys, the same ones twice, without a panic.
func FuzzPrefixKeys(f *testing.F) {
	f.Add(uint8(0), `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}]}`)
	f.Add(uint8(1), `{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`)
	f.Add(uint8(1), `{"model":"m","prompt":["a","b"]}`)
	f.Add(uint8(2), `{"model":"m","instructions":"be brief","input":[{"role":"user","content":"hi"}]}`)
	f.Fuzz(func(t *testing.T, ep uint8, body string) {
		e := []Endpoint{EndpointChat, EndpointCompletions, EndpointResponses, EndpointEmbeddings}[int(ep)%4]
		req, err := ParseRequest(e, []byte(body))
		if err != nil {
			return
		}
		a, ta := PrefixKeys(nil, req)
		b, tb := PrefixKeys(nil, req)
		if len(a) > MaxPrefixKeys || !slices.Equal(a, b) || ta != tb {
			t.Fatalf("%d keys (max %d), repeatable %v", len(a), MaxPrefixKeys, slices.Equal(a, b))
		}
	})
}
