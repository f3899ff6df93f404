package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func loadFixture(t testing.TB) *Tokenizer {
	t.Helper()
	tok, err := New(Options{Dir: fixtureDir})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func toInts(ids []uint32) []int {
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = int(id)
	}
	return out
}

// encodeCases cover each alternative of the Llama-3 pattern, added tokens
// and their stripping, and bytes outside the trained merges.
var encodeCases = []string{
	"",
	"Hello there!",
	"hello world",
	"You are a helpful assistant.",
	"I'm fine; they've gone, we'll see, I'D SAY it's 'quoted' 'Sup",
	"ſ's and 'ſ", // (?i) folds ſ to s
	"Numbers: 1, 22, 333, 4444, 55555, 1234567",
	"a  b   c    d\t\te",
	"trailing spaces   ",
	"   leading spaces",
	"line\nbreaks\r\n\r\nand  \n  indents\n\n\n",
	"tabs\tand\u00a0nbsp\u3000ideographic space",
	"func main() { fmt.Println(\"hello, world\") } // prints",
	"if err != nil {\n\treturn nil, err\n}\n",
	"Café, naïve — déjà vu. 東京は大きい都市です。 Привет, мир! 🙂🚀",
	"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
	"<|eot_id|><|eot_id|>x<|end_of_text|>",
	"broken <|eot_id tag and <| bars |>",
	"fill the   <mask> here",
	"before [SEP]   after",
	"\xff\xfeinvalid utf-8 \xc3",
	"...!!!???,,,;;;",
	" ?! .\n",
	"x²³ ½ Ⅻ ٣٤٥ numbers of other kinds",
	"ǅemo ǈ titlecase and ʰ modifier letters",
	strings.Repeat("a", 300),
	strings.Repeat("ab ", 100),
}

func TestEncodeMatchesReference(t *testing.T) {
	tok := loadFixture(t)
	ref := loadRef(t, fixtureDir)
	for _, text := range encodeCases {
		for _, special := range []bool{false, true} {
			got, err := tok.AppendEncode(nil, text, special)
			if err != nil {
				t.Fatalf("%q: %v", text, err)
			}
			if want := ref.encode(text, special); !slices.Equal(toInts(got), want) {
				t.Errorf("%q (special %v):\n got %v\nwant %v", text, special, got, want)
			}
		}
	}
}

// TestEncodeRandom compares random texts over an alphabet of the classes
// the pattern tells apart.
func TestEncodeRandom(t *testing.T) {
	tok := loadFixture(t)
	ref := loadRef(t, fixtureDir)
	alphabet := []string{"a", "e", "t", "h", "T", " ", " ", "  ", "\n", "\r", "\t", "'", "s", "re", "1", "23", ".", ",", "!", "é", "東", "🙂", "\u00a0", "<|eot_id|>", "<mask>", "[SEP]", "ll", "the", " the", "\xff"}
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 0; n < 3000; n++ {
		var sb strings.Builder
		for k := rng.IntN(30); k >= 0; k-- {
			sb.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		text := sb.String()
		got, _ := tok.AppendEncode(nil, text, false)
		if want := ref.encode(text, false); !slices.Equal(toInts(got), want) {
			t.Fatalf("%q:\n got %v\nwant %v", text, got, want)
		}
	}
}

// TestEncodeKnownAnswers are derived by hand from the fixture: the bytes'
// ids are their byte values (a printable ASCII character stands for
// itself), and the added tokens count from 1000.
func TestEncodeKnownAnswers(t *testing.T) {
	tok := loadFixture(t)
	vocab := loadRef(t, fixtureDir).vocab
	id := func(s string) uint32 {
		v, ok := vocab[s]
		if !ok {
			t.Fatalf("%q not in the fixture's vocabulary", s)
		}
		return uint32(v)
	}
	got, _ := tok.Encode("<|eot_id|>")
	if !slices.Equal(got, []uint32{1000, 1004}) {
		t.Errorf("<|eot_id|>: %v, want [1000 1004]", got)
	}
	// "~" (0x7e) is printable: its token is byte 0x7e's, id 126.
	if got, _ := tok.AppendEncode(nil, "~", false); !slices.Equal(got, []uint32{126}) {
		t.Errorf("~: %v, want [126]", got)
	}
	// A space stands for U+0120 ("Ġ"), whose id is byte 0x20's: 32.
	if got, _ := tok.AppendEncode(nil, "\x00", false); !slices.Equal(got, []uint32{0}) {
		t.Errorf("NUL: %v, want [0]", got)
	}
	// " the" is a word of the corpus: one token, by ignore_merges if not
	// by the merges.
	if got, _ := tok.AppendEncode(nil, " the", false); !slices.Equal(got, []uint32{id("Ġthe")}) {
		t.Errorf("' the': %v, want [%d]", got, id("Ġthe"))
	}
	// Four digits are two words (at most three digits a word).
	if got, _ := tok.AppendEncode(nil, "4444", false); len(got) < 2 {
		t.Errorf("4444: %v, want at least two tokens", got)
	}
	// The lstrip token takes the spaces before it, the rstrip one those
	// after it.
	a, _ := tok.AppendEncode(nil, "x   <mask>", false)
	b, _ := tok.AppendEncode(nil, "x<mask>", false)
	if !slices.Equal(a, b) {
		t.Errorf("lstrip: %v and %v differ", a, b)
	}
	a, _ = tok.AppendEncode(nil, "[SEP]   x", false)
	b, _ = tok.AppendEncode(nil, "[SEP]x", false)
	if !slices.Equal(a, b) {
		t.Errorf("rstrip: %v and %v differ", a, b)
	}
}

func TestChatTemplate(t *testing.T) {
	tok := loadFixture(t)
	cases := []struct {
		name, messages, want string
	}{
		{
			"system and user",
			`[{"role":"system","content":"You are terse."},{"role":"user","content":"Hi!"}]`,
			"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>" +
				"<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>" +
				"<|start_header_id|>assistant<|end_header_id|>\n\n",
		},
		{
			"content parts joined with newlines, trimmed",
			`[{"role":"user","content":[{"type":"text","text":"  one"},{"type":"text","text":"two  "}]},{"role":"assistant","content":"ok"},{"role":"user","content":"more"}]`,
			"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\none\ntwo<|eot_id|>" +
				"<|start_header_id|>assistant<|end_header_id|>\n\nok<|eot_id|>" +
				"<|start_header_id|>user<|end_header_id|>\n\nmore<|eot_id|>" +
				"<|start_header_id|>assistant<|end_header_id|>\n\n",
		},
	}
	for _, c := range cases {
		got, err := tok.RenderChat([]byte(c.messages))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.want)
		}
		ids, err := tok.EncodeChat([]byte(c.messages))
		if err != nil {
			t.Fatal(err)
		}
		// Chat adds no special tokens: the template's BOS is the only one.
		want := toInts(mustEncode(t, tok, c.want, false))
		if !slices.Equal(toInts(ids), want) || ids[0] != 1000 || ids[1] == 1000 {
			t.Errorf("%s: ids %v, want %v", c.name, ids, want)
		}
	}

	// The whole body: template kwargs, add_generation_prompt false,
	// continue_final_message, add_special_tokens.
	body := `{"model":"m","messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hel"}],` +
		`"add_generation_prompt":false,"continue_final_message":true,"chat_template_kwargs":{"default_system":"Be kind."}}`
	ids, err := tok.EncodeChatRequest([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	wantText := "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe kind.<|eot_id|>" +
		"<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHel"
	if want := mustEncode(t, tok, wantText, false); !slices.Equal(ids, want) {
		t.Errorf("chat request: %v, want %v", ids, want)
	}

	// Errors name what is wrong.
	for _, bad := range []struct{ messages, want string }{
		{`{"role":"user"}`, "not a non-empty array"},
		{`[]`, "not a non-empty array"},
		{`[{"content":"x"}]`, "messages[0].role"},
		{`[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]`, "messages[0].content[0]: only text parts"},
		{`[{"role":"tool","content":"x"}]`, "tool messages are not supported"},
		{`[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"{bad"}}]}]`, "tool_calls[0].function.arguments"},
		{`[1,`, "messages"},
	} {
		_, err := tok.EncodeChat([]byte(bad.messages))
		if !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: error %v, want ErrInput mentioning %q", bad.messages, err, bad.want)
		}
	}
}

func mustEncode(t testing.TB, tok *Tokenizer, text string, special bool) []uint32 {
	t.Helper()
	ids, err := tok.AppendEncode(nil, text, special)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestTemplateWhitespace checks that templates render with transformers'
// Jinja2 settings: trim_blocks, lstrip_blocks, line breaks read as "\n" and
// the last one dropped.
func TestTemplateWhitespace(t *testing.T) {
	cases := []struct{ src, want string }{
		{"{% if true %}\nA\n{% endif %}\nB", "A\nB"},
		{"{% if true %}\n\nA{% endif %}", "\nA"},
		{"  {% if true %}A{% endif %}", "A"},
		{"x\n    {% if true %}A{% endif %}", "x\nA"},
		{"x    {% if true %}A{% endif %}", "x    A"},
		{"{{ 'v' }}\nA", "v\nA"},
		{"{# c #}\nA", "A"},
		{"{% set s = '%}' %}\n{{ s }}", "%}"},
		{"{%- if true -%}\n  A{% endif %}", "A"},
		{"a { b } {", "a { b } {"},
		{"A\r\nB\rC\n", "A\nB\nC"},
		{"A\n\n", "A\n"},
		// Trimming stops at the next tag, as in Jinja2.
		{"a {{ 'x' }}{%- if true %} b{% endif %}", "a x b"},
		{"{% if true -%}{{ 'x' }} c{% endif %}", "x c"},
		{"{{ 'a' }}{# c #}{{ 'b' }}", "ab"},
	}
	for _, c := range cases {
		ct, err := compileChat("case", c.src, nil)
		if err != nil {
			t.Fatalf("%q: %v", c.src, err)
		}
		tok := &Tokenizer{m: loadFixture(t).m, chat: ct, maxInput: DefaultMaxInputBytes}
		got, err := tok.render(ChatRequest{Messages: []byte(`[{"role":"user","content":"x"}]`)})
		if err != nil {
			t.Fatalf("%q: %v", c.src, err)
		}
		if got != c.want {
			t.Errorf("%q: got %q, want %q", c.src, got, c.want)
		}
	}
}

// writeModel writes a model directory whose tokenizer.json is the
// fixture's with edit applied to its text.
func writeModel(t *testing.T, edit func(string) string) string {
	t.Helper()
	dir := t.TempDir()
	data, err := os.ReadFile(filepath.Join(fixtureDir, TokenizerFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, TokenizerFile), []byte(edit(string(data))), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestLoadErrors(t *testing.T) {
	if _, err := New(Options{}); !errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), "Dir") {
		t.Errorf("no Dir: %v", err)
	}
	if _, err := New(Options{Dir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), TokenizerFile) {
		t.Errorf("empty dir: %v", err)
	}
	if _, err := New(Options{Dir: fixtureDir, MaxFileBytes: 100}); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "MaxFileBytes") {
		t.Errorf("file limit: %v", err)
	}
	cases := []struct {
		old, new string
		is       error
		want     string
	}{
		{`"type": "BPE"`, `"type": "WordPiece"`, ErrUnsupported, "model.type"},
		{`"byte_fallback": false`, `"byte_fallback": true`, ErrUnsupported, "model.byte_fallback"},
		{`"merges": [`, `"merges": ["nospace",`, ErrFormat, "model.merges[0]"},
		{`"merges": [`, `"merges": ["Ġ zzzz",`, ErrFormat, "model.merges[0]"},
		{`"Regex": "(?i:`, `"Regex": "(?x:`, ErrUnsupported, "pre_tokenizer.pretokenizers[0].pattern.Regex"},
		{`"behavior": "Isolated"`, `"behavior": "Removed"`, ErrUnsupported, "pre_tokenizer.pretokenizers[0].behavior"},
		{`"normalizer": null`, `"normalizer": {"type": "Lowercase"}`, ErrUnsupported, "normalizer.type"},
		{`"type": "TemplateProcessing"`, `"type": "RobertaProcessing"`, ErrUnsupported, "post_processor.processors[1].type"},
		{`"content": "<|begin_of_text|>"`, `"content": ""`, ErrFormat, "added_tokens[0].content"},
		{`"id": 1000,`, `"id": 99999999,`, ErrFormat, "added_tokens[0].id"},
		{`"ignore_merges": true`, `"ignore_merges": "yes"`, ErrFormat, TokenizerFile},
		{`{`, `[`, ErrFormat, TokenizerFile},
	}
	for _, c := range cases {
		if !strings.Contains(mustRead(t), c.old) {
			t.Fatalf("fixture lacks %q", c.old)
		}
		dir := writeModel(t, func(s string) string { return strings.Replace(s, c.old, c.new, 1) })
		_, err := New(Options{Dir: dir})
		if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), filepath.Join(dir, TokenizerFile)) {
			t.Errorf("%s -> %s: error %v, want %v naming the file and %q", c.old, c.new, err, c.is, c.want)
		}
	}
	// Merges as pairs, as newer files write them, load the same model.
	dir := writeModel(t, func(s string) string {
		var f map[string]any
		if err := json.Unmarshal([]byte(s), &f); err != nil {
			t.Fatal(err)
		}
		model := f["model"].(map[string]any)
		var pairs [][2]string
		for _, m := range model["merges"].([]any) {
			l, r, _ := strings.Cut(m.(string), " ")
			pairs = append(pairs, [2]string{l, r})
		}
		model["merges"] = pairs
		out, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	})
	pairTok, err := New(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := mustEncode(t, pairTok, encodeCases[14], true), mustEncode(t, loadFixture(t), encodeCases[14], true); !slices.Equal(got, want) {
		t.Errorf("pair merges: %v, want %v", got, want)
	}
	if pairTok.HasChatTemplate() {
		t.Error("a directory without tokenizer_config.json has a chat template")
	}
	if _, err := pairTok.EncodeChat([]byte(`[{"role":"user","content":"x"}]`)); !errors.Is(err, ErrNoTemplate) {
		t.Errorf("chat without a template: %v", err)
	}
}

func mustRead(t *testing.T) string {
	data, err := os.ReadFile(filepath.Join(fixtureDir, TokenizerFile))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestPreTokenizeRules compares each pattern's scanner with the regex
// alternatives on random texts.
func TestPreTokenizeRules(t *testing.T) {
	alphabet := []string{"a", "Z", "ſ", " ", "  ", "\n", "\r", "\t", "\u00a0", "\u2003", "'", "s", "S", "re", "VE", "ll", "d", "1", "234", "²", "٣", ".", "!", "-", "é", "東", "🙂", "\xff", "_"}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, pattern := range []string{patternLlama3, patternQwen2, patternGPT2} {
		rule, ok := ruleFor(pattern)
		if !ok {
			t.Fatalf("%q is not known", pattern)
		}
		ref := newRefSplitter(pattern)
		for n := 0; n < 3000; n++ {
			var sb strings.Builder
			for k := rng.IntN(20); k >= 0; k-- {
				sb.WriteString(alphabet[rng.IntN(len(alphabet))])
			}
			text := strings.ToValidUTF8(sb.String(), "\uFFFD")
			var got []string
			for i := 0; i < len(text); {
				e := rule.scanWord(text, i)
				got = append(got, text[i:e])
				i = e
			}
			if want := ref.split(text); !slices.Equal(got, want) {
				t.Fatalf("%q on %q:\n got %q\nwant %q", pattern, text, got, want)
			}
		}
	}
}

func TestEncodeCompletionRequest(t *testing.T) {
	tok := loadFixture(t)
	hello := mustEncode(t, tok, "Hello there!", true)
	cases := []struct {
		body string
		want []uint32
		err  string
	}{
		{`{"model":"m","prompt":"Hello there!"}`, hello, ""},
		{`{"prompt":["Hello there!"]}`, hello, ""},
		{`{"prompt":"Hello there!","add_special_tokens":false}`, hello[1:], ""},
		{`{"prompt":[1,2,3]}`, []uint32{1, 2, 3}, ""},
		{`{"prompt":["a","b"]}`, nil, "2 strings"},
		{`{"prompt":{}}`, nil, "neither"},
		{`{"prompt":[-1]}`, nil, "neither"},
		{`{`, nil, "completions request"},
	}
	for _, c := range cases {
		got, err := tok.EncodeCompletionRequest([]byte(c.body))
		if c.err != "" {
			if !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want ErrInput mentioning %q", c.body, err, c.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: %v %v, want %v", c.body, got, err, c.want)
		}
	}
	if _, err := (&Tokenizer{m: tok.m, maxInput: 8}).EncodeCompletionRequest([]byte(`{"prompt":"long enough"}`)); !errors.Is(err, ErrInput) {
		t.Errorf("over MaxInputBytes: %v", err)
	}
}

// TestCache checks that the segment cache answers what encoding does and
// stays within its bytes.
func TestCache(t *testing.T) {
	cached, err := New(Options{Dir: fixtureDir, CacheBytes: 4 << 10})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := New(Options{Dir: fixtureDir, NoCache: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200; i++ {
		text := fmt.Sprintf("<|start_header_id|>system<|end_header_id|>\n\n%s number %d<|eot_id|>", strings.Repeat("You are a helpful assistant. ", 3), i%50)
		a := mustEncode(t, cached, text, true)
		b := mustEncode(t, plain, text, true)
		if !slices.Equal(a, b) {
			t.Fatalf("%q: cached %v, plain %v", text, a, b)
		}
		if c := cached.m.cache; c.bytes > c.max {
			t.Fatalf("cache holds %d bytes, over its %d", c.bytes, c.max)
		}
	}
	if n := len(cached.m.cache.m); n == 0 || n >= 50 {
		t.Errorf("cache holds %d entries; want some, fewer than the 50 texts (4 KiB)", n)
	}
	if err := (Options{Dir: "x", CacheBytes: 10}).Validate(); !errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), "CacheBytes") {
		t.Errorf("tiny cache: %v", err)
	}
}

// TestChatParts checks a template that loops over content parts (vLLM's
// "openai" content format), given as Options.ChatTemplate.
func TestChatParts(t *testing.T) {
	tok, path := withTemplate(t, "parts.jinja", "{%- for m in messages %}{{ m['role'] }}:{% for p in m['content'] %}[{{ p['text'] }}]{% endfor %}\n{% endfor %}\n")
	got, err := tok.RenderChat([]byte(`[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":"c"},{"role":"user","content":null}]`))
	if err != nil {
		t.Fatal(err)
	}
	// trim_blocks drops the newline after each endfor.
	if want := "user:[a][b]assistant:[c]user:"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if _, err := New(Options{Dir: fixtureDir, ChatTemplate: path + ".missing"}); err == nil || !strings.Contains(err.Error(), "parts.jinja.missing") {
		t.Errorf("missing template file: %v", err)
	}
	// A chat_template.jinja in the model directory wins over the config's.
	dir := t.TempDir()
	for _, name := range []string{TokenizerFile, TokenizerConfigFile} {
		data, err := os.ReadFile(filepath.Join(fixtureDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, ChatTemplateFile), []byte("{{ messages[0]['content'] }}!\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err = New(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := tok.RenderChat([]byte(`[{"role":"user","content":"hi"}]`)); err != nil || got != "hi!" {
		t.Errorf("chat_template.jinja: %q %v, want \"hi!\"", got, err)
	}
}

// TestChatToolsOrder checks that tools and tool-call arguments reach the
// template in the request's key order, printed as Python's json.dumps
// prints them (transformers' tojson).
func TestChatToolsOrder(t *testing.T) {
	tok, _ := withTemplate(t, "tools.jinja", "{{ tools | tojson }}|{% for m in messages %}{% for c in m['tool_calls'] %}{{ c['function']['arguments'] | tojson }}{% endfor %}{% endfor %}")
	body := `{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"zeta\": 1, \"alpha\": \"é\", \"n\": 2.5}"}}]}],` +
		`"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"string"}}}}}]}`
	var req ChatRequest
	if err := json.Unmarshal([]byte(body), &req); err != nil {
		t.Fatal(err)
	}
	got, err := tok.render(req)
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "string"}}}}}]|{"zeta": 1, "alpha": "é", "n": 2.5}`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// withTemplate loads the fixture with the template src, written to a file
// name, as Options.ChatTemplate; it returns the file's path too.
func withTemplate(t *testing.T, name, src string) (*Tokenizer, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := New(Options{Dir: fixtureDir, ChatTemplate: path})
	if err != nil {
		t.Fatal(err)
	}
	return tok, path
}

// TestMaxTokens checks that a limit gives the first ids of the whole
// encoding, whatever the cache holds.
func TestMaxTokens(t *testing.T) {
	all := loadFixture(t)
	for _, limit := range []int{1, 2, 5, 17, 64} {
		tok, err := New(Options{Dir: fixtureDir, MaxTokens: limit})
		if err != nil {
			t.Fatal(err)
		}
		for round := 0; round < 2; round++ { // the second from the cache
			for _, text := range encodeCases {
				want := mustEncode(t, all, text, true)
				want = want[:min(len(want), limit)]
				if got := mustEncode(t, tok, text, true); !slices.Equal(got, want) {
					t.Fatalf("limit %d, %q: %v, want %v", limit, text, got, want)
				}
			}
		}
	}
	if err := (Options{Dir: "x", MaxTokens: -1}).Validate(); !errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), "MaxTokens") {
		t.Errorf("negative MaxTokens: %v", err)
	}
}

// writeModelJSON writes a model directory whose tokenizer.json is the
// fixture's with edit applied to its decoded JSON.
func writeModelJSON(t *testing.T, edit func(f map[string]any)) string {
	t.Helper()
	return writeModel(t, func(s string) string {
		var f map[string]any
		if err := json.Unmarshal([]byte(s), &f); err != nil {
			t.Fatal(err)
		}
		edit(f)
		out, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	})
}

// TestModelVariants loads the fixture with the other pieces a tokenizer.json
// may have: GPT-2's ByteLevel pre-tokenizer with a prefix space, an NFC
// normalizer and an added token matched after normalization.
func TestModelVariants(t *testing.T) {
	gpt2 := writeModelJSON(t, func(f map[string]any) {
		f["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}
	})
	tok, err := New(Options{Dir: gpt2})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := mustEncode(t, tok, "hello there", false), mustEncode(t, tok, " hello there", false); !slices.Equal(a, b) {
		t.Errorf("add_prefix_space: %v and %v differ", a, b)
	}
	ref := loadRef(t, gpt2)
	ref.pattern, ref.prefixSpace = patternGPT2, true
	for _, text := range encodeCases {
		if got, want := mustEncode(t, tok, text, false), ref.encode(text, false); !slices.Equal(toInts(got), want) {
			t.Errorf("GPT-2 ByteLevel, %q:\n got %v\nwant %v", text, got, want)
		}
	}

	// An NFC normalizer, and an added token (rstrip) matched after it.
	normTok := writeModelJSON(t, func(f map[string]any) {
		f["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{map[string]any{"type": "NFC"}}}
		for _, a := range f["added_tokens"].([]any) {
			if at := a.(map[string]any); at["content"] == "[SEP]" {
				at["content"], at["normalized"] = "café", true
			}
		}
	})
	tok, err = New(Options{Dir: normTok})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := mustEncode(t, tok, "Cafe\u0301 naïve", false), mustEncode(t, tok, "Café naïve", false); !slices.Equal(a, b) {
		t.Errorf("NFC: %v and %v differ", a, b)
	}
	// The decomposed spelling normalizes to the token's, then matches it
	// (and its rstrip takes the spaces after it).
	if got := mustEncode(t, tok, "cafe\u0301   x", false); len(got) != 2 || got[0] != 1007 {
		t.Errorf("normalized added token: %v, want [1007 x]", got)
	}
}

// TestConcurrent encodes from several goroutines at once through one
// tokenizer (shared scratch pool and cache): every result is the one a
// lone call gives (run with -race).
func TestConcurrent(t *testing.T) {
	tok, err := New(Options{Dir: fixtureDir, CacheBytes: 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
	msgs := make([][]byte, 16)
	want := make([][]uint32, len(msgs))
	for i := range msgs {
		if msgs[i], err = json.Marshal([]map[string]string{
			{"role": "system", "content": strings.Repeat("You are a helpful assistant. ", 4)},
			{"role": "user", "content": fmt.Sprintf("question %d: %s", i, encodeCases[i%len(encodeCases)])},
		}); err != nil {
			t.Fatal(err)
		}
		if want[i], err = loadFixture(t).EncodeChat(msgs[i]); err != nil {
			t.Fatalf("%s: %v", msgs[i], err)
		}
	}
	errs := make(chan error, 4)
	for g := 0; g < 4; g++ {
		go func() {
			for n := 0; n < 200; n++ {
				i := (n*7 + g) % len(msgs)
				got, err := tok.EncodeChat(msgs[i])
				if err == nil && !slices.Equal(got, want[i]) {
					err = fmt.Errorf("message %d: %v, want %v", i, got, want[i])
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for g := 0; g < 4; g++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
