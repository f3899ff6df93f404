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

type rawRequest struct {
	Model    json.RawMessage `json:"model"`
	Stream   json.RawMessage `json:"stream"`
	User     json.RawMessage `json:"user"`
	Messages json.RawMessage `json:"messages"`
	Prompt   json.RawMessage `json:"prompt"`
}

type rawMessage struct {
	Role    json.RawMessage `json:"role"`
	Content json.RawMessage `json:"content"`
}

type rawPart struct {
	Type json.RawMessage `json:"type"`
	Text json.RawMessage `json:"text"`
}

// ParseRequest parses body as a request to endpoint, strictly enough to
// reject what no engine would accept: malformed JSON, a body that is not an
// object, a missing or non-string model, a non-boolean stream, a non-string
// user, chat messages that are not a non-empty array of {role, content}
// objects with string, array-of-parts or null content, or a prompt that is
// not a string, array of strings, array of integers or array of integer
// arrays. Errors are *APIError with status 400. body is kept, not copied.
func ParseRequest(endpoint Endpoint, body []byte) (*Request, error) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, invalidRequest("", "request body must be a JSON object")
	}
	var raw rawRequest
	if err := json.Unmarshal(trimmed, &raw); err != nil {
		return nil, invalidRequest("", fmt.Sprintf("malformed JSON body: %v", err))
	}
	req := &Request{Endpoint: endpoint, Body: body}
	if isAbsent(raw.Model) {
		return nil, invalidRequest("model", "missing required parameter: 'model'")
	}
	if err := json.Unmarshal(raw.Model, &req.Model); err != nil || !isString(raw.Model) {
		return nil, invalidRequest("model", "'model' must be a string")
	}
	if req.Model == "" || len(req.Model) > maxModelLen {
		return nil, invalidRequest("model", fmt.Sprintf("'model' must be 1 to %d characters", maxModelLen))
	}
	if !isAbsent(raw.Stream) {
		if err := json.Unmarshal(raw.Stream, &req.Stream); err != nil {
			return nil, invalidRequest("stream", "'stream' must be a boolean")
		}
	}
	if !isAbsent(raw.User) {
		if !isString(raw.User) || json.Unmarshal(raw.User, &req.User) != nil {
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

func isString(raw json.RawMessage) bool { return len(raw) > 0 && raw[0] == '"' }

func parseMessages(raw json.RawMessage) ([]Message, error) {
	if isAbsent(raw) {
		return nil, invalidRequest("messages", "missing required parameter: 'messages'")
	}
	var items []json.RawMessage
	if raw[0] != '[' || json.Unmarshal(raw, &items) != nil {
		return nil, invalidRequest("messages", "'messages' must be an array of message objects")
	}
	if len(items) == 0 {
		return nil, invalidRequest("messages", "'messages' must not be empty")
	}
	msgs := make([]Message, len(items))
	for i, item := range items {
		param := fmt.Sprintf("messages[%d]", i)
		var rm rawMessage
		if len(item) == 0 || item[0] != '{' || json.Unmarshal(item, &rm) != nil {
			return nil, invalidRequest(param, fmt.Sprintf("'%s' must be an object", param))
		}
		if !isString(rm.Role) || json.Unmarshal(rm.Role, &msgs[i].Role) != nil || msgs[i].Role == "" {
			return nil, invalidRequest(param+".role", fmt.Sprintf("'%s.role' must be a non-empty string", param))
		}
		text, err := parseContent(rm.Content, param+".content")
		if err != nil {
			return nil, err
		}
		msgs[i].Text = text
	}
	return msgs, nil
}

// parseContent accepts a string, an array of content parts, or null.
func parseContent(raw json.RawMessage, param string) ([]string, error) {
	if isAbsent(raw) {
		return nil, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, invalidRequest(param, fmt.Sprintf("'%s' is not a valid string: %v", param, err))
		}
		return []string{s}, nil
	case '[':
		var parts []json.RawMessage
		if err := json.Unmarshal(raw, &parts); err != nil {
			return nil, invalidRequest(param, fmt.Sprintf("'%s' must be an array of content parts", param))
		}
		var text []string
		for j, p := range parts {
			pp := fmt.Sprintf("%s[%d]", param, j)
			var rp rawPart
			var typ string
			if len(p) == 0 || p[0] != '{' || json.Unmarshal(p, &rp) != nil ||
				!isString(rp.Type) || json.Unmarshal(rp.Type, &typ) != nil || typ == "" {
				return nil, invalidRequest(pp, fmt.Sprintf("'%s' must be an object with a string 'type'", pp))
			}
			if typ != "text" {
				continue
			}
			var s string
			if !isString(rp.Text) || json.Unmarshal(rp.Text, &s) != nil {
				return nil, invalidRequest(pp+".text", fmt.Sprintf("'%s.text' must be a string", pp))
			}
			text = append(text, s)
		}
		return text, nil
	default:
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
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return invalidRequest("prompt", msg)
		}
		req.Prompts = []string{s}
		return nil
	case '[':
	default:
		return invalidRequest("prompt", msg)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || len(items) == 0 {
		return invalidRequest("prompt", msg)
	}
	switch items[0][0] {
	case '"':
		req.Prompts = make([]string, len(items))
		for i, it := range items {
			if !isString(it) || json.Unmarshal(it, &req.Prompts[i]) != nil {
				return invalidRequest("prompt", msg)
			}
		}
	case '[':
		for _, it := range items {
			var toks []int64
			if it[0] != '[' || json.Unmarshal(it, &toks) != nil || len(toks) == 0 {
				return invalidRequest("prompt", msg)
			}
		}
		req.PromptTokens = items[0]
	default:
		var toks []int64
		if err := json.Unmarshal(raw, &toks); err != nil {
			return invalidRequest("prompt", msg)
		}
		req.PromptTokens = raw
	}
	return nil
}
