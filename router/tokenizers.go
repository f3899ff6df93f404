package router

import (
	"fmt"
	"strings"

	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/tokenize"
)

// Tokenizers is the protocol.Tokenizer of a router that loaded models'
// tokenizers (package tokenize: tokenizer.json and chat template): per
// model id, the tokenizer of the engines that serve it, and a default for
// every other model when one was loaded without a model id. Its zero value
// tokenizes nothing. It is safe for concurrent use once built.
type Tokenizers struct {
	byModel map[string]*tokenize.Tokenizer
	any     *tokenize.Tokenizer
}

// LoadTokenizers loads each spec, "MODEL=DIR" (the tokenizer of model
// MODEL's engines) or "DIR" (the one for every model without its own), DIR
// a model directory as tokenize.Options.Dir reads it. Each is loaded to
// give protocol.MaxPrefixTokens token ids, all the router's keys read.
func LoadTokenizers(specs []string) (*Tokenizers, error) {
	t := &Tokenizers{byModel: map[string]*tokenize.Tokenizer{}}
	for _, spec := range specs {
		model, dir, ok := strings.Cut(spec, "=")
		if !ok {
			model, dir = "", spec
		}
		if dir == "" {
			return nil, fmt.Errorf("tokenizer %q: no model directory", spec)
		}
		if _, dup := t.byModel[model]; dup || (model == "" && t.any != nil) {
			return nil, fmt.Errorf("tokenizer %q: model %q has a tokenizer already", spec, model)
		}
		tk, err := tokenize.New(tokenize.Options{Dir: dir, MaxTokens: protocol.MaxPrefixTokens})
		if err != nil {
			return nil, fmt.Errorf("tokenizer %q: %w", spec, err)
		}
		if model == "" {
			t.any = tk
		} else {
			t.byModel[model] = tk
		}
	}
	return t, nil
}

// Tokens implements protocol.Tokenizer: chat requests through the model's
// chat template, completions as their prompt; false for a model without a
// tokenizer, another endpoint, or a request the tokenizer refuses. It reads
// what ParseRequest parsed (req.Context, req.Template), not the body.
func (t *Tokenizers) Tokens(dst []uint32, model string, req *protocol.Request) ([]uint32, bool) {
	if t == nil {
		return dst, false
	}
	tk := t.byModel[model]
	if tk == nil {
		tk = t.any
	}
	if tk == nil {
		return dst, false
	}
	// What the router parsed (the prompt, the template's fields) is what
	// the tokenizer reads: the body is not parsed again.
	tf := &req.Template
	var err error
	n := len(dst)
	switch req.Endpoint {
	case protocol.EndpointChat:
		if !tk.HasChatTemplate() {
			return dst, false
		}
		// Defaults as vLLM's: a generation prompt, no special tokens.
		genPrompt, genOK := tf.AddGenerationPrompt.Bool(true)
		cont, contOK := tf.ContinueFinalMessage.Bool(false)
		special, specialOK := tf.AddSpecialTokens.Bool(false)
		if !genOK || !contOK || !specialOK {
			return dst, false
		}
		cr := tokenize.ChatRequest{Messages: req.Context, Tools: tf.Tools, ChatTemplateKwargs: tf.ChatTemplateKwargs,
			ContinueFinalMessage: cont, AddSpecialTokens: special}
		if tf.AddGenerationPrompt != protocol.FlagAbsent {
			cr.AddGenerationPrompt = &genPrompt // given: continue_final_message may not be true beside it
		}
		dst, err = tk.AppendChat(dst, cr)
	case protocol.EndpointCompletions:
		special, ok := tf.AddSpecialTokens.Bool(true)
		if !ok {
			return dst, false
		}
		dst, err = tk.AppendCompletion(dst, req.Context, special)
	default:
		return dst, false
	}
	if err != nil || len(dst) == n {
		return dst[:n], false
	}
	return dst, true
}
