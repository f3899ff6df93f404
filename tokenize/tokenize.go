// Package tokenize turns a request's text into the token ids a vLLM engine
// computes for it, so that a router can key the request's KV blocks as the
// engine caches them (kvindex.BlockKeys over these ids).
//
// It loads a model directory as vLLM does: tokenizer.json (HF tokenizers'
// format; byte-level BPE as Llama-3, Qwen2 and GPT-2-style models use it),
// tokenizer_config.json (the chat template and the special tokens' names)
// and chat_template.jinja when the model ships its template in a file of its
// own. Encode is vLLM's completions path (special tokens added by the
// post-processor); EncodeChat and EncodeChatRequest are its chat path: the
// messages rendered with the chat template (add_generation_prompt true) as
// transformers renders them, then encoded without adding special tokens,
// the template's own special tokens parsed as tokens. Pure Go, no cgo; see
// docs/kv-events.md ("Tokenizing in the router") for the choices and what is
// not implemented.
package tokenize

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrOptions wraps every Options validation error.
	ErrOptions = errors.New("tokenize: invalid options")
	// ErrFormat is a model file that cannot be read as its format says.
	ErrFormat = errors.New("tokenize: bad model file")
	// ErrUnsupported is a model file that asks for something this package
	// does not implement (a WordPiece model, a normalizer, a pattern).
	ErrUnsupported = errors.New("tokenize: unsupported model")
	// ErrInput is a text or request this package cannot tokenize (too
	// long, not the messages of a chat request, a non-text content part).
	ErrInput = errors.New("tokenize: bad input")
	// ErrNoTemplate is a chat request for a model without a chat template.
	ErrNoTemplate = errors.New("tokenize: no chat template")
)

// File names in a model directory.
const (
	TokenizerFile       = "tokenizer.json"
	TokenizerConfigFile = "tokenizer_config.json"
	ChatTemplateFile    = "chat_template.jinja"
)

// Defaults.
const (
	// DefaultMaxInputBytes bounds a text or request body: 4 MiB is about a
	// million tokens, more than any context window a router forwards.
	DefaultMaxInputBytes = 4 << 20
	// DefaultMaxFileBytes bounds a model file: the largest tokenizer.json
	// of a public model is some 35 MB (a 256k vocabulary); 256 MiB leaves
	// room without letting a wrong path fill the memory.
	DefaultMaxFileBytes = 256 << 20
	// DefaultCacheBytes holds some thousands of system prompts and earlier
	// turns: 16 MiB, small beside a router's other per-model state.
	DefaultCacheBytes = 16 << 20
)

// Options configure a Tokenizer.
type Options struct {
	// Dir is the model directory (required): tokenizer.json, and for chat
	// tokenizer_config.json or chat_template.jinja.
	Dir string
	// ChatTemplate, if set, is the path of a Jinja file used instead of the
	// model's template (vLLM's --chat-template).
	ChatTemplate string
	// MaxInputBytes bounds a text and a chat request's body (default
	// DefaultMaxInputBytes).
	MaxInputBytes int
	// MaxFileBytes bounds each model file read (default DefaultMaxFileBytes).
	MaxFileBytes int64
	// CacheBytes bounds the cache of encoded segments (the text between
	// special tokens, such as a chat message), keys and ids counted
	// (default DefaultCacheBytes).
	CacheBytes int
	// NoCache turns the segment cache off.
	NoCache bool
	// MaxTokens, if set, makes every method return at most the first
	// MaxTokens ids of a text or request, and stop encoding there: a
	// router keys only a prompt's first blocks (0: all of them).
	MaxTokens int
}

// WithDefaults returns a copy with every zero field set to its default.
func (o Options) WithDefaults() Options {
	if o.MaxInputBytes == 0 {
		o.MaxInputBytes = DefaultMaxInputBytes
	}
	if o.MaxFileBytes == 0 {
		o.MaxFileBytes = DefaultMaxFileBytes
	}
	if o.CacheBytes == 0 {
		o.CacheBytes = DefaultCacheBytes
	}
	return o
}

// Validate checks o.WithDefaults() and names the first unusable field.
func (o Options) Validate() error {
	o = o.WithDefaults()
	switch {
	case o.Dir == "":
		return fmt.Errorf("%w: Dir is empty, want the model directory holding %s", ErrOptions, TokenizerFile)
	case o.MaxInputBytes < 1 || o.MaxInputBytes > 1<<30:
		return fmt.Errorf("%w: MaxInputBytes is %d, want 1..%d", ErrOptions, o.MaxInputBytes, 1<<30)
	case o.MaxFileBytes < 1 || o.MaxFileBytes > 1<<32:
		return fmt.Errorf("%w: MaxFileBytes is %d, want 1..%d", ErrOptions, o.MaxFileBytes, int64(1)<<32)
	case o.MaxTokens < 0:
		return fmt.Errorf("%w: MaxTokens is %d, want 0 (all) or more", ErrOptions, o.MaxTokens)
	case o.CacheBytes < 1<<10 || o.CacheBytes > 1<<32:
		return fmt.Errorf("%w: CacheBytes is %d, want %d..%d", ErrOptions, o.CacheBytes, 1<<10, int64(1)<<32)
	}
	return nil
}

// Tokenizer encodes texts and chat requests as one model's engine does. It
// is safe for concurrent use.
type Tokenizer struct {
	m         *model
	chat      *chatTemplate // nil without a template
	maxInput  int
	maxTokens int
	// dir is the model directory, for errors.
	dir string
}

// New loads the model directory of opts.
func New(opts Options) (*Tokenizer, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	read := func(path string, optional bool) ([]byte, error) {
		data, err := readFile(path, opts.MaxFileBytes)
		if optional && errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return data, err
	}
	tokPath := filepath.Join(opts.Dir, TokenizerFile)
	tj, err := read(tokPath, false)
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(opts.Dir, TokenizerConfigFile)
	cj, err := read(cfgPath, true)
	if err != nil {
		return nil, err
	}
	tmplPath, optional := filepath.Join(opts.Dir, ChatTemplateFile), true
	if opts.ChatTemplate != "" {
		tmplPath, optional = opts.ChatTemplate, false
	}
	tt, err := read(tmplPath, optional)
	if err != nil {
		return nil, err
	}
	if tt == nil {
		tmplPath = ""
	}
	t, err := build(tokPath, tj, cfgPath, cj, tmplPath, tt, opts.MaxInputBytes)
	if err != nil {
		return nil, err
	}
	if !opts.NoCache {
		t.m.cache = newSegmentCache(opts.CacheBytes)
	}
	t.maxTokens = opts.MaxTokens
	return t, nil
}

// build makes a Tokenizer from the files' contents; a nil config or template
// is a file that is not there.
func build(tokPath string, tj []byte, cfgPath string, cj []byte, tmplPath string, tt []byte, maxInput int) (*Tokenizer, error) {
	m, err := parseModel(tokPath, tj)
	if err != nil {
		return nil, err
	}
	t := &Tokenizer{m: m, maxInput: maxInput, dir: filepath.Dir(tokPath)}
	var cfg tokenizerConfig
	if cj != nil {
		if cfg, err = parseConfig(cfgPath, cj); err != nil {
			return nil, err
		}
	}
	src, srcName := cfg.template, cfgPath+": chat_template"
	if tt != nil {
		if !utf8.Valid(tt) {
			return nil, fmt.Errorf("%w: %s: not UTF-8", ErrFormat, tmplPath)
		}
		src, srcName = string(tt), tmplPath
	}
	if src != "" {
		if t.chat, err = compileChat(srcName, src, cfg.specials); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// readFile reads a whole file of at most max bytes.
func readFile(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tokenize: reading %s: %w", path, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("tokenize: reading %s: %w", path, err)
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes (MaxFileBytes)", ErrFormat, path, max)
	}
	return data, nil
}

// HasChatTemplate reports whether the tokenizer can encode chat requests.
func (t *Tokenizer) HasChatTemplate() bool { return t.chat != nil }

// VocabSize is one more than the largest token id the model knows.
func (t *Tokenizer) VocabSize() int { return int(t.m.vocabSize) }

// Encode returns the token ids of a completions prompt as vLLM computes
// them by default (add_special_tokens: the post-processor's tokens, such
// as Llama-3's <|begin_of_text|>, around the text). Special tokens written
// in the text are parsed as tokens.
func (t *Tokenizer) Encode(prompt string) ([]uint32, error) {
	return t.AppendEncode(nil, prompt, true)
}

// AppendEncode appends the token ids of text to dst, with the
// post-processor's special tokens when addSpecial is set, and returns the
// extended slice: at most Options.MaxTokens ids when that is set, the
// first ones.
func (t *Tokenizer) AppendEncode(dst []uint32, text string, addSpecial bool) ([]uint32, error) {
	if len(text) > t.maxInput {
		return dst, fmt.Errorf("%w: a text of %d bytes is longer than %d (MaxInputBytes)", ErrInput, len(text), t.maxInput)
	}
	stop := -1
	if t.maxTokens > 0 {
		stop = len(dst) + t.maxTokens
	}
	if addSpecial {
		dst = append(dst, t.m.prefix...)
	}
	dst = t.m.encode(dst, text, stop)
	if addSpecial {
		dst = append(dst, t.m.suffix...)
	}
	if stop >= 0 && len(dst) > stop {
		dst = dst[:stop]
	}
	return dst, nil
}

// full reports whether dst reached stop (-1: no limit).
func full(dst []uint32, stop int) bool { return stop >= 0 && len(dst) >= stop }

// encode appends the ids of text, special tokens in it parsed, none added;
// it may stop once dst has stop ids (-1: no limit), a word past it.
func (m *model) encode(dst []uint32, text string, stop int) []uint32 {
	if !utf8.ValidString(text) {
		// As the engine sees it: Python decoded the request's bytes with
		// replacement characters.
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	var buf [16]segment
	for _, seg := range m.rawTokens.split(buf[:0], text) {
		if full(dst, stop) {
			break
		}
		if seg.isToken {
			dst = append(dst, seg.id)
			continue
		}
		if m.cache != nil && len(seg.text) >= cacheMinSegment {
			var hit bool
			if dst, hit = m.cache.get(dst, seg.text); hit {
				continue
			}
			n := len(dst)
			dst = m.encodeSegment(dst, seg.text, stop)
			if !full(dst, stop) { // a segment cut short is not cached
				m.cache.put(seg.text, dst[n:])
			}
			continue
		}
		dst = m.encodeSegment(dst, seg.text, stop)
	}
	return dst
}

// encodeSegment appends the ids of text between added tokens.
func (m *model) encodeSegment(dst []uint32, s string, stop int) []uint32 {
	for _, f := range m.normalize {
		s = f.String(s)
	}
	var buf [16]segment
	for _, seg := range m.normTokens.split(buf[:0], s) {
		if full(dst, stop) {
			break
		}
		if seg.isToken {
			dst = append(dst, seg.id)
			continue
		}
		dst = m.preTokenize(dst, seg.text, 0, stop)
	}
	return dst
}

// preTokenize runs the pre-tokenizer's steps from k on over piece and
// encodes the words they make, until dst has stop ids.
func (m *model) preTokenize(dst []uint32, piece string, k, stop int) []uint32 {
	if piece == "" {
		return dst
	}
	if k == len(m.steps) {
		return m.bpe.encodeWord(dst, piece)
	}
	s := m.steps[k]
	if s.addSpace && piece[0] != ' ' {
		piece = " " + piece
	}
	if !s.split {
		return m.preTokenize(dst, piece, k+1, stop)
	}
	for i := 0; i < len(piece) && !full(dst, stop); {
		e := s.rule.scanWord(piece, i)
		dst = m.preTokenize(dst, piece[i:e], k+1, stop)
		i = e
	}
	return dst
}
