package router

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
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
