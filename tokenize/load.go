package tokenize

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// fileJSON is the part of a tokenizer.json (HF tokenizers' serialization)
// this package reads. Fields it does not know are ignored, as HF ignores
// them; a field it knows with a value it does not implement is an error.
type fileJSON struct {
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Model         modelJSON        `json:"model"`
}

type addedTokenJSON struct {
	ID         *uint32 `json:"id"`
	Content    string  `json:"content"`
	SingleWord bool    `json:"single_word"`
	LStrip     bool    `json:"lstrip"`
	RStrip     bool    `json:"rstrip"`
	Normalized bool    `json:"normalized"`
	Special    bool    `json:"special"`
}

type modelJSON struct {
	Type                    string            `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Vocab                   map[string]uint32 `json:"vocab"`
	Merges                  json.RawMessage   `json:"merges"`
}

// componentJSON is a normalizer, pre-tokenizer or post-processor: a type
// and its fields, some of them nested components.
type componentJSON struct {
	Type           string            `json:"type"`
	Normalizers    []json.RawMessage `json:"normalizers"`
	PreTokenizers  []json.RawMessage `json:"pretokenizers"`
	Processors     []json.RawMessage `json:"processors"`
	Pattern        *patternJSON      `json:"pattern"`
	Behavior       string            `json:"behavior"`
	Invert         bool              `json:"invert"`
	AddPrefixSpace bool              `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
	Single         []templateItem    `json:"single"`
	SpecialTokens  map[string]struct {
		IDs []uint32 `json:"ids"`
	} `json:"special_tokens"`
}

type patternJSON struct {
	Regex  *string `json:"Regex"`
	String *string `json:"String"`
}

type templateItem struct {
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
}

// preStep is one step of the pre-tokenizer pipeline.
type preStep struct {
	// split is set for a pattern split (Split, or ByteLevel's use_regex).
	split    bool
	rule     splitRule
	addSpace bool // ByteLevel's add_prefix_space
	// byteLevel marks a ByteLevel step (the byte mapping itself is the
	// model's: bpe.byteID).
	byteLevel bool
}

// model is everything a loaded tokenizer.json says.
type model struct {
	bpe       *bpe
	normalize []norm.Form
	steps     []preStep
	// rawTokens are the added tokens matched in the text as it is;
	// normTokens those matched after normalization (normalized: true).
	rawTokens, normTokens *matcher
	// prefix and suffix are the post-processor's ids around a sequence
	// (TemplateProcessing's single), added when special tokens are.
	prefix, suffix []uint32
	// vocabSize is one more than the largest id.
	vocabSize uint32
	// specials maps each added token's content to its id.
	specials map[string]uint32
	// cache is the segment cache, nil when off.
	cache *segmentCache
}

// maxVocab bounds ids, so that no id reaches bpe's dead marker and a
// vocabulary's size is that of a real model's at most.
const maxVocab = 1 << 24

// parseModel reads a tokenizer.json. name is the file's path, for errors.
func parseModel(name string, data []byte) (*model, error) {
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrFormat, name, err)
	}
	m := &model{specials: map[string]uint32{}}
	bad := func(field string, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s: %s", ErrFormat, name, field, fmt.Sprintf(format, args...))
	}
	unsupported := func(field string, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s: %s", ErrUnsupported, name, field, fmt.Sprintf(format, args...))
	}

	// The model.
	mj := f.Model
	switch {
	case mj.Type != "" && mj.Type != "BPE":
		return nil, unsupported("model.type", "%q (only BPE)", mj.Type)
	case len(mj.Vocab) == 0:
		return nil, bad("model.vocab", "missing or empty")
	case mj.Dropout != nil && *mj.Dropout != 0:
		return nil, unsupported("model.dropout", "%v (BPE dropout is random)", *mj.Dropout)
	case mj.ContinuingSubwordPrefix != nil && *mj.ContinuingSubwordPrefix != "":
		return nil, unsupported("model.continuing_subword_prefix", "%q", *mj.ContinuingSubwordPrefix)
	case mj.EndOfWordSuffix != nil && *mj.EndOfWordSuffix != "":
		return nil, unsupported("model.end_of_word_suffix", "%q", *mj.EndOfWordSuffix)
	case mj.ByteFallback:
		return nil, unsupported("model.byte_fallback", "true (a SentencePiece-style BPE, not byte-level)")
	}
	for tok, id := range mj.Vocab {
		if id >= maxVocab {
			return nil, bad("model.vocab", "id %d of %q is not below %d", id, tok, maxVocab)
		}
		if id >= m.vocabSize {
			m.vocabSize = id + 1
		}
	}
	b := &bpe{}
	runes := byteRunes()
	unbyte := make(map[rune]byte, 256)
	for i, r := range runes {
		unbyte[r] = byte(i)
		id, ok := mj.Vocab[string(r)]
		if !ok {
			return nil, bad("model.vocab", "no token for byte 0x%02x (%q): not a byte-level vocabulary", i, string(r))
		}
		b.byteID[i] = id
	}
	merges, err := parseMerges(mj.Merges, bad)
	if err != nil {
		return nil, err
	}
	b.merges = make(map[uint64]merge, len(merges))
	for i, mg := range merges {
		l, r := mg[0], mg[1]
		lid, ok1 := mj.Vocab[l]
		rid, ok2 := mj.Vocab[r]
		id, ok3 := mj.Vocab[l+r]
		if !ok1 || !ok2 || !ok3 {
			return nil, bad(fmt.Sprintf("model.merges[%d]", i), "%q %q: a part or the merged token is not in the vocabulary", l, r)
		}
		k := pairKey(lid, rid)
		if _, dup := b.merges[k]; !dup {
			b.merges[k] = merge{rank: uint32(i), id: id}
		}
	}
	if mj.IgnoreMerges {
		b.words = make(map[string]uint32, len(mj.Vocab))
		for tok, id := range mj.Vocab {
			raw, ok := decodeByteLevel(tok, unbyte)
			if !ok {
				return nil, bad("model.vocab", "token %q (id %d) has a character that stands for no byte", tok, id)
			}
			b.words[raw] = id
		}
	}
	m.bpe = b

	// Added tokens.
	var raws, norms []addedToken
	for i, at := range f.AddedTokens {
		field := fmt.Sprintf("added_tokens[%d]", i)
		switch {
		case at.ID == nil:
			return nil, bad(field+".id", "missing")
		case *at.ID >= maxVocab:
			return nil, bad(field+".id", "%d is not below %d", *at.ID, maxVocab)
		case at.Content == "":
			return nil, bad(field+".content", "empty")
		case !utf8.ValidString(at.Content):
			return nil, bad(field+".content", "not UTF-8")
		}
		if *at.ID >= m.vocabSize {
			m.vocabSize = *at.ID + 1
		}
		t := addedToken{content: at.Content, id: *at.ID, lstrip: at.LStrip, rstrip: at.RStrip, singleWord: at.SingleWord}
		m.specials[at.Content] = *at.ID
		if at.Normalized {
			norms = append(norms, t)
		} else {
			raws = append(raws, t)
		}
	}
	m.rawTokens, m.normTokens = newMatcher(raws), newMatcher(norms)

	// Normalizer, pre-tokenizer, post-processor.
	if m.normalize, err = parseNormalizer(f.Normalizer, "normalizer", unsupported, bad); err != nil {
		return nil, err
	}
	if m.steps, err = parsePreTokenizer(f.PreTokenizer, "pre_tokenizer", unsupported, bad); err != nil {
		return nil, err
	}
	byteLevel := false
	for _, s := range m.steps {
		byteLevel = byteLevel || s.byteLevel
	}
	if !byteLevel {
		return nil, unsupported("pre_tokenizer", "no ByteLevel step: only byte-level BPE is implemented")
	}
	if m.prefix, m.suffix, err = parsePostProcessor(f.PostProcessor, "post_processor", unsupported, bad); err != nil {
		return nil, err
	}
	return m, nil
}

// errorf builds an error naming a field of the file.
type errorf func(field string, format string, args ...any) error

// isNull reports whether a component is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// parseComponent reads a component; ok is false when it is absent or null.
func parseComponent(raw json.RawMessage, field string, bad errorf) (c componentJSON, ok bool, err error) {
	if isNull(raw) {
		return c, false, nil
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return c, false, bad(field, "%v", err)
	}
	return c, true, nil
}

// parseSequence parses each member of a Sequence component with parse and
// chains what they make.
func parseSequence[T any](items []json.RawMessage, field string, unsupported, bad errorf,
	parse func(json.RawMessage, string, errorf, errorf) ([]T, error)) ([]T, error) {
	var out []T
	for i, raw := range items {
		v, err := parse(raw, fmt.Sprintf("%s[%d]", field, i), unsupported, bad)
		if err != nil {
			return nil, err
		}
		out = append(out, v...)
	}
	return out, nil
}

func parseNormalizer(raw json.RawMessage, field string, unsupported, bad errorf) ([]norm.Form, error) {
	c, ok, err := parseComponent(raw, field, bad)
	if err != nil || !ok {
		return nil, err
	}
	switch c.Type {
	case "NFC":
		return []norm.Form{norm.NFC}, nil
	case "NFD":
		return []norm.Form{norm.NFD}, nil
	case "NFKC":
		return []norm.Form{norm.NFKC}, nil
	case "NFKD":
		return []norm.Form{norm.NFKD}, nil
	case "Sequence":
		return parseSequence(c.Normalizers, field+".normalizers", unsupported, bad, parseNormalizer)
	}
	return nil, unsupported(field+".type", "%q (NFC, NFD, NFKC, NFKD and Sequence are implemented)", c.Type)
}

func parsePreTokenizer(raw json.RawMessage, field string, unsupported, bad errorf) ([]preStep, error) {
	c, ok, err := parseComponent(raw, field, bad)
	if err != nil || !ok {
		return nil, err
	}
	switch c.Type {
	case "Sequence":
		return parseSequence(c.PreTokenizers, field+".pretokenizers", unsupported, bad, parsePreTokenizer)
	case "Split":
		switch {
		case c.Pattern == nil || c.Pattern.Regex == nil:
			return nil, unsupported(field+".pattern", "only a Regex pattern is implemented")
		case c.Behavior != "Isolated":
			return nil, unsupported(field+".behavior", "%q (only Isolated)", c.Behavior)
		case c.Invert:
			return nil, unsupported(field+".invert", "true")
		}
		rule, ok := ruleFor(*c.Pattern.Regex)
		if !ok {
			return nil, unsupported(field+".pattern.Regex", "%q is not one of the Llama-3, Qwen2 and GPT-2 patterns", *c.Pattern.Regex)
		}
		return []preStep{{split: true, rule: rule}}, nil
	case "ByteLevel":
		useRegex := c.UseRegex == nil || *c.UseRegex // HF's default is true
		s := preStep{addSpace: c.AddPrefixSpace, byteLevel: true}
		if useRegex {
			s.split, s.rule = true, splitRule{gpt2: true}
		}
		return []preStep{s}, nil
	}
	return nil, unsupported(field+".type", "%q (Sequence, Split and ByteLevel are implemented)", c.Type)
}

func parsePostProcessor(raw json.RawMessage, field string, unsupported, bad errorf) (prefix, suffix []uint32, err error) {
	c, ok, err := parseComponent(raw, field, bad)
	if err != nil || !ok {
		return nil, nil, err
	}
	switch c.Type {
	case "ByteLevel":
		return nil, nil, nil // offsets only
	case "Sequence":
		for i, p := range c.Processors {
			pre, suf, err := parsePostProcessor(p, fmt.Sprintf("%s.processors[%d]", field, i), unsupported, bad)
			if err != nil {
				return nil, nil, err
			}
			// Each processor wraps what the ones before it made.
			prefix = append(append([]uint32(nil), pre...), prefix...)
			suffix = append(suffix, suf...)
		}
		return prefix, suffix, nil
	case "TemplateProcessing":
		seen := false
		for i, it := range c.Single {
			f := fmt.Sprintf("%s.single[%d]", field, i)
			switch {
			case it.Sequence != nil:
				if it.Sequence.ID != "A" || seen {
					return nil, nil, unsupported(f, "sequence %q: a single sequence is A, once", it.Sequence.ID)
				}
				seen = true
			case it.SpecialToken != nil:
				st, ok := c.SpecialTokens[it.SpecialToken.ID]
				if !ok {
					return nil, nil, bad(f, "special token %q is not in special_tokens", it.SpecialToken.ID)
				}
				if seen {
					suffix = append(suffix, st.IDs...)
				} else {
					prefix = append(prefix, st.IDs...)
				}
			default:
				return nil, nil, bad(f, "neither SpecialToken nor Sequence")
			}
		}
		if !seen {
			return nil, nil, bad(field+".single", "no Sequence A")
		}
		return prefix, suffix, nil
	}
	return nil, nil, unsupported(field+".type", "%q (ByteLevel, TemplateProcessing and Sequence are implemented)", c.Type)
}

// parseMerges reads the merges: "left right" strings (older files) or
// ["left", "right"] pairs (newer ones).
func parseMerges(raw json.RawMessage, bad errorf) ([][2]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var strs []string
	if err := json.Unmarshal(raw, &strs); err == nil {
		out := make([][2]string, len(strs))
		for i, s := range strs {
			l, r, ok := strings.Cut(s, " ")
			if !ok || l == "" || r == "" || strings.Contains(r, " ") {
				return nil, bad(fmt.Sprintf("model.merges[%d]", i), "%q is not two tokens separated by one space", s)
			}
			out[i] = [2]string{l, r}
		}
		return out, nil
	}
	var pairs [][]string
	if err := json.Unmarshal(raw, &pairs); err != nil {
		return nil, bad("model.merges", "neither a list of \"left right\" strings nor of [left, right] pairs: %v", err)
	}
	out := make([][2]string, len(pairs))
	for i, p := range pairs {
		if len(p) != 2 || p[0] == "" || p[1] == "" {
			return nil, bad(fmt.Sprintf("model.merges[%d]", i), "%d tokens, want two non-empty ones", len(p))
		}
		out[i] = [2]string{p[0], p[1]}
	}
	return out, nil
}

// decodeByteLevel turns a byte-level token into the bytes it stands for.
func decodeByteLevel(tok string, unbyte map[rune]byte) (string, bool) {
	var sb strings.Builder
	for _, r := range tok {
		c, ok := unbyte[r]
		if !ok {
			return "", false
		}
		sb.WriteByte(c)
	}
	return sb.String(), true
}

// truncate shortens raw JSON for an error message.
func truncate(raw []byte) string {
	if len(raw) > 64 {
		return string(raw[:64]) + "..."
	}
	return string(raw)
}

// addedToken is one of tokenizer.json's added_tokens.
type addedToken struct {
	content        string
	id             uint32
	lstrip, rstrip bool
	singleWord     bool
}

// matcher finds added tokens in a text: at each position the longest token
// that starts there, the leftmost match first, as HF's leftmost-longest
// Aho-Corasick does.
type matcher struct {
	// byFirst lists, for each first byte, the tokens that start with it,
	// longest first.
	byFirst [256][]addedToken
	// first marks the bytes some token starts with, so that the scan
	// skips the others with one load each.
	first [256]bool
	any   bool
}

func newMatcher(tokens []addedToken) *matcher {
	m := &matcher{}
	for _, t := range tokens {
		c := t.content[0]
		m.byFirst[c] = append(m.byFirst[c], t)
		m.first[c] = true
		m.any = true
	}
	for i := range m.byFirst {
		sort.SliceStable(m.byFirst[i], func(a, b int) bool {
			return len(m.byFirst[i][a].content) > len(m.byFirst[i][b].content)
		})
	}
	return m
}

// segment is a piece of text between added tokens, or an added token.
type segment struct {
	text    string
	id      uint32
	isToken bool
}

// split appends to dst the segments of text: plain text and the added tokens
// found in it, with the white space an lstrip or rstrip token absorbs
// dropped from its neighbours.
func (m *matcher) split(dst []segment, text string) []segment {
	if !m.any {
		return append(dst, segment{text: text})
	}
	start := 0 // of the pending plain text
	for i := 0; i < len(text); {
		if !m.first[text[i]] {
			i++
			continue
		}
		t, ok := m.matchAt(text, i)
		if !ok {
			i++
			continue
		}
		end := i + len(t.content)
		plainEnd := i
		if t.lstrip {
			for plainEnd > start {
				r, w := utf8.DecodeLastRuneInString(text[start:plainEnd])
				if !isSpace(r) {
					break
				}
				plainEnd -= w
			}
		}
		if t.rstrip {
			end = run(text, end, isSpace)
		}
		if plainEnd > start {
			dst = append(dst, segment{text: text[start:plainEnd]})
		}
		dst = append(dst, segment{id: t.id, isToken: true})
		i, start = end, end
	}
	if start < len(text) {
		dst = append(dst, segment{text: text[start:]})
	}
	return dst
}

// matchAt returns the longest token that matches at i.
func (m *matcher) matchAt(text string, i int) (addedToken, bool) {
	for _, t := range m.byFirst[text[i]] {
		if !strings.HasPrefix(text[i:], t.content) {
			continue
		}
		if t.singleWord && (wordBefore(text, i) || wordAfter(text, i+len(t.content))) {
			continue
		}
		return t, true
	}
	return addedToken{}, false
}

// isWordRune is what a single_word token may not touch.
func isWordRune(r rune) bool { return isLetter(r) || isNumber(r) || r == '_' }

func wordBefore(text string, i int) bool {
	if i == 0 {
		return false
	}
	r, _ := utf8.DecodeLastRuneInString(text[:i])
	return isWordRune(r)
}

func wordAfter(text string, i int) bool {
	if i >= len(text) {
		return false
	}
	r, _ := utf8.DecodeRuneInString(text[i:])
	return isWordRune(r)
}
