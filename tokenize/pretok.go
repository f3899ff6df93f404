package tokenize

import (
	"unicode"
	"unicode/utf8"
)

// The pre-tokenizer patterns this package implements, exactly as
// tokenizer.json spells them. HF tokenizers runs them with Oniguruma; Go's
// regexp has no look-ahead (`\s+(?!\S)`), and a backtracking engine costs
// microseconds a word, so each is a hand-written scanner (scanWord) that
// takes the pattern's alternatives in order, as the regex does.
const (
	// patternLlama3 is Llama-3's Split pattern (and tiktoken's cl100k).
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patternQwen2 is Qwen2's and Qwen3's: numbers one digit a word.
	patternQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patternGPT2 is what a ByteLevel pre-tokenizer with use_regex runs.
	patternGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

// splitRule is one of the patterns above as scanWord runs it.
type splitRule struct {
	// gpt2 selects the GPT-2 alternatives (case-sensitive contractions, an
	// optional leading space before letters and numbers, no newline
	// alternative); otherwise the Llama-3 family's.
	gpt2 bool
	// maxDigits bounds a run of numbers (3 for Llama-3, 1 for Qwen2, 0 for
	// unbounded).
	maxDigits int
}

// ruleFor returns the rule of a known pattern.
func ruleFor(pattern string) (splitRule, bool) {
	switch pattern {
	case patternLlama3:
		return splitRule{maxDigits: 3}, true
	case patternQwen2:
		return splitRule{maxDigits: 1}, true
	case patternGPT2:
		return splitRule{gpt2: true}, true
	}
	return splitRule{}, false
}

// isSpace is the regex's \s: Unicode White_Space, as Oniguruma matches it.
func isSpace(r rune) bool { return unicode.IsSpace(r) }

// isLetter is \p{L}.
func isLetter(r rune) bool {
	if r < utf8.RuneSelf {
		return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z'
	}
	return unicode.IsLetter(r)
}

// isNumber is \p{N}.
func isNumber(r rune) bool {
	if r < utf8.RuneSelf {
		return '0' <= r && r <= '9'
	}
	return unicode.IsNumber(r)
}

// isOther is [^\s\p{L}\p{N}].
func isOther(r rune) bool { return !isSpace(r) && !isLetter(r) && !isNumber(r) }

// at decodes the rune at i (utf8.RuneError, width 0, at the end).
func at(s string, i int) (rune, int) {
	if i >= len(s) {
		return utf8.RuneError, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// foldsTo reports whether r matches the ASCII lower-case letter c under
// (?i): its case-fold orbit, so that 'S' and 'ſ' match 's' as they do in
// the regex.
func foldsTo(r rune, c rune) bool {
	if r == c {
		return true
	}
	for f := unicode.SimpleFold(c); f != c; f = unicode.SimpleFold(f) {
		if r == f {
			return true
		}
	}
	return false
}

// contraction returns the end of 's, 't, 're, 've, 'm, 'll or 'd at i (an
// apostrophe), or -1.
func (sr splitRule) contraction(s string, i int) int {
	eq := func(r, c rune) bool {
		if sr.gpt2 {
			return r == c
		}
		return foldsTo(r, c)
	}
	j := i + 1
	r1, w1 := at(s, j)
	if w1 == 0 {
		return -1
	}
	switch {
	case eq(r1, 's'), eq(r1, 't'), eq(r1, 'm'), eq(r1, 'd'):
		return j + w1
	}
	r2, w2 := at(s, j+w1)
	if w2 == 0 {
		return -1
	}
	switch {
	case eq(r1, 'r') && eq(r2, 'e'), eq(r1, 'v') && eq(r2, 'e'), eq(r1, 'l') && eq(r2, 'l'):
		return j + w1 + w2
	}
	return -1
}

// run returns the end of the longest run of runes from i that satisfy f.
func run(s string, i int, f func(rune) bool) int {
	for i < len(s) {
		r, w := at(s, i)
		if !f(r) {
			break
		}
		i += w
	}
	return i
}

// scanWord returns the end of the pre-token that starts at i < len(s): the
// first alternative of the rule's pattern that matches at i, as the regex
// takes it. Every rune is a space, a letter, a number or other, and some
// alternative matches each, so the result is always past i.
func (sr splitRule) scanWord(s string, i int) int {
	r0, w0 := at(s, i)
	if r0 == '\'' {
		if e := sr.contraction(s, i); e > 0 {
			return e
		}
	}
	r1, w1 := at(s, i+w0)
	if sr.gpt2 {
		// ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`
		start, r := i, r0
		if r0 == ' ' && w1 > 0 && !isSpace(r1) {
			start, r = i+w0, r1
		}
		switch {
		case isLetter(r):
			return run(s, start, isLetter)
		case isNumber(r):
			return run(s, start, isNumber)
		case isOther(r):
			return run(s, start, isOther)
		}
		return sr.spaces(s, i)
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if isLetter(r0) {
		return run(s, i, isLetter)
	}
	if r0 != '\r' && r0 != '\n' && !isNumber(r0) && w1 > 0 && isLetter(r1) {
		return run(s, i+w0, isLetter)
	}
	// \p{N}{1,maxDigits}
	if isNumber(r0) {
		j := i
		for n := 0; j < len(s) && (sr.maxDigits == 0 || n < sr.maxDigits); n++ {
			r, w := at(s, j)
			if !isNumber(r) {
				break
			}
			j += w
		}
		return j
	}
	// ` ?[^\s\p{L}\p{N}]+[\r\n]*`
	start := i
	if r0 == ' ' {
		start = i + w0
	}
	if r, w := at(s, start); w > 0 && isOther(r) {
		j := run(s, start, isOther)
		return run(s, j, func(r rune) bool { return r == '\r' || r == '\n' })
	}
	// \s*[\r\n]+ : the white space up to its last line break.
	end, lastNL := i, -1
	for end < len(s) {
		r, w := at(s, end)
		if !isSpace(r) {
			break
		}
		end += w
		if r == '\r' || r == '\n' {
			lastNL = end
		}
	}
	if lastNL > 0 {
		return lastNL
	}
	return sr.spaces(s, i)
}

// spaces matches `\s+(?!\S)|\s+` at i, a space: the run, less its last
// rune when a non-space follows and the run is longer than one rune, so
// that the last space joins the next word.
func (sr splitRule) spaces(s string, i int) int {
	end, last, n := i, i, 0
	for end < len(s) {
		r, w := at(s, end)
		if !isSpace(r) {
			break
		}
		last = end
		end += w
		n++
	}
	if end < len(s) && n >= 2 {
		return last
	}
	return end
}
