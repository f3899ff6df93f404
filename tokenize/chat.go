package tokenize

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/ardanlabs/jinja"
)

// tokenizerConfig is what this package reads of tokenizer_config.json.
type tokenizerConfig struct {
	template string
	// specials are the special tokens' names the template sees (bos_token,
	// eos_token, unk_token, pad_token), as transformers passes its
	// special_tokens_map.
	specials map[string]string
}

// parseConfig reads a tokenizer_config.json.
func parseConfig(name string, data []byte) (tokenizerConfig, error) {
	var raw struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
		BOS          json.RawMessage `json:"bos_token"`
		EOS          json.RawMessage `json:"eos_token"`
		Unk          json.RawMessage `json:"unk_token"`
		Pad          json.RawMessage `json:"pad_token"`
	}
	cfg := tokenizerConfig{specials: map[string]string{}}
	if err := json.Unmarshal(data, &raw); err != nil {
		return cfg, fmt.Errorf("%w: %s: %v", ErrFormat, name, err)
	}
	for field, v := range map[string]json.RawMessage{"bos_token": raw.BOS, "eos_token": raw.EOS, "unk_token": raw.Unk, "pad_token": raw.Pad} {
		s, err := tokenContent(v)
		if err != nil {
			return cfg, fmt.Errorf("%w: %s: %s: %v", ErrFormat, name, field, err)
		}
		if s != "" {
			cfg.specials[field] = s
		}
	}
	if isNull(raw.ChatTemplate) {
		return cfg, nil
	}
	if err := json.Unmarshal(raw.ChatTemplate, &cfg.template); err == nil {
		return cfg, nil
	}
	// A list of named templates: the chat path uses "default".
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw.ChatTemplate, &named); err != nil {
		return cfg, fmt.Errorf("%w: %s: chat_template: neither a string nor a list of {name, template}: %v", ErrFormat, name, err)
	}
	for _, n := range named {
		if n.Name == "default" {
			cfg.template = n.Template
			return cfg, nil
		}
	}
	return cfg, fmt.Errorf("%w: %s: chat_template: a list of %d templates without one named \"default\"", ErrFormat, name, len(named))
}

// tokenContent reads a special token given as a string, an AddedToken
// object ({"content": ...}) or null.
func tokenContent(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Content == nil {
		return "", fmt.Errorf("%s is neither a string nor an object with content", truncate(raw))
	}
	return *obj.Content, nil
}

// chatTemplate is a compiled chat template and what it is rendered with.
type chatTemplate struct {
	tmpl *jinja.Template
	// parts is set when the template reads a message's content as a list
	// of parts (vLLM's "openai" content format); otherwise text parts are
	// joined with newlines into one string ("string" format).
	parts    bool
	specials map[string]string
	// marked says the compiled source has jinjaSource's markers.
	marked bool
}

// contentLoop is how vLLM's content-format detection recognises a template
// that iterates over a message's content parts.
var contentLoop = regexp.MustCompile(`for\s+\w+\s+in\s+\w+(\s*\[\s*['"]content['"]\s*\]|\.content)`)

func compileChat(name, src string, specials map[string]string) (*chatTemplate, error) {
	source, marked := jinjaSource(src)
	tmpl, err := jinja.Compile(source)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrFormat, name, err)
	}
	return &chatTemplate{tmpl: tmpl, parts: contentLoop.MatchString(src), specials: specials, marked: marked}, nil
}

// jinjaSource reads a template's source as Jinja2's lexer does: line
// breaks as "\n", and the last one dropped (keep_trailing_newline is off
// in transformers' environment). The template engine applies
// transformers' trim_blocks and lstrip_blocks itself, but its whitespace
// control looks for the nearest text past any tag: "a {{ x }}{%- if %}"
// would lose the space before the expression, which Jinja2 keeps (only
// the empty text between the two tags is trimmed). So a marker is put
// between every two adjacent tags, a text the trimming stops at, and taken
// out of the output (marked reports whether there is one).
func jinjaSource(src string) (out string, marked bool) {
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	src = strings.TrimSuffix(src, "\n")
	var sb strings.Builder
	sb.Grow(len(src))
	prevEnd := -1 // the end of the last tag
	for i := 0; i < len(src); {
		j := strings.IndexByte(src[i:], '{')
		if j < 0 {
			sb.WriteString(src[i:])
			break
		}
		j += i
		if j+1 >= len(src) || (src[j+1] != '%' && src[j+1] != '{' && src[j+1] != '#') {
			sb.WriteString(src[i : j+1])
			i = j + 1
			continue
		}
		sb.WriteString(src[i:j])
		if j == prevEnd {
			sb.WriteString(marker)
			marked = true
		}
		end := tagEnd(src, j)
		sb.WriteString(src[j:end])
		i, prevEnd = end, end
	}
	return sb.String(), marked
}

// marker is the text jinjaSource puts between adjacent tags: U+FDD0, a
// Unicode noncharacter, which no request may contain (ErrInput).
const marker = "\uFDD0"

// hasMarker reports whether raw JSON holds the marker, as UTF-8 or as an
// escape.
func hasMarker(raw []byte) bool {
	s := string(raw)
	return strings.Contains(s, marker) || strings.Contains(strings.ToLower(s), `\ufdd0`)
}

// tagEnd returns the end of the tag that opens at j: past its closer, with
// string literals in expressions and statements skipped as the template
// engine skips them; the end of src if it is not closed (the engine then
// reports it).
func tagEnd(src string, j int) int {
	kind := src[j+1]
	closer := "}}"
	switch kind {
	case '%':
		closer = "%}"
	case '#':
		if k := strings.Index(src[j+2:], "#}"); k >= 0 {
			return j + 2 + k + 2
		}
		return len(src)
	}
	for k := j + 2; k < len(src); k++ {
		switch c := src[k]; {
		case c == '\'' || c == '"':
			for k++; k < len(src) && src[k] != c; k++ {
				if src[k] == '\\' {
					k++
				}
			}
		case strings.HasPrefix(src[k:], closer):
			return k + 2
		}
	}
	return len(src)
}

// ChatRequest is what this package reads of a chat completions body: the
// raw JSON of its messages, tools and chat_template_kwargs, and its
// template flags, as vLLM reads them. A caller that has parsed the body
// already (a router) hands it to AppendChat, with no second parse.
type ChatRequest struct {
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	AddSpecialTokens     bool            `json:"add_special_tokens"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
}

// EncodeChat returns the token ids of a chat request's messages (the JSON
// array of its "messages" field) as vLLM's chat endpoint computes them by
// default: rendered with the chat template, add_generation_prompt true, no
// tools, then encoded without adding special tokens.
func (t *Tokenizer) EncodeChat(messages []byte) ([]uint32, error) {
	text, err := t.render(ChatRequest{Messages: messages})
	if err != nil {
		return nil, err
	}
	return t.AppendEncode(nil, text, false)
}

// EncodeChatRequest is EncodeChat for a whole chat completions body: it
// reads messages, tools, add_generation_prompt, continue_final_message,
// add_special_tokens and chat_template_kwargs as vLLM does.
func (t *Tokenizer) EncodeChatRequest(body []byte) ([]uint32, error) {
	return t.AppendChatRequest(nil, body)
}

// AppendChatRequest appends the token ids EncodeChatRequest returns to dst
// and returns the extended slice (dst unchanged on an error).
func (t *Tokenizer) AppendChatRequest(dst []uint32, body []byte) ([]uint32, error) {
	if len(body) > t.maxInput {
		return dst, fmt.Errorf("%w: a body of %d bytes is longer than %d (MaxInputBytes)", ErrInput, len(body), t.maxInput)
	}
	var req ChatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return dst, fmt.Errorf("%w: chat request: %v", ErrInput, err)
	}
	return t.AppendChat(dst, req)
}

// AppendChat is AppendChatRequest for a body its caller has parsed: it
// appends the token ids of req to dst and returns the extended slice (dst
// unchanged on an error).
func (t *Tokenizer) AppendChat(dst []uint32, req ChatRequest) ([]uint32, error) {
	if n := len(req.Messages) + len(req.Tools) + len(req.ChatTemplateKwargs); n > t.maxInput {
		return dst, fmt.Errorf("%w: messages, tools and chat_template_kwargs of %d bytes are longer than %d (MaxInputBytes)", ErrInput, n, t.maxInput)
	}
	text, err := t.render(req)
	if err != nil {
		return dst, err
	}
	return t.AppendEncode(dst, text, req.AddSpecialTokens)
}

// RenderChat returns the text a chat request's messages render to, the
// prompt EncodeChat encodes.
func (t *Tokenizer) RenderChat(messages []byte) (string, error) {
	return t.render(ChatRequest{Messages: messages})
}

// execute renders the template with data, jinjaSource's markers taken out.
func (c *chatTemplate) execute(data map[string]jinja.Value) (string, error) {
	out, err := c.tmpl.RenderValues(data)
	if err != nil {
		return "", fmt.Errorf("%w: rendering the chat template: %v", ErrInput, err)
	}
	if c.marked {
		out = strings.ReplaceAll(out, marker, "")
	}
	return out, nil
}

// context returns the variables the template is rendered with, as
// transformers passes them, and the final message's text.
func (t *Tokenizer) context(req ChatRequest) (map[string]jinja.Value, string, error) {
	if t.chat == nil {
		return nil, "", fmt.Errorf("%w: %s has no %s with a chat_template, no %s, and Options.ChatTemplate is not set", ErrNoTemplate, t.dir, TokenizerConfigFile, ChatTemplateFile)
	}
	if len(req.Messages) > t.maxInput {
		return nil, "", fmt.Errorf("%w: messages of %d bytes are longer than %d (MaxInputBytes)", ErrInput, len(req.Messages), t.maxInput)
	}
	if t.chat.marked && (hasMarker(req.Messages) || hasMarker(req.Tools) || hasMarker(req.ChatTemplateKwargs)) {
		return nil, "", fmt.Errorf("%w: chat request: holds U+FDD0, a Unicode noncharacter this package reserves", ErrInput)
	}
	msgs, final, err := t.chat.messages(req.Messages)
	if err != nil {
		return nil, "", err
	}
	genPrompt := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
	if req.ContinueFinalMessage && genPrompt {
		if req.AddGenerationPrompt != nil {
			return nil, "", fmt.Errorf("%w: chat request: continue_final_message and add_generation_prompt are both true", ErrInput)
		}
		genPrompt = false
	}
	data := make(map[string]jinja.Value, 8)
	if !isNull(req.ChatTemplateKwargs) {
		kw, err := decodeOrdered(req.ChatTemplateKwargs)
		o, ok := kw.(*object)
		if err != nil || !ok {
			return nil, "", fmt.Errorf("%w: chat request: chat_template_kwargs is not an object", ErrInput)
		}
		for _, k := range o.keys {
			data[k] = toValue(o.m[k])
		}
	}
	for k, v := range t.chat.specials {
		data[k] = jinja.NewString(v)
	}
	data["tools"] = jinja.None()
	if !isNull(req.Tools) {
		tools, err := decodeOrdered(req.Tools)
		if err != nil {
			return nil, "", fmt.Errorf("%w: chat request: tools: %v", ErrInput, err)
		}
		data["tools"] = toValue(tools)
	}
	data["messages"] = toValue(msgs)
	data["documents"] = jinja.None()
	data["add_generation_prompt"] = jinja.NewBool(genPrompt)
	return data, final, nil
}

func (t *Tokenizer) render(req ChatRequest) (string, error) {
	data, final, err := t.context(req)
	if err != nil {
		return "", err
	}
	out, err := t.chat.execute(data)
	if err != nil {
		return "", err
	}
	if req.ContinueFinalMessage {
		// As transformers does: the prompt ends where the final message's
		// content does, without the template's end-of-turn tokens.
		final = strings.TrimSpace(final)
		k := strings.LastIndex(out, final)
		if final == "" || k < 0 {
			return "", fmt.Errorf("%w: chat request: continue_final_message: the final message's content is not in the rendered prompt", ErrInput)
		}
		out = out[:k+len(final)]
	}
	return out, nil
}

// messages decodes a messages array into the values the template sees, as
// vLLM prepares them: text parts joined (string format) or kept as parts,
// tool calls' arguments decoded from their JSON string. It returns the
// final message's text too.
func (c *chatTemplate) messages(raw json.RawMessage) ([]any, string, error) {
	if isNull(raw) {
		return nil, "", fmt.Errorf("%w: chat request: messages missing", ErrInput)
	}
	v, err := decodeOrdered(raw)
	if err != nil {
		return nil, "", fmt.Errorf("%w: chat request: messages: %v", ErrInput, err)
	}
	list, ok := v.([]any)
	if !ok || len(list) == 0 {
		return nil, "", fmt.Errorf("%w: chat request: messages is not a non-empty array", ErrInput)
	}
	final := ""
	for i, m := range list {
		msg, ok := m.(*object)
		if !ok {
			return nil, "", fmt.Errorf("%w: chat request: messages[%d] is not an object", ErrInput, i)
		}
		if _, ok := msg.get("role").(string); !ok {
			return nil, "", fmt.Errorf("%w: chat request: messages[%d].role is not a string", ErrInput, i)
		}
		text, err := c.content(msg, i)
		if err != nil {
			return nil, "", err
		}
		final = text
		if err := toolArguments(msg, i); err != nil {
			return nil, "", err
		}
	}
	return list, final, nil
}

// content normalises msg's content as vLLM does (a string, or in parts
// form a list of text parts, a string being one part) and returns its
// text.
func (c *chatTemplate) content(msg *object, i int) (string, error) {
	switch v := msg.get("content").(type) {
	case nil:
		// vLLM reads no content as no parts.
		if c.parts {
			msg.set("content", []any{})
		} else {
			msg.set("content", "")
		}
		return "", nil
	case string:
		if c.parts {
			msg.set("content", []any{textPart(v)})
		}
		return v, nil
	case []any:
		texts := make([]string, 0, len(v))
		parts := make([]any, 0, len(v))
		for j, p := range v {
			part, ok := p.(*object)
			if !ok {
				return "", fmt.Errorf("%w: chat request: messages[%d].content[%d] is not an object", ErrInput, i, j)
			}
			typ, _ := part.get("type").(string)
			text, isText := part.get("text").(string)
			if !isText || (typ != "text" && typ != "input_text" && typ != "output_text") {
				return "", fmt.Errorf("%w: chat request: messages[%d].content[%d]: only text parts are tokenized (type %q)", ErrInput, i, j, typ)
			}
			texts = append(texts, text)
			parts = append(parts, textPart(text))
		}
		joined := strings.Join(texts, "\n")
		if c.parts {
			msg.set("content", parts)
		} else {
			msg.set("content", joined)
		}
		return joined, nil
	}
	return "", fmt.Errorf("%w: chat request: messages[%d].content is neither a string, an array of parts nor null", ErrInput, i)
}

// toolArguments decodes the arguments of msg's tool calls from JSON strings
// to objects, as vLLM hands them to the template.
func toolArguments(msg *object, i int) error {
	calls, _ := msg.get("tool_calls").([]any)
	for j, call := range calls {
		cm, ok := call.(*object)
		if !ok {
			continue
		}
		fn, ok := cm.get("function").(*object)
		if !ok {
			continue
		}
		args, ok := fn.get("arguments").(string)
		if !ok {
			continue
		}
		v, err := decodeOrdered([]byte(args))
		if err != nil {
			return fmt.Errorf("%w: chat request: messages[%d].tool_calls[%d].function.arguments: %v", ErrInput, i, j, err)
		}
		fn.set("arguments", v)
	}
	return nil
}

// textPart is a text content part as vLLM hands it to a template.
func textPart(text string) *object {
	return &object{keys: []string{"type", "text"}, m: map[string]any{"type": "text", "text": text}}
}

// EncodeCompletionRequest returns the token ids of a completions body's
// prompt as vLLM computes them: a string (or an array of one string)
// encoded with the post-processor's special tokens unless
// add_special_tokens is false; an array of token ids as it is.
func (t *Tokenizer) EncodeCompletionRequest(body []byte) ([]uint32, error) {
	return t.AppendCompletionRequest(nil, body)
}

// AppendCompletionRequest appends the token ids EncodeCompletionRequest
// returns to dst and returns the extended slice (dst unchanged on an
// error).
func (t *Tokenizer) AppendCompletionRequest(dst []uint32, body []byte) ([]uint32, error) {
	if len(body) > t.maxInput {
		return dst, fmt.Errorf("%w: a body of %d bytes is longer than %d (MaxInputBytes)", ErrInput, len(body), t.maxInput)
	}
	var req struct {
		Prompt           json.RawMessage `json:"prompt"`
		AddSpecialTokens *bool           `json:"add_special_tokens"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return dst, fmt.Errorf("%w: completions request: %v", ErrInput, err)
	}
	return t.AppendCompletion(dst, req.Prompt, req.AddSpecialTokens == nil || *req.AddSpecialTokens)
}

// AppendCompletion is AppendCompletionRequest for a body its caller has
// parsed: prompt is the raw JSON of its prompt field, special whether to
// add the post-processor's special tokens (add_special_tokens, true when
// absent).
func (t *Tokenizer) AppendCompletion(dst []uint32, prompt json.RawMessage, special bool) ([]uint32, error) {
	if len(prompt) > t.maxInput {
		return dst, fmt.Errorf("%w: a prompt of %d bytes is longer than %d (MaxInputBytes)", ErrInput, len(prompt), t.maxInput)
	}
	var s string
	if err := json.Unmarshal(prompt, &s); err == nil {
		return t.AppendEncode(dst, s, special)
	}
	var one []string
	if err := json.Unmarshal(prompt, &one); err == nil {
		if len(one) != 1 {
			return dst, fmt.Errorf("%w: completions request: prompt is %d strings, want one", ErrInput, len(one))
		}
		return t.AppendEncode(dst, one[0], special)
	}
	var ids []uint32
	if err := json.Unmarshal(prompt, &ids); err == nil && len(ids) > 0 {
		if t.maxTokens > 0 && len(ids) > t.maxTokens {
			ids = ids[:t.maxTokens]
		}
		return append(dst, ids...), nil
	}
	return dst, fmt.Errorf("%w: completions request: prompt is neither a string, one string in an array nor token ids", ErrInput)
}
