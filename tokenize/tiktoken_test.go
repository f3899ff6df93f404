package tokenize

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// TestTiktokenRanks checks the tokenizer on a real vocabulary when one is
// at hand: TOKENIZE_TIKTOKEN_RANKS names a tiktoken ranks file of
// cl100k_base (the first 100,256 tokens of Llama-3's vocabulary, under the
// same pattern), which the repository does not ship. The ranks are
// converted to a tokenizer.json as transformers converts tiktoken models
// (each token's merge is the pair tiktoken's rule makes of it with the
// lower ranks), and the encoder must give tiktoken's published ids and
// tiktoken's rule's ids on random texts, with ignore_merges and without.
func TestTiktokenRanks(t *testing.T) {
	path := os.Getenv("TOKENIZE_TIKTOKEN_RANKS")
	if path == "" {
		t.Skip("TOKENIZE_TIKTOKEN_RANKS is not set (a cl100k_base.tiktoken file)")
	}
	ranks := readRanks(t, path)
	for _, ignore := range []bool{true, false} {
		tok, err := New(Options{Dir: tiktokenModel(t, ranks, ignore), NoCache: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []struct {
			text string
			want []uint32
		}{
			{"hello world", []uint32{15339, 1917}},
			{"Hello world", []uint32{9906, 1917}},
			{"hello <|endoftext|>", []uint32{15339, 220, 100257}},
			{"👍", []uint32{9468, 239, 235}},
		} {
			if got := mustEncode(t, tok, k.text, false); !slices.Equal(got, k.want) {
				t.Errorf("ignore_merges %v, %q: %v, want %v", ignore, k.text, got, k.want)
			}
		}
		words := strings.Fields("the of and to in is you that it he was for on are as with his they I at be this have from or one had by word but not what all were we when your can said there use an each which she do how their if will up other about out many then them these so some her would make like him into time has look two more write go see number no way could people my than first water been call who oil its now find long down day did get come made may part Hello World café naïve 東京 Привет 🙂 123 4567 3.14 don't I'm WE'LL {} () [] ; , . ! ? - _ = + * & ^ % $ # @ ~ | / < > ' \"")
		words = append(words, " ", "  ", "\n", "\n\n", "\t", "\r\n", "   ", "\u00a0")
		split := newRefSplitter(patternLlama3)
		rng := rand.New(rand.NewPCG(7, 8))
		for n := 0; n < 5000; n++ {
			var sb strings.Builder
			for k := rng.IntN(40); k >= 0; k-- {
				sb.WriteString(words[rng.IntN(len(words))])
				if rng.IntN(3) == 0 {
					sb.WriteByte(' ')
				}
			}
			text := sb.String()
			var want []uint32
			for _, w := range split.split(text) {
				if r, ok := ranks[w]; ok {
					want = append(want, uint32(r))
					continue
				}
				for _, p := range tiktokenMerge(ranks, w, 1<<30) {
					want = append(want, uint32(ranks[p]))
				}
			}
			if got := mustEncode(t, tok, text, false); !slices.Equal(got, want) {
				t.Fatalf("ignore_merges %v, %q:\n got %v\nwant %v", ignore, text, got, want)
			}
		}
	}
}

func readRanks(t *testing.T, path string) map[string]int {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ranks := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		tok, rank, ok := strings.Cut(sc.Text(), " ")
		b, err1 := base64.StdEncoding.DecodeString(tok)
		r, err2 := strconv.Atoi(rank)
		if !ok || err1 != nil || err2 != nil {
			t.Fatalf("%s: bad line %q", path, sc.Text())
		}
		ranks[string(b)] = r
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return ranks
}

// tiktokenMerge is tiktoken's rule: merge the adjacent pair whose
// concatenation has the lowest rank (below maxRank) until none has one.
func tiktokenMerge(ranks map[string]int, word string, maxRank int) []string {
	parts := make([]string, len(word))
	for i := 0; i < len(word); i++ {
		parts[i] = word[i : i+1]
	}
	for {
		best, at := -1, -1
		for i := 0; i+1 < len(parts); i++ {
			if r, ok := ranks[parts[i]+parts[i+1]]; ok && r < maxRank && (best < 0 || r < best) {
				best, at = r, i
			}
		}
		if at < 0 {
			return parts
		}
		parts = slices.Replace(parts, at, at+2, parts[at]+parts[at+1])
	}
}

// tiktokenModel writes a model directory for the ranks: byte-level vocab
// (id = rank), the merges in rank order, Llama-3's pattern and
// <|endoftext|> at 100257.
func tiktokenModel(t *testing.T, ranks map[string]int, ignoreMerges bool) string {
	runes := byteRunes()
	level := func(s string) string {
		var sb strings.Builder
		for i := 0; i < len(s); i++ {
			sb.WriteRune(runes[s[i]])
		}
		return sb.String()
	}
	vocab := map[string]int{}
	type pair struct {
		rank int
		l, r string
	}
	var pairs []pair
	for tok, r := range ranks {
		vocab[level(tok)] = r
		if len(tok) == 1 {
			continue
		}
		p := tiktokenMerge(ranks, tok, r)
		if len(p) != 2 {
			t.Fatalf("token %q (rank %d) is %d parts under lower ranks", tok, r, len(p))
		}
		pairs = append(pairs, pair{r, level(p[0]), level(p[1])})
	}
	sort.Slice(pairs, func(i, j int) bool { return pairs[i].rank < pairs[j].rank })
	merges := make([]string, len(pairs))
	for i, p := range pairs {
		merges[i] = p.l + " " + p.r
	}
	f := map[string]any{
		"added_tokens": []any{map[string]any{"id": 100257, "content": "<|endoftext|>", "special": true}},
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": patternLlama3}, "behavior": "Isolated"},
			map[string]any{"type": "ByteLevel", "use_regex": false},
		}},
		"model": map[string]any{"type": "BPE", "ignore_merges": ignoreMerges, "vocab": vocab, "merges": merges},
	}
	data, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, TokenizerFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}
