package router

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Endpoint is an OpenAI inference endpoint the router serves.
type Endpoint int

// The endpoints the router parses.
const (
	// EndpointChat is POST /v1/chat/completions.
	EndpointChat Endpoint = iota
	// EndpointCompletions is POST /v1/completions.
	EndpointCompletions
)

// Path returns the endpoint's URL path.
func (e Endpoint) Path() string {
	if e == EndpointCompletions {
		return "/v1/completions"
	}
	return "/v1/chat/completions"
}

// maxModelLen bounds the model name.
const maxModelLen = 256

// Request is what the router needs from an OpenAI inference request; the
// raw body is kept to forward unchanged.
type Request struct {
	// Endpoint is the endpoint the request came in on.
	Endpoint Endpoint
	// Model is the requested model.
	Model string
	// Stream reports whether the client asked for a streamed (SSE) answer.
	Stream bool
	// User is the OpenAI user field, empty when absent.
	User string
	// Messages are the chat messages (chat endpoint only).
	Messages []Message
	// Prompts are the text prompts (completions endpoint, string or array of
	// strings forms).
	Prompts []string
	// PromptTokens is the raw JSON of the first token-array prompt
	// (completions endpoint, array of integers forms), nil otherwise.
	PromptTokens json.RawMessage
	// Body is the request body as received.
	Body []byte
}

// Message is one chat message: its role and the text of its content (a
// string content is one piece; an array content gives one piece per text
// part).
type Message struct {
	// Role is the message's role, e.g. "system" or "user".
	Role string
	// Text holds the message's text pieces.
	Text []string
}

// rawRequest holds the raw JSON values of the fields the router reads.
type rawRequest struct {
	Model    json.RawMessage
	Stream   json.RawMessage
	User     json.RawMessage
	Messages json.RawMessage
	Prompt   json.RawMessage
}

// ParseRequest parses body as a request to endpoint, strictly enough to
// reject what no engine would accept: malformed JSON, a body that is not an
// object, a missing or non-string model, a non-boolean stream, a non-string
// user, chat messages that are not a non-empty array of {role, content}
// objects with string, array-of-parts or null content, or a prompt that is
// not a string, array of strings, array of integers or array of integer
// arrays. Errors are *APIError with status 400. body is kept, not copied.
//
// The body is checked with json.Valid and then walked by a scanner
// (openai_scan.go) that reads only the fields above and skips the rest
// without decoding it. Field names match exactly (as engines match them);
// of repeated fields the last counts.
func ParseRequest(endpoint Endpoint, body []byte) (*Request, error) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, invalidRequest("", "request body must be a JSON object")
	}
	if !json.Valid(trimmed) {
		var v json.RawMessage
		err := json.Unmarshal(trimmed, &v) // only for the syntax error's detail
		return nil, invalidRequest("", fmt.Sprintf("malformed JSON body: %v", err))
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
		}
	}
	req := &Request{Endpoint: endpoint, Body: body}
	if isAbsent(raw.Model) {
		return nil, invalidRequest("model", "missing required parameter: 'model'")
	}
	model, ok := decodeString(raw.Model)
	if !ok {
		return nil, invalidRequest("model", "'model' must be a string")
	}
	req.Model = model
	if req.Model == "" || len(req.Model) > maxModelLen {
		return nil, invalidRequest("model", fmt.Sprintf("'model' must be 1 to %d characters", maxModelLen))
	}
	if !isAbsent(raw.Stream) {
		switch string(raw.Stream) {
		case "true":
			req.Stream = true
		case "false":
		default:
			return nil, invalidRequest("stream", "'stream' must be a boolean")
		}
	}
	if !isAbsent(raw.User) {
		if req.User, ok = decodeString(raw.User); !ok {
			return nil, invalidRequest("user", "'user' must be a string")
		}
	}
	switch endpoint {
	case EndpointChat:
		if !isAbsent(raw.Prompt) {
			return nil, invalidRequest("prompt", "'prompt' is not a chat completions parameter; use 'messages'")
		}
		msgs, err := parseMessages(raw.Messages)
		if err != nil {
			return nil, err
		}
		req.Messages = msgs
	case EndpointCompletions:
		if !isAbsent(raw.Messages) {
			return nil, invalidRequest("messages", "'messages' is not a completions parameter; use 'prompt'")
		}
		if err := parsePrompt(raw.Prompt, req); err != nil {
			return nil, err
		}
	default:
		return nil, invalidRequest("", fmt.Sprintf("unknown endpoint %d", endpoint))
	}
	return req, nil
}

// isAbsent reports whether a field was missing or null.
func isAbsent(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

func parseMessages(raw json.RawMessage) ([]Message, error) {
	if isAbsent(raw) {
		return nil, invalidRequest("messages", "missing required parameter: 'messages'")
	}
	if raw[0] != '[' {
		return nil, invalidRequest("messages", "'messages' must be an array of message objects")
	}
	n := countElements(raw)
	if n == 0 {
		return nil, invalidRequest("messages", "'messages' must not be empty")
	}
	msgs := make([]Message, n)
	items := elements{b: raw}
	for i := range msgs {
		item, _ := items.next()
		if item[0] != '{' {
			param := fmt.Sprintf("messages[%d]", i)
			return nil, invalidRequest(param, fmt.Sprintf("'%s' must be an object", param))
		}
		var role, content json.RawMessage
		for m := (members{b: item}); ; {
			key, val, ok := m.next()
			if !ok {
				break
			}
			switch {
			case keyIs(key, "role"):
				role = val
			case keyIs(key, "content"):
				content = val
			}
		}
		r, ok := decodeString(role)
		if !ok || r == "" {
			param := fmt.Sprintf("messages[%d]", i)
			return nil, invalidRequest(param+".role", fmt.Sprintf("'%s.role' must be a non-empty string", param))
		}
		msgs[i].Role = r
		text, err := parseContent(content, i)
		if err != nil {
			return nil, err
		}
		msgs[i].Text = text
	}
	return msgs, nil
}

// parseContent accepts a string, an array of content parts, or null, as the
// content of message i.
func parseContent(raw json.RawMessage, i int) ([]string, error) {
	if isAbsent(raw) {
		return nil, nil
	}
	switch raw[0] {
	case '"':
		s, _ := decodeString(raw)
		return []string{s}, nil
	case '[':
		var text []string
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
			t, ok := decodeString(typ)
			if !ok || t == "" {
				pp := fmt.Sprintf("messages[%d].content[%d]", i, j)
				return nil, invalidRequest(pp, fmt.Sprintf("'%s' must be an object with a string 'type'", pp))
			}
			if t != "text" {
				continue
			}
			s, ok := decodeString(txt)
			if !ok {
				pp := fmt.Sprintf("messages[%d].content[%d]", i, j)
				return nil, invalidRequest(pp+".text", fmt.Sprintf("'%s.text' must be a string", pp))
			}
			text = append(text, s)
		}
		return text, nil
	default:
		param := fmt.Sprintf("messages[%d].content", i)
		return nil, invalidRequest(param, fmt.Sprintf("'%s' must be a string, an array of content parts or null", param))
	}
}

// parsePrompt accepts a string, an array of strings, an array of integers
// or an array of integer arrays; absent is allowed (engines default it).
func parsePrompt(raw json.RawMessage, req *Request) error {
	if isAbsent(raw) {
		return nil
	}
	const msg = "'prompt' must be a string, an array of strings, an array of integers or an array of integer arrays"
	switch raw[0] {
	case '"':
		s, _ := decodeString(raw)
		req.Prompts = []string{s}
		return nil
	case '[':
	default:
		return invalidRequest("prompt", msg)
	}
	n := countElements(raw)
	if n == 0 {
		return invalidRequest("prompt", msg)
	}
	items := elements{b: raw}
	first, _ := items.next()
	switch first[0] {
	case '"':
		req.Prompts = make([]string, 0, n)
		for it, ok := first, true; ok; it, ok = items.next() {
			s, isStr := decodeString(it)
			if !isStr {
				return invalidRequest("prompt", msg)
			}
			req.Prompts = append(req.Prompts, s)
		}
	case '[':
		for it, ok := first, true; ok; it, ok = items.next() {
			if it[0] != '[' || !isTokenArray(it) {
				return invalidRequest("prompt", msg)
			}
		}
		req.PromptTokens = first
	default:
		if !isTokenArray(raw) {
			return invalidRequest("prompt", msg)
		}
		req.PromptTokens = raw
	}
	return nil
}
