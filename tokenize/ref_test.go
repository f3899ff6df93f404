package tokenize

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// refTokenizer is an independent, slow encoder of the fixture's kind of
// tokenizer.json, written from the format's description rather than from
// this package's code: the pre-tokenizer's regex alternatives as Go regexps
// tried in order (the one look-ahead, `\s+(?!\S)`, by its definition),
// GPT-2's bpe() over strings (merge every occurrence of the best-ranked
// pair, left to right), bytes_to_unicode by its own table, and added tokens
// found with strings.Index.
type refTokenizer struct {
	vocab   map[string]int
	ranks   map[[2]string]int
	added   []refAdded
	ignore  bool
	prefix  []int
	byteMap map[byte]string
	// pattern is the pre-tokenizer's pattern (Llama-3's unless set);
	// prefixSpace is ByteLevel's add_prefix_space.
	pattern     string
	prefixSpace bool
	// splitters split by each pattern of refAlternatives.
	splitters map[string]*refSplitter
}

type refAdded struct {
	content        string
	id             int
	lstrip, rstrip bool
}

// refWhite is \s as Unicode White_Space (Go's \s is ASCII only).
const refWhite = `\t\n\v\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}`

// refAlternatives are each pattern's alternatives, in order, anchored;
// "" stands for `\s+(?!\S)`.
var refAlternatives = map[string][]string{
	patternLlama3: {
		`^(?i:'s|'t|'re|'ve|'m|'ll|'d)`,
		`^[^\r\n\p{L}\p{N}]?\p{L}+`,
		`^\p{N}{1,3}`,
		`^ ?[^` + refWhite + `\p{L}\p{N}]+[\r\n]*`,
		`^[` + refWhite + `]*[\r\n]+`,
		"",
		`^[` + refWhite + `]+`,
	},
	patternQwen2: {
		`^(?i:'s|'t|'re|'ve|'m|'ll|'d)`,
		`^[^\r\n\p{L}\p{N}]?\p{L}+`,
		`^\p{N}`,
		`^ ?[^` + refWhite + `\p{L}\p{N}]+[\r\n]*`,
		`^[` + refWhite + `]*[\r\n]+`,
		"",
		`^[` + refWhite + `]+`,
	},
	patternGPT2: {
		`^(?:'s|'t|'re|'ve|'m|'ll|'d)`,
		`^ ?\p{L}+`,
		`^ ?\p{N}+`,
		`^ ?[^` + refWhite + `\p{L}\p{N}]+`,
		"",
		`^[` + refWhite + `]+`,
	},
}

func loadRef(t testing.TB, dir string) *refTokenizer {
	data, err := os.ReadFile(filepath.Join(dir, TokenizerFile))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		AddedTokens []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
			LStrip  bool   `json:"lstrip"`
			RStrip  bool   `json:"rstrip"`
		} `json:"added_tokens"`
		Model struct {
			Vocab        map[string]int `json:"vocab"`
			Merges       []string       `json:"merges"`
			IgnoreMerges bool           `json:"ignore_merges"`
		} `json:"model"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	r := &refTokenizer{vocab: f.Model.Vocab, ranks: map[[2]string]int{}, ignore: f.Model.IgnoreMerges, prefix: []int{1000}}
	r.splitters = map[string]*refSplitter{}
	for pattern := range refAlternatives {
		r.splitters[pattern] = newRefSplitter(pattern)
	}
	for i, m := range f.Model.Merges {
		p := strings.Split(m, " ")
		if _, ok := r.ranks[[2]string{p[0], p[1]}]; !ok {
			r.ranks[[2]string{p[0], p[1]}] = i
		}
	}
	for _, a := range f.AddedTokens {
		r.added = append(r.added, refAdded{a.Content, a.ID, a.LStrip, a.RStrip})
	}
	// bytes_to_unicode, from its definition.
	var bs []int
	for b := int('!'); b <= int('~'); b++ {
		bs = append(bs, b)
	}
	for b := 0xA1; b <= 0xAC; b++ {
		bs = append(bs, b)
	}
	for b := 0xAE; b <= 0xFF; b++ {
		bs = append(bs, b)
	}
	cs := append([]int(nil), bs...)
	in := map[int]bool{}
	for _, b := range bs {
		in[b] = true
	}
	n := 0
	for b := 0; b < 256; b++ {
		if !in[b] {
			bs = append(bs, b)
			cs = append(cs, 256+n)
			n++
		}
	}
	r.byteMap = map[byte]string{}
	for i, b := range bs {
		r.byteMap[byte(b)] = string(rune(cs[i]))
	}
	return r
}

// preTokenize splits text as the pre-tokenizer does.
func (r *refTokenizer) preTokenize(text string) []string {
	if r.prefixSpace && text != "" && text[0] != ' ' {
		text = " " + text
	}
	pattern := r.pattern
	if pattern == "" {
		pattern = patternLlama3
	}
	return r.splitters[pattern].split(text)
}

// refSplitter splits text as a pattern does, with the pattern's
// alternatives compiled once: compiling them for every text was most of
// the randomized tests' time (four fifths; half a minute each under -race).
type refSplitter struct {
	res   []*regexp.Regexp // nil for \s+(?!\S), which RE2 cannot say
	white *regexp.Regexp
}

// newRefSplitter compiles pattern's alternatives (refAlternatives).
func newRefSplitter(pattern string) *refSplitter {
	alts := refAlternatives[pattern]
	sp := &refSplitter{res: make([]*regexp.Regexp, len(alts)), white: regexp.MustCompile(`^[` + refWhite + `]+`)}
	for i, a := range alts {
		if a != "" {
			sp.res[i] = regexp.MustCompile(a)
		}
	}
	return sp
}

// split splits text as the splitter's pattern does.
func (sp *refSplitter) split(text string) []string {
	res, white := sp.res, sp.white
	var out []string
	for len(text) > 0 {
		n := 0
		for i, re := range res {
			if re == nil {
				// \s+(?!\S): the longest run of white space not followed
				// by a non-space: all of it at the end, else all but one.
				m := white.FindString(text)
				if m == "" {
					continue
				}
				if len(m) == len(text) {
					n = len(m)
					break
				}
				_, w := utf8.DecodeLastRuneInString(m)
				if len(m)-w > 0 {
					n = len(m) - w
					break
				}
				continue
			}
			if m := res[i].FindString(text); m != "" {
				n = len(m)
				break
			}
		}
		if n == 0 {
			_, n = utf8.DecodeRuneInString(text)
		}
		out = append(out, text[:n])
		text = text[n:]
	}
	return out
}

// bpe is GPT-2's bpe() on one byte-mapped word.
func (r *refTokenizer) bpe(word string) []int {
	var mapped strings.Builder
	for i := 0; i < len(word); i++ {
		mapped.WriteString(r.byteMap[word[i]])
	}
	if id, ok := r.vocab[mapped.String()]; ok && r.ignore {
		return []int{id}
	}
	var syms []string
	for i := 0; i < len(word); i++ {
		syms = append(syms, r.byteMap[word[i]])
	}
	for len(syms) > 1 {
		best, bestRank := [2]string{}, -1
		for i := 0; i+1 < len(syms); i++ {
			if rk, ok := r.ranks[[2]string{syms[i], syms[i+1]}]; ok && (bestRank < 0 || rk < bestRank) {
				best, bestRank = [2]string{syms[i], syms[i+1]}, rk
			}
		}
		if bestRank < 0 {
			break
		}
		var next []string
		for i := 0; i < len(syms); i++ {
			if i+1 < len(syms) && syms[i] == best[0] && syms[i+1] == best[1] {
				next = append(next, best[0]+best[1])
				i++
			} else {
				next = append(next, syms[i])
			}
		}
		syms = next
	}
	ids := make([]int, len(syms))
	for i, s := range syms {
		ids[i] = r.vocab[s]
	}
	return ids
}

// encode is the whole encoder, special tokens parsed, the BOS prefix added
// when addSpecial.
func (r *refTokenizer) encode(text string, addSpecial bool) []int {
	text = strings.ToValidUTF8(text, "\uFFFD")
	var out []int
	if addSpecial {
		out = append(out, r.prefix...)
	}
	for len(text) > 0 {
		// The leftmost added token, the longest at that position.
		at, best := -1, refAdded{}
		for _, a := range r.added {
			k := strings.Index(text, a.content)
			if k >= 0 && (at < 0 || k < at || k == at && len(a.content) > len(best.content)) {
				at, best = k, a
			}
		}
		plain, rest := text, ""
		if at >= 0 {
			plain, rest = text[:at], text[at+len(best.content):]
			if best.lstrip {
				plain = strings.TrimRightFunc(plain, isSpace)
			}
			if best.rstrip {
				rest = strings.TrimLeftFunc(rest, isSpace)
			}
		}
		for _, w := range r.preTokenize(plain) {
			out = append(out, r.bpe(w)...)
		}
		if at < 0 {
			break
		}
		out = append(out, best.id)
		text = rest
	}
	return out
}
