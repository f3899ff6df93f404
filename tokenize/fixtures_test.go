package tokenize

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// The fixtures in testdata/ are made by this generator, not downloaded:
//
//	go test ./tokenize -run TestFixtures -update
//
// rewrites them; without -update the test checks that they are what the
// generator makes. The tokenizer is a byte-level BPE trained here on
// fixtureCorpus (fixtureMerges merges over the Llama-3 pre-tokenizer), with
// Llama-3's special tokens and post-processor, two added tokens that strip
// white space, and a Llama-3-style chat template written for trim_blocks
// and lstrip_blocks.
var update = flag.Bool("update", false, "rewrite testdata/ from the fixture generator")

const fixtureMerges = 320

// fixtureDir is the model directory the tests load.
const fixtureDir = "testdata/model"

// fixtureCorpus is the training text: English prose and chat, code,
// numbers, and a little of other scripts, so that merges span letters,
// spaces, digits and multi-byte characters.
const fixtureCorpus = `You are a helpful assistant. Answer the user's questions briefly and truthfully.
The router places a request on the engine that holds its prefix in the KV cache.
Hello there! How are you today? I'm fine, thanks; and you? We'll see what they've done.
The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs on and on.
func main() { fmt.Println("hello, world") } // prints hello
for i := 0; i < 10; i++ { total += i * 2 }
if err != nil { return nil, err }
Numbers: 1, 22, 333, 4444, 55555, 2026-12-02, 3.14159, 1000000.
The system prompt is shared by many conversations; the engine caches it once.
Café, naïve, résumé — déjà vu. 東京は大きい都市です。 Привет, мир! 🙂🚀
	Tabs	and  double  spaces, trailing spaces   
lines
and more lines

the end.
`

// fixtureTemplate is a Llama-3-style chat template laid out as model
// authors write them: a tag a line, which transformers' trim_blocks and
// lstrip_blocks keep out of the prompt.
const fixtureTemplate = `{{- bos_token }}
{%- for message in messages %}
    {% if message['role'] == 'tool' %}{{ raise_exception('tool messages are not supported') }}{% endif %}
    {%- if loop.first and message['role'] != 'system' and default_system is defined %}
<|start_header_id|>system<|end_header_id|>

{{ default_system }}<|eot_id|>
    {%- endif %}
<|start_header_id|>{{ message['role'] }}<|end_header_id|>

{{ message['content'] | trim }}<|eot_id|>
{%- endfor %}
{%- if add_generation_prompt %}
<|start_header_id|>assistant<|end_header_id|>

{% endif %}
`

// fixtureSpecials are the added tokens, from id 1000.
var fixtureSpecials = []struct {
	content        string
	special        bool
	lstrip, rstrip bool
}{
	{"<|begin_of_text|>", true, false, false},
	{"<|end_of_text|>", true, false, false},
	{"<|start_header_id|>", true, false, false},
	{"<|end_header_id|>", true, false, false},
	{"<|eot_id|>", true, false, false},
	{"<|reserved_special_token_0|>", true, false, false},
	{"<mask>", true, true, false},
	{"[SEP]", false, false, true},
}

// trainFixture trains byte-level BPE merges on the corpus: each round
// merges the most frequent adjacent pair (ties to the smaller pair), as
// HF's BpeTrainer does, and returns the vocabulary (bytes first, in byte
// order, then each merge's token) and the merges.
func trainFixture() (map[string]uint32, [][2]string) {
	return trainBPE(fixtureCorpus, fixtureMerges)
}

// trainBPE trains at most maxMerges merges on corpus.
func trainBPE(corpus string, maxMerges int) (map[string]uint32, [][2]string) {
	runes := byteRunes()
	vocab := map[string]uint32{}
	for b := 0; b < 256; b++ {
		vocab[string(runes[b])] = uint32(b)
	}
	freq := map[string]int{}
	rule := splitRule{maxDigits: 3}
	for i := 0; i < len(corpus); {
		e := rule.scanWord(corpus, i)
		freq[corpus[i:e]]++
		i = e
	}
	type word struct {
		syms []string
		n    int
	}
	var words []word
	keys := make([]string, 0, len(freq))
	for k := range freq {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		var syms []string
		for i := 0; i < len(k); i++ {
			syms = append(syms, string(runes[k[i]]))
		}
		words = append(words, word{syms, freq[k]})
	}
	var merges [][2]string
	for len(merges) < maxMerges {
		counts := map[[2]string]int{}
		for _, w := range words {
			for i := 0; i+1 < len(w.syms); i++ {
				counts[[2]string{w.syms[i], w.syms[i+1]}] += w.n
			}
		}
		var best [2]string
		bestN := 0
		for p, n := range counts {
			if n > bestN || n == bestN && (p[0] < best[0] || p[0] == best[0] && p[1] < best[1]) {
				best, bestN = p, n
			}
		}
		if bestN == 0 {
			break
		}
		merges = append(merges, best)
		joined := best[0] + best[1]
		if _, ok := vocab[joined]; !ok {
			vocab[joined] = uint32(len(vocab))
		}
		for wi := range words {
			s := words[wi].syms
			out := s[:0:0]
			for i := 0; i < len(s); i++ {
				if i+1 < len(s) && s[i] == best[0] && s[i+1] == best[1] {
					out = append(out, joined)
					i++
					continue
				}
				out = append(out, s[i])
			}
			words[wi].syms = out
		}
	}
	return vocab, merges
}

// fixtureFiles renders the fixture model directory's files.
func fixtureFiles(t *testing.T) map[string][]byte {
	vocab, merges := trainFixture()
	var addedTokens []addedTokenJSON
	for i, s := range fixtureSpecials {
		id := uint32(1000 + i)
		addedTokens = append(addedTokens, addedTokenJSON{ID: &id, Content: s.content, LStrip: s.lstrip, RStrip: s.rstrip, Special: s.special})
	}
	mergeStrings := make([]string, len(merges))
	for i, m := range merges {
		mergeStrings[i] = m[0] + " " + m[1]
	}
	tok := map[string]any{
		"version":      "1.0",
		"truncation":   nil,
		"padding":      nil,
		"added_tokens": addedTokens,
		"normalizer":   nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": patternLlama3}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		}},
		"post_processor": map[string]any{"type": "Sequence", "processors": []any{
			map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
			map[string]any{
				"type": "TemplateProcessing",
				"single": []any{
					map[string]any{"SpecialToken": map[string]any{"id": "<|begin_of_text|>", "type_id": 0}},
					map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}},
				},
				"pair": []any{},
				"special_tokens": map[string]any{
					"<|begin_of_text|>": map[string]any{"id": "<|begin_of_text|>", "ids": []uint32{1000}, "tokens": []string{"<|begin_of_text|>"}},
				},
			},
		}},
		"decoder": map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": true,
			"vocab": vocab, "merges": mergeStrings,
		},
	}
	cfg := map[string]any{
		"bos_token":                    "<|begin_of_text|>",
		"eos_token":                    "<|eot_id|>",
		"chat_template":                fixtureTemplate,
		"clean_up_tokenization_spaces": true,
		"model_max_length":             131072,
		"tokenizer_class":              "PreTrainedTokenizerFast",
	}
	enc := func(v any) []byte {
		var buf bytes.Buffer
		e := json.NewEncoder(&buf)
		e.SetEscapeHTML(false)
		e.SetIndent("", " ")
		if err := e.Encode(v); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	return map[string][]byte{TokenizerFile: enc(tok), TokenizerConfigFile: enc(cfg)}
}

func TestFixtures(t *testing.T) {
	files := fixtureFiles(t)
	for name, want := range files {
		path := filepath.Join(fixtureDir, name)
		if *update {
			if err := os.MkdirAll(fixtureDir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test ./tokenize -run TestFixtures -update)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is not what the generator makes (run go test ./tokenize -run TestFixtures -update)", path)
		}
	}
	if _, merges := trainFixture(); len(merges) != fixtureMerges {
		t.Errorf("the corpus gave %d merges, want %d", len(merges), fixtureMerges)
	}
	if !strings.Contains(fixtureCorpus, "🙂") {
		t.Error("the corpus lost its 4-byte characters")
	}
}
