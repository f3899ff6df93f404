package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
)

// Endpoint is an OpenAI inference endpoint the router serves.
type Endpoint int

// The endpoints the router parses.
const (
	// EndpointChat is POST /v1/chat/completions.
	EndpointChat Endpoint = iota
	// EndpointCompletions is POST /v1/completions.
	EndpointCompletions
	// EndpointResponses is POST /v1/responses (the Responses API).
	EndpointResponses
	// EndpointEmbeddings is POST /v1/embeddings.
	EndpointEmbeddings
)

// endpointPaths are the endpoints' URL paths, by Endpoint.
var endpointPaths = [...]string{
	EndpointChat:        "/v1/chat/completions",
	EndpointCompletions: "/v1/completions",
	EndpointResponses:   "/v1/responses",
	EndpointEmbeddings:  "/v1/embeddings",
}

// Path returns the endpoint's URL path (the chat path for an unknown one).
func (e Endpoint) Path() string {
	if e < 0 || int(e) >= len(endpointPaths) {
		return endpointPaths[EndpointChat]
	}
	return endpointPaths[e]
}

// EndpointForPath returns the endpoint served at the URL path p.
func EndpointForPath(p string) (Endpoint, bool) {
	for e, path := range endpointPaths {
		if path == p {
			return Endpoint(e), true
		}
	}
	return 0, false
}

// maxModelLen bounds the model name.
const maxModelLen = 256

// Ceilings of the sampling parameters the router checks before forwarding.
const (
	// MaxTokensLimit is the largest max_tokens (or max_completion_tokens)
	// accepted: above the largest context window any served model has
	// (about 10M tokens), and far below the int32 that engines store it
	// in; anything larger is a mistake no engine could honour.
	MaxTokensLimit = 1 << 24
	// MaxChoices is the largest n (choices per request): the OpenAI API's
	// own limit; each choice is a sequence that takes a batch slot.
	MaxChoices = 128
	// MaxTemperature is the largest temperature, as the OpenAI API defines it.
	MaxTemperature = 2.0
	// MaxDimensions is the largest embeddings dimensions: far above the
	// widest embedding models (a few thousand dimensions), so it rejects
	// only what no model could produce.
	MaxDimensions = 1 << 16
)

// Request is what the router needs from an OpenAI inference request; the
// raw body is kept to forward unchanged. The router reads only the
// leading prompt content (the affinity key hashes at most MaxPrefixBytes
// of it), so it keeps only that: every message and prompt is validated,
// but only the ones the key reads are kept, and of those at most
// MaxPrefixBytes of text. Parsing thus costs no more than the body's size
// in memory, whatever the body holds.
type Request struct {
	// Endpoint is the endpoint the request came in on.
	Endpoint Endpoint
	// Model is the requested model.
	Model string
	// Stream reports whether the client asked for a streamed (SSE) answer.
	Stream bool
	// User is the OpenAI user field, empty when absent.
	User string
	// Messages are the chat messages the affinity key reads (chat endpoint
	// only), in body order: the first system (or developer) message and the
	// first other message.
	Messages []Message
	// Prompts holds the first text prompt (completions endpoint, string or
	// array of strings forms).
	Prompts []string
	// PromptTokens is the raw JSON of the first token-array prompt
	// (completions endpoint, array of integers forms), nil otherwise.
	PromptTokens json.RawMessage
	// PromptCacheKey is the prompt_cache_key field (chat and responses:
	// OpenAI's hint that requests share a cached prefix), empty when absent.
	PromptCacheKey string
	// Conversation is the Responses API conversation id (the string form
	// or the object form's id), empty when absent.
	Conversation string
	// PreviousResponseID is the Responses API previous_response_id, empty
	// when absent.
	PreviousResponseID string
	// Body is the request body as received.
	Body []byte
	// ModelAt and ModelEnd delimit the model's JSON string (quotes
	// included) in Body, for WithModel.
	ModelAt, ModelEnd int
	// Context is the raw JSON of the request's whole prompt content, in
	// order, as PrefixKeys reads it: the messages array (chat), the input
	// array (responses), or the prompt (completions; the first prompt of an
	// array); Instructions is the responses instructions string. Both alias
	// Body.
	Context, Instructions json.RawMessage
	// Template holds the raw JSON of the fields vLLM's chat template and
	// tokenizer read beside the prompt, for a Tokenizer to use without
	// parsing Body again. They alias Body and are not checked.
	Template TemplateFields

	kept [2]Message // Messages' backing array: no allocation of its own
}

// TemplateFields are what a request says beside its prompt to vLLM's chat
// template and tokenizer: the raw JSON of its tools and
// chat_template_kwargs (nil when absent; aliases of Body, not checked) and
// its add_generation_prompt, continue_final_message and add_special_tokens
// flags.
type TemplateFields struct {
	Tools, ChatTemplateKwargs                                   json.RawMessage
	AddGenerationPrompt, ContinueFinalMessage, AddSpecialTokens Flag
}

// Flag is an optional JSON boolean as a request gives it.
type Flag uint8

// Flag values: absent (or null), true, false, or another JSON value (which
// engines refuse; the router leaves that to them).
const (
	FlagAbsent Flag = iota
	FlagTrue
	FlagFalse
	FlagInvalid
)

// Bool returns the flag's value, def when absent, and false for an
// invalid flag.
func (f Flag) Bool(def bool) (v, ok bool) {
	switch f {
	case FlagAbsent:
		return def, true
	case FlagTrue:
		return true, true
	case FlagFalse:
		return false, true
	}
	return false, false
}

// flagOf reads a raw JSON value as a Flag.
func flagOf(raw []byte) Flag {
	switch string(raw) {
	case "", "null":
		return FlagAbsent
	case "true":
		return FlagTrue
	case "false":
		return FlagFalse
	}
	return FlagInvalid
}

// Message is one chat message: its role and the text of its content (a
// string content is one piece; an array content gives one piece per text
// part), at most MaxPrefixBytes of text in all.
type Message struct {
	// Role is the message's role, e.g. "system" or "user".
	Role string
	// Text holds the message's text pieces.
	Text []string
}

// rawRequest holds the raw JSON values of the fields the router reads.
type rawRequest struct {
	Model     json.RawMessage
	Stream    json.RawMessage
	User      json.RawMessage
	Messages  json.RawMessage
	Prompt    json.RawMessage
	MaxTokens json.RawMessage
	MaxCompl  json.RawMessage
	N         json.RawMessage
	Temp      json.RawMessage
	TopP      json.RawMessage
	Presence  json.RawMessage
	Frequency json.RawMessage
	// Responses API and embeddings fields.
	Input        json.RawMessage
	Instructions json.RawMessage
	PrevResp     json.RawMessage
	Conv         json.RawMessage
	MaxOutput    json.RawMessage
	Dimensions   json.RawMessage
	CacheKey     json.RawMessage
	// The chat template's fields, kept for Request.Template.
	Template TemplateFields
}

// ParseRequest parses body as a request to endpoint, strictly enough to
// reject what no engine would accept: malformed JSON, a body that is not an
// object, a missing or non-string model, a non-boolean stream, a non-string
// user, chat messages that are not a non-empty array of {role, content}
// objects with string, array-of-parts or null content, or a prompt that is
// not a string, array of strings, array of integers or array of integer
// arrays, and sampling parameters out of range (checkParams: max_tokens,
// max_completion_tokens, n, temperature, top_p, presence_penalty,
// frequency_penalty). Errors are *APIError with
// status 400 in the OpenAI shape, naming the parameter. body is kept, not
// copied.
//
// The body is checked with json.Valid and then walked by a scanner
// (openai_scan.go) that reads only the fields above and skips the rest
// without decoding it. Field names match exactly (as engines match them);
// of repeated fields the last counts.
func ParseRequest(endpoint Endpoint, body []byte) (*Request, error) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, InvalidRequest("", "request body must be a JSON object")
	}
	if !json.Valid(trimmed) {
		var v json.RawMessage
		err := json.Unmarshal(trimmed, &v) // only for the syntax error's detail
		return nil, InvalidRequest("", fmt.Sprintf("malformed JSON body: %v", err))
	}
	var raw rawRequest
	for m := (members{b: trimmed}); ; {
		key, val, ok := m.next()
		if !ok {
			break
		}
		switch {
		case keyIs(key, "model"):
			raw.Model = val
		case keyIs(key, "stream"):
			raw.Stream = val
		case keyIs(key, "user"):
			raw.User = val
		case keyIs(key, "messages"):
			raw.Messages = val
		case keyIs(key, "prompt"):
			raw.Prompt = val
		case keyIs(key, "max_tokens"):
			raw.MaxTokens = val
		case keyIs(key, "max_completion_tokens"):
			raw.MaxCompl = val
		case keyIs(key, "n"):
			raw.N = val
		case keyIs(key, "temperature"):
			raw.Temp = val
		case keyIs(key, "top_p"):
			raw.TopP = val
		case keyIs(key, "presence_penalty"):
			raw.Presence = val
		case keyIs(key, "frequency_penalty"):
			raw.Frequency = val
		case keyIs(key, "input"):
			raw.Input = val
		case keyIs(key, "instructions"):
			raw.Instructions = val
		case keyIs(key, "previous_response_id"):
			raw.PrevResp = val
		case keyIs(key, "conversation"):
			raw.Conv = val
		case keyIs(key, "max_output_tokens"):
			raw.MaxOutput = val
		case keyIs(key, "dimensions"):
			raw.Dimensions = val
		case keyIs(key, "prompt_cache_key"):
			raw.CacheKey = val
		case keyIs(key, "tools"):
			raw.Template.Tools = val
		case keyIs(key, "chat_template_kwargs"):
			raw.Template.ChatTemplateKwargs = val
		case keyIs(key, "add_generation_prompt"):
			raw.Template.AddGenerationPrompt = flagOf(val)
		case keyIs(key, "continue_final_message"):
			raw.Template.ContinueFinalMessage = flagOf(val)
		case keyIs(key, "add_special_tokens"):
			raw.Template.AddSpecialTokens = flagOf(val)
		}
	}
	req := &Request{Endpoint: endpoint, Body: body, Template: raw.Template}
	if isAbsent(raw.Model) {
		return nil, InvalidRequest("model", "missing required parameter: 'model'")
	}
	if len(raw.Model) > 6*maxModelLen+2 { // \uXXXX per character at most: too long before decoding it
		return nil, InvalidRequest("model", fmt.Sprintf("'model' must be 1 to %d characters", maxModelLen))
	}
	model, ok := decodeString(raw.Model)
	if !ok {
		return nil, InvalidRequest("model", "'model' must be a string")
	}
	req.Model = model
	// raw.Model is a subslice of body, so its offset is what its capacity
	// lacks of body's: no scan of the body again to find it.
	req.ModelAt = cap(body) - cap(raw.Model)
	req.ModelEnd = req.ModelAt + len(raw.Model)
	if req.Model == "" || len(req.Model) > maxModelLen {
		return nil, InvalidRequest("model", fmt.Sprintf("'model' must be 1 to %d characters", maxModelLen))
	}
	if !isAbsent(raw.Stream) {
		switch string(raw.Stream) {
		case "true":
			req.Stream = true
		case "false":
		default:
			return nil, InvalidRequest("stream", "'stream' must be a boolean")
		}
	}
	if !isAbsent(raw.User) {
		if req.User, ok = decodeString(raw.User); !ok {
			return nil, InvalidRequest("user", "'user' must be a string")
		}
	}
	if !isAbsent(raw.CacheKey) {
		if req.PromptCacheKey, ok = decodeString(raw.CacheKey); !ok {
			return nil, InvalidRequest("prompt_cache_key", "'prompt_cache_key' must be a string")
		}
	}
	if err := checkParams(&raw); err != nil {
		return nil, err
	}
	switch endpoint {
	case EndpointChat:
		if !isAbsent(raw.Prompt) {
			return nil, InvalidRequest("prompt", "'prompt' is not a chat completions parameter; use 'messages'")
		}
		msgs, err := parseMessages(raw.Messages, req.kept[:0])
		if err != nil {
			return nil, err
		}
		req.Messages, req.Context = msgs, raw.Messages
	case EndpointCompletions:
		if !isAbsent(raw.Messages) {
			return nil, InvalidRequest("messages", "'messages' is not a completions parameter; use 'prompt'")
		}
		if err := parsePrompt(raw.Prompt, req); err != nil {
			return nil, err
		}
		req.Context = raw.Prompt
	case EndpointResponses:
		if err := parseResponses(&raw, req); err != nil {
			return nil, err
		}
	case EndpointEmbeddings:
		if err := parseEmbeddings(&raw, req); err != nil {
			return nil, err
		}
	default:
		return nil, InvalidRequest("", fmt.Sprintf("unknown endpoint %d", endpoint))
	}
	return req, nil
}

// isAbsent reports whether a field was missing or null.
func isAbsent(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

// parseMessages validates every chat message (an object with a non-empty
// string role and a valid content) and returns those the affinity key
// reads (see Request.Messages), appended to msgs (of capacity 2). Nothing
// is allocated per message.
func parseMessages(raw json.RawMessage, msgs []Message) ([]Message, error) {
	if isAbsent(raw) {
		return nil, InvalidRequest("messages", "missing required parameter: 'messages'")
	}
	if raw[0] != '[' {
		return nil, InvalidRequest("messages", "'messages' must be an array of message objects")
	}
	msgs, n, err := scanMessages(raw, "messages", msgs)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, InvalidRequest("messages", "'messages' must not be empty")
	}
	return msgs, nil
}

// scanMessages validates every message of the array raw, the parameter
// name ("messages", or "input" of the Responses API, whose items without a
// role are other items with a string type, skipped), and appends those the
// affinity key reads to msgs: the first system (or developer) message,
// unless msgs holds one already, and the first other message. It returns
// them and the number of items. Nothing is allocated per message.
func scanMessages(raw json.RawMessage, name string, msgs []Message) ([]Message, int, error) {
	sys, other := len(msgs) > 0, false
	items := elements{b: raw}
	i := 0
	for ; ; i++ {
		item, ok := items.next()
		if !ok {
			break
		}
		if item[0] != '{' {
			param := fmt.Sprintf("%s[%d]", name, i)
			return nil, 0, InvalidRequest(param, fmt.Sprintf("'%s' must be an object", param))
		}
		var role, typ, content json.RawMessage
		for m := (members{b: item}); ; {
			key, val, ok := m.next()
			if !ok {
				break
			}
			switch {
			case keyIs(key, "role"):
				role = val
			case keyIs(key, "type"):
				typ = val
			case keyIs(key, "content"):
				content = val
			}
		}
		if name == "input" && isAbsent(role) { // a tool call, its output, a reasoning item...: not a message
			if len(typ) <= 2 || typ[0] != '"' {
				param := fmt.Sprintf("%s[%d]", name, i)
				return nil, 0, InvalidRequest(param, fmt.Sprintf("'%s' must have a string 'role' or 'type'", param))
			}
			continue
		}
		if len(role) <= 2 || role[0] != '"' { // "" is empty; any escape decodes to a character
			param := fmt.Sprintf("%s[%d]", name, i)
			return nil, 0, InvalidRequest(param+".role", fmt.Sprintf("'%s.role' must be a non-empty string", param))
		}
		isSys := keyIs(role, "system") || keyIs(role, "developer")
		keep := (isSys && !sys) || (!isSys && !other)
		text, err := parseContent(content, name, i, keep)
		if err != nil {
			return nil, 0, err
		}
		if !keep {
			continue
		}
		if isSys {
			sys = true
		} else {
			other = true
		}
		msgs = append(msgs, Message{Role: roleName(role), Text: text})
	}
	return msgs, i, nil
}

// roleName returns the decoded role raw, without allocating for the
// roles of the OpenAI API.
func roleName(raw []byte) string {
	for _, r := range [...]string{"user", "system", "assistant", "developer", "tool"} {
		if keyIs(raw, r) {
			return r
		}
	}
	r, _ := textPrefix(raw, MaxPrefixBytes)
	return r
}

// parseContent accepts a string, an array of content parts, or null, as the
// content of message i of the array name ("messages", or "input" of the
// Responses API, whose text parts are input_text and output_text as well
// as text). With keep it returns the text pieces, at most MaxPrefixBytes of
// text in all; without, it only validates.
func parseContent(raw json.RawMessage, name string, i int, keep bool) ([]string, error) {
	if isAbsent(raw) {
		return nil, nil
	}
	switch raw[0] {
	case '"':
		if !keep {
			return nil, nil
		}
		s, _ := textPrefix(raw, MaxPrefixBytes)
		return []string{s}, nil
	case '[':
		var text []string
		budget := MaxPrefixBytes
		parts := elements{b: raw}
		for j := 0; ; j++ {
			p, ok := parts.next()
			if !ok {
				break
			}
			var typ, txt json.RawMessage
			if p[0] == '{' {
				for m := (members{b: p}); ; {
					key, val, ok := m.next()
					if !ok {
						break
					}
					switch {
					case keyIs(key, "type"):
						typ = val
					case keyIs(key, "text"):
						txt = val
					}
				}
			}
			if len(typ) <= 2 || typ[0] != '"' {
				pp := fmt.Sprintf("%s[%d].content[%d]", name, i, j)
				return nil, InvalidRequest(pp, fmt.Sprintf("'%s' must be an object with a string 'type'", pp))
			}
			if !keyIs(typ, "text") && (name != "input" || !keyIs(typ, "input_text") && !keyIs(typ, "output_text")) {
				continue
			}
			if len(txt) < 2 || txt[0] != '"' {
				pp := fmt.Sprintf("%s[%d].content[%d]", name, i, j)
				return nil, InvalidRequest(pp+".text", fmt.Sprintf("'%s.text' must be a string", pp))
			}
			if keep && budget > 0 {
				s, _ := textPrefix(txt, budget)
				budget -= len(s)
				text = append(text, s)
			}
		}
		return text, nil
	default:
		param := fmt.Sprintf("%s[%d].content", name, i)
		return nil, InvalidRequest(param, fmt.Sprintf("'%s' must be a string, an array of content parts or null", param))
	}
}

// parsePrompt accepts a string, an array of strings, an array of integers
// or an array of integer arrays; absent is allowed (engines default it).
// It keeps the first prompt (Request.Prompts, Request.PromptTokens).
func parsePrompt(raw json.RawMessage, req *Request) error {
	return parseTexts(raw, req, "prompt")
}

// parseTexts accepts as the parameter param (prompt, or the embeddings
// input) a string, an array of strings, an array of integers or an array
// of integer arrays; absent is allowed. It keeps the first one
// (Request.Prompts, Request.PromptTokens).
func parseTexts(raw json.RawMessage, req *Request, param string) error {
	if isAbsent(raw) {
		return nil
	}
	msg := "'" + param + "' must be a string, an array of strings, an array of integers or an array of integer arrays"
	switch raw[0] {
	case '"':
		s, _ := textPrefix(raw, MaxPrefixBytes)
		req.Prompts = []string{s}
		return nil
	case '[':
	default:
		return InvalidRequest(param, msg)
	}
	items := elements{b: raw}
	first, ok := items.next()
	if !ok {
		return InvalidRequest(param, msg)
	}
	switch first[0] {
	case '"':
		for it, ok := first, true; ok; it, ok = items.next() {
			if it[0] != '"' {
				return InvalidRequest(param, msg)
			}
		}
		s, _ := textPrefix(first, MaxPrefixBytes)
		req.Prompts = []string{s}
	case '[':
		for it, ok := first, true; ok; it, ok = items.next() {
			if it[0] != '[' || !isTokenArray(it) {
				return InvalidRequest(param, msg)
			}
		}
		req.PromptTokens = first
	default:
		if !isTokenArray(raw) {
			return InvalidRequest(param, msg)
		}
		req.PromptTokens = raw
	}
	return nil
}

// checkParams checks the sampling parameters an engine would reject, so
// that a bad request is answered by the router (never reaching, or being
// blamed on, an engine): max_tokens and max_completion_tokens integers in
// 1..MaxTokensLimit (max_output_tokens too), n an integer in
// 1..MaxChoices, dimensions an integer in 1..MaxDimensions, temperature a number in
// 0..MaxTemperature, top_p a number in (0, 1], presence_penalty and
// frequency_penalty numbers in -2..2 (the ranges of the OpenAI API). Absent
// and null are allowed (engines default them). An integer may be written as
// a number with a zero fraction (10.0), as engines' JSON decoders accept it.
func checkParams(raw *rawRequest) error {
	for _, p := range [...]struct {
		name string
		val  json.RawMessage
		max  float64
	}{{"max_tokens", raw.MaxTokens, MaxTokensLimit}, {"max_completion_tokens", raw.MaxCompl, MaxTokensLimit},
		{"max_output_tokens", raw.MaxOutput, MaxTokensLimit}, {"n", raw.N, MaxChoices}, {"dimensions", raw.Dimensions, MaxDimensions}} {
		if isAbsent(p.val) {
			continue
		}
		v, ok := jsonNumber(p.val)
		switch {
		case !ok:
			return paramError(p.name, "invalid_type", fmt.Sprintf("'%s' must be an integer", p.name))
		case v != math.Trunc(v):
			return paramError(p.name, "invalid_type", fmt.Sprintf("'%s' must be an integer, got %s", p.name, Clip(p.val)))
		case v < 1:
			return paramError(p.name, "integer_below_min_value", fmt.Sprintf("'%s' is %s; it must be at least 1", p.name, Clip(p.val)))
		case v > p.max:
			return paramError(p.name, "integer_above_max_value", fmt.Sprintf("'%s' is %s; it must be at most %.0f", p.name, Clip(p.val), p.max))
		}
	}
	for _, p := range [...]struct {
		name     string
		val      json.RawMessage
		min, max float64
		openMin  bool // min itself is out of range
	}{
		{"temperature", raw.Temp, 0, MaxTemperature, false},
		{"top_p", raw.TopP, 0, 1, true},
		{"presence_penalty", raw.Presence, -2, 2, false},
		{"frequency_penalty", raw.Frequency, -2, 2, false},
	} {
		if isAbsent(p.val) {
			continue
		}
		v, ok := jsonNumber(p.val)
		switch {
		case !ok:
			return paramError(p.name, "invalid_type", fmt.Sprintf("'%s' must be a number", p.name))
		case p.openMin && v <= p.min:
			return paramError(p.name, "decimal_below_min_value", fmt.Sprintf("'%s' is %s; it must be above %g", p.name, Clip(p.val), p.min))
		case v < p.min:
			return paramError(p.name, "decimal_below_min_value", fmt.Sprintf("'%s' is %s; it must be at least %g", p.name, Clip(p.val), p.min))
		case v > p.max:
			return paramError(p.name, "decimal_above_max_value", fmt.Sprintf("'%s' is %s; it must be at most %g", p.name, Clip(p.val), p.max))
		}
	}
	return nil
}

// paramError is a 400 invalid_request_error about param with code.
func paramError(param, code, msg string) *APIError {
	return NewAPIError(http.StatusBadRequest, ErrTypeInvalidRequest, code, param, msg)
}

// jsonNumber returns the value of the raw JSON value v when it is a number
// (json.Valid has checked its syntax); a number beyond float64's range is
// ±math.MaxFloat64, so that range checks say it is too large.
func jsonNumber(v []byte) (float64, bool) {
	if len(v) == 0 || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) {
		return 0, false
	}
	huge := math.MaxFloat64
	if v[0] == '-' {
		huge = -huge
	}
	if len(v) > 64 { // not worth parsing: some 60 digits, or an exponent of that size
		return huge, true
	}
	f, err := strconv.ParseFloat(string(v), 64)
	if math.IsInf(f, 0) {
		return huge, true
	}
	return f, err == nil || errors.Is(err, strconv.ErrRange)
}

// EndpointOf tells chat from completions requests (the NATS front, whose
// subject does not name the endpoint, asks it): a body with a
// non-null "messages" member is a chat request. It only scans the body's
// top level; a malformed body is classed as chat, and ParseRequest says
// what is wrong with it.
func EndpointOf(body []byte) Endpoint {
	b := bytes.TrimSpace(body)
	if len(b) == 0 || b[0] != '{' {
		return EndpointChat
	}
	ep := EndpointCompletions
	for m := (members{b: b}); ; {
		key, val, ok := m.next()
		if !ok {
			return ep
		}
		if keyIs(key, "messages") {
			ep = EndpointCompletions
			if !isAbsent(val) {
				ep = EndpointChat
			}
		}
	}
}

// WithModel appends to dst the request's body with its model field's value
// replaced by name and returns it: the bytes before and after the value are
// copied as they are, so nothing else of the body is decoded or encoded.
// The router uses it to send the name an engine serves when the client
// used an alias or the engine serves the model under another name.
func (r *Request) WithModel(dst []byte, name string) []byte {
	dst = append(dst, r.Body[:r.ModelAt]...)
	dst = appendJSONString(dst, name)
	return append(dst, r.Body[r.ModelEnd:]...)
}

// appendJSONString appends s as a JSON string.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}
