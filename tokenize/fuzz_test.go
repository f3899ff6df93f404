package tokenize

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// FuzzLoad feeds tokenizer.json contents to the loader (an operator's file,
// so any bytes): it returns a model or an ErrFormat/ErrUnsupported error,
// never panics, and a model it returns encodes.
func FuzzLoad(f *testing.F) {
	data, err := os.ReadFile(filepath.Join(fixtureDir, TokenizerFile))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte(strings.Replace(string(data), `"ignore_merges": true`, `"ignore_merges": false`, 1)))
	f.Add([]byte(`{"model":{"vocab":{"a":0},"merges":[]}}`))
	f.Add([]byte(`{"pre_tokenizer":{"type":"ByteLevel"},"model":{"type":"BPE","vocab":{},"merges":[["a","b"]]}}`))
	f.Add([]byte(`{"normalizer":{"type":"Sequence","normalizers":[{"type":"NFC"},{"type":"NFKD"}]},"post_processor":{"type":"TemplateProcessing","single":[{"Sequence":{"id":"A"}},{"SpecialToken":{"id":"x"}}],"special_tokens":{"x":{"ids":[7]}}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := parseModel("fuzz/tokenizer.json", data)
		if err != nil {
			if !errors.Is(err, ErrFormat) && !errors.Is(err, ErrUnsupported) {
				t.Fatalf("error %v is neither ErrFormat nor ErrUnsupported", err)
			}
			if !strings.Contains(err.Error(), "fuzz/tokenizer.json") {
				t.Fatalf("error %v does not name the file", err)
			}
			return
		}
		ids := m.encode(nil, "Hello <|eot_id|> world, 12345 \n\n  é🙂", -1)
		for _, id := range ids {
			if id >= m.vocabSize {
				t.Fatalf("id %d is not below the vocabulary size %d", id, m.vocabSize)
			}
		}
	})
}

// FuzzLoadConfig feeds tokenizer_config.json contents to the loader; the
// template is compiled, not rendered (rendering is the operator's
// template's own cost: see docs/kv-events.md).
func FuzzLoadConfig(f *testing.F) {
	data, err := os.ReadFile(filepath.Join(fixtureDir, TokenizerConfigFile))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte(`{"chat_template":[{"name":"default","template":"{{ messages }}"}],"bos_token":{"content":"<s>"}}`))
	f.Add([]byte(`{"chat_template":"{% for m in messages %}{{ m.content }}{% endfor %}","eos_token":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := parseConfig("fuzz/tokenizer_config.json", data)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v is not ErrFormat", err)
			}
			return
		}
		if _, err := compileChat("fuzz/tokenizer_config.json: chat_template", cfg.template, cfg.specials); err != nil && !errors.Is(err, ErrFormat) {
			t.Fatalf("error %v is not ErrFormat", err)
		}
	})
}

// FuzzEncode compares the tokenizer with the reference encoder on any text.
func FuzzEncode(f *testing.F) {
	tok := loadFixture(f)
	ref := loadRef(f, fixtureDir)
	for _, c := range encodeCases {
		f.Add(c)
	}
	f.Fuzz(func(t *testing.T, text string) {
		if len(text) > 4096 {
			return // the reference is quadratic
		}
		got, err := tok.AppendEncode(nil, text, true)
		if err != nil {
			t.Fatal(err)
		}
		if want := ref.encode(text, true); !slices.Equal(toInts(got), want) {
			t.Fatalf("%q:\n got %v\nwant %v", text, got, want)
		}
	})
}

// FuzzEncodeChat feeds any messages to the chat path (a client's request):
// token ids or an ErrInput error, never a panic.
func FuzzEncodeChat(f *testing.F) {
	tok := loadFixture(f)
	f.Add([]byte(`[{"role":"system","content":"You are terse."},{"role":"user","content":"Hi!"}]`))
	f.Add([]byte(`[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]`))
	f.Add([]byte(`[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"{\"x\":1}"}}]}]`))
	f.Add([]byte(`[{"role":"tool","content":"x"}]`))
	f.Add([]byte(`{"messages":[]}`))
	f.Fuzz(func(t *testing.T, messages []byte) {
		if _, err := tok.EncodeChat(messages); err != nil && !errors.Is(err, ErrInput) {
			t.Fatalf("error %v is not ErrInput", err)
		}
		if _, err := tok.EncodeChatRequest(messages); err != nil && !errors.Is(err, ErrInput) {
			t.Fatalf("request: error %v is not ErrInput", err)
		}
	})
}
