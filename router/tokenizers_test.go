package router

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/tokenize"
)

// fixtureModel is the tokenize package's own fixture model directory.
var fixtureModel = filepath.Join("..", "tokenize", "testdata", "model")

func TestTokenizersTokens(t *testing.T) {
	tks, err := LoadTokenizers([]string{"org/chat-model=" + fixtureModel})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := tokenize.New(tokenize.Options{Dir: fixtureModel, MaxTokens: protocol.MaxPrefixTokens})
	if err != nil {
		t.Fatal(err)
	}
	chat := []byte(`{"model":"org/chat-model","messages":[{"role":"system","content":"You are a careful assistant."},{"role":"user","content":"hello there"}]}`)
	comp := []byte(`{"model":"org/chat-model","prompt":"once upon a time"}`)
	emb := []byte(`{"model":"org/chat-model","input":"embed me"}`)
	wantChat, err := ref.AppendChatRequest(nil, chat)
	if err != nil || len(wantChat) == 0 {
		t.Fatalf("reference chat ids: %v %v", wantChat, err)
	}
	wantComp, err := ref.AppendCompletionRequest(nil, comp)
	if err != nil || len(wantComp) == 0 {
		t.Fatalf("reference completion ids: %v %v", wantComp, err)
	}
	for _, tc := range []struct {
		name  string
		ep    protocol.Endpoint
		model string
		body  []byte
		want  []uint32
		ok    bool
	}{
		{"chat", protocol.EndpointChat, "org/chat-model", chat, wantChat, true},
		{"completion", protocol.EndpointCompletions, "org/chat-model", comp, wantComp, true},
		{"embeddings are not tokenized", protocol.EndpointEmbeddings, "org/chat-model", emb, nil, false},
		{"a model without a tokenizer", protocol.EndpointChat, "other", chat, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := protocol.ParseRequest(tc.ep, tc.body)
			if err != nil {
				t.Fatal(err)
			}
			prefix := []uint32{7, 7} // Tokens appends: what dst held stays
			got, ok := tks.Tokens(prefix, tc.model, req)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if !slices.Equal(got[:2], prefix) {
				t.Fatalf("dst's ids changed: %v", got[:2])
			}
			if !slices.Equal(got[2:], tc.want) {
				t.Fatalf("ids = %v, want %v", got[2:], tc.want)
			}
		})
	}
	// The template's fields the router parsed give the ids the tokenizer
	// computes from the whole body; a field it refuses, no ids.
	for _, body := range []string{
		`{"model":"org/chat-model","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false}`,
		`{"model":"org/chat-model","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hel"}],"continue_final_message":true,"add_generation_prompt":null}`,
		`{"model":"org/chat-model","messages":[{"role":"user","content":"hi"}],"add_special_tokens":true,"chat_template_kwargs":{"x":1}}`,
		`{"model":"org/chat-model","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],"add_special_tokens":null}`,
		`{"model":"org/chat-model","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":"yes"}`,
		`{"model":"org/chat-model","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hel"}],"continue_final_message":true,"add_generation_prompt":true}`,
		`{"model":"org/chat-model","prompt":"once upon a time","add_special_tokens":false}`,
		`{"model":"org/chat-model","prompt":["once upon a time"],"add_special_tokens":null}`,
		`{"model":"org/chat-model","prompt":["one","two"]}`,
		`{"model":"org/chat-model","prompt":"once","add_special_tokens":1}`,
	} {
		ep, onBody := protocol.EndpointChat, ref.AppendChatRequest
		if strings.Contains(body, `"prompt"`) {
			ep, onBody = protocol.EndpointCompletions, ref.AppendCompletionRequest
		}
		want, werr := onBody(nil, []byte(body))
		req, err := protocol.ParseRequest(ep, []byte(body))
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		got, ok := tks.Tokens(nil, "org/chat-model", req)
		if ok != (werr == nil && len(want) > 0) || !slices.Equal(got, want) {
			t.Errorf("%s: Tokens = %v, %v; the tokenizer on the body gives %v, %v", body, got, ok, want, werr)
		}
	}
	var zero *Tokenizers
	if _, ok := zero.Tokens(nil, "org/chat-model", &protocol.Request{Endpoint: protocol.EndpointChat, Body: chat}); ok {
		t.Fatal("a nil Tokenizers tokenized")
	}
}

func TestLoadTokenizersErrors(t *testing.T) {
	empty := t.TempDir()
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, tokenize.TokenizerFile), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		specs []string
		is    error
	}{
		{"no directory", []string{"m="}, nil},
		{"a model twice", []string{"m=" + fixtureModel, "m=" + fixtureModel}, nil},
		{"two defaults", []string{fixtureModel, fixtureModel}, nil},
		{"no tokenizer.json", []string{"m=" + empty}, nil},
		{"a bad tokenizer.json", []string{"m=" + bad}, tokenize.ErrFormat},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadTokenizers(tc.specs)
			if err == nil {
				t.Fatalf("LoadTokenizers(%q) loaded", tc.specs)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("error %v is not %v", err, tc.is)
			}
		})
	}
}

// TestTokenizersUseTheParsedRequest: Tokens reads what the router parsed
// (protocol.Request's prompt and template fields), so it allocates less
// than tokenizing the body, which parses it again (copying its messages).
func TestTokenizersUseTheParsedRequest(t *testing.T) {
	tks, body, req := parsedChat(t)
	buf := make([]uint32, 0, protocol.MaxPrefixTokens)
	parsed := testing.AllocsPerRun(50, func() {
		if _, ok := tks.Tokens(buf[:0], "m", req); !ok {
			t.Fatal("no ids")
		}
	})
	again := testing.AllocsPerRun(50, func() {
		if _, err := tks.any.AppendChatRequest(buf[:0], body); err != nil {
			t.Fatal(err)
		}
	})
	if parsed >= again {
		t.Errorf("Tokens allocates %.0f times a request, tokenizing the body %.0f: it parses the body again", parsed, again)
	}
	t.Logf("allocations a request: Tokens %.0f, the body tokenized %.0f", parsed, again)
}

// BenchmarkTokenizersTokens is the router's tokenization of a chat request
// it has parsed (a system prompt and four turns, about 2 KB).
func BenchmarkTokenizersTokens(b *testing.B) {
	tks, body, req := parsedChat(b)
	want, err := tks.any.AppendChatRequest(nil, body)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]uint32, 0, protocol.MaxPrefixTokens)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		var ok bool
		if buf, ok = tks.Tokens(buf[:0], "m", req); !ok || !slices.Equal(buf, want) {
			b.Fatalf("Tokens = %d ids, %v; want the %d the body gives", len(buf), ok, len(want))
		}
	}
}

// parsedChat returns Tokenizers of the fixture model for every model, and
// benchChatBody as the router parses it.
func parsedChat(tb testing.TB) (*Tokenizers, []byte, *protocol.Request) {
	tb.Helper()
	tks, err := LoadTokenizers([]string{fixtureModel})
	if err != nil {
		tb.Fatal(err)
	}
	body := benchChatBody()
	req, err := protocol.ParseRequest(protocol.EndpointChat, body)
	if err != nil {
		tb.Fatal(err)
	}
	return tks, body, req
}

// benchChatBody is a chat request of a system prompt and four turns.
func benchChatBody() []byte {
	var b strings.Builder
	b.WriteString(`{"model":"m","stream":true,"max_tokens":64,"messages":[{"role":"system","content":"You are a careful assistant who answers in short, plain sentences and cites the documents it is given."}`)
	for i := range 4 {
		fmt.Fprintf(&b, `,{"role":"user","content":"Question %d: how do the parts of the release plan fit together, and which of them ship first?"}`, i)
		fmt.Fprintf(&b, `,{"role":"assistant","content":"Answer %d: the parser and the router ship first; the dashboard and the planner follow once the signals are stable."}`, i)
	}
	b.WriteString(`,{"role":"user","content":"And what ships last?"}]}`)
	return []byte(b.String())
}
