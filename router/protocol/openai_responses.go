package protocol

import (
	"bytes"
	"encoding/json"
)

// parseResponses reads a Responses API request (POST /v1/responses): input
// a string or an array of input items (objects; a message item has a
// non-empty string role and a string, array-of-parts or null content, other
// items a string type), instructions a string, previous_response_id a
// string, conversation a string or an object with a string id. Absent
// input is allowed (a request may continue a stored response with
// previous_response_id alone). It keeps what the affinity key reads:
// instructions as the system message, the first system (or developer) and
// first other input message, or the string input as Prompts.
func parseResponses(raw *rawRequest, req *Request) error {
	if !isAbsent(raw.Messages) {
		return InvalidRequest("messages", "'messages' is not a responses parameter; use 'input'")
	}
	if !isAbsent(raw.Instructions) {
		if raw.Instructions[0] != '"' {
			return InvalidRequest("instructions", "'instructions' must be a string")
		}
		s, _ := textPrefix(raw.Instructions, MaxPrefixBytes)
		req.Messages = append(req.kept[:0], Message{Role: "system", Text: []string{s}})
		req.Instructions = raw.Instructions
	}
	if !isAbsent(raw.PrevResp) {
		var ok bool
		if req.PreviousResponseID, ok = decodeString(raw.PrevResp); !ok || req.PreviousResponseID == "" {
			return InvalidRequest("previous_response_id", "'previous_response_id' must be a non-empty string")
		}
	}
	if err := parseConversation(raw.Conv, req); err != nil {
		return err
	}
	if isAbsent(raw.Input) {
		return nil
	}
	req.Context = raw.Input
	switch raw.Input[0] {
	case '"':
		s, _ := textPrefix(raw.Input, MaxPrefixBytes)
		req.Prompts = []string{s}
		return nil
	case '[':
	default:
		return InvalidRequest("input", "'input' must be a string or an array of input items")
	}
	if req.Messages == nil {
		req.Messages = req.kept[:0]
	}
	msgs, _, err := scanMessages(raw.Input, "input", req.Messages)
	req.Messages = msgs
	return err
}

// maxResponseIDLen bounds a response id ResponseID accepts: ids are some
// 30 to 60 characters; a longer value is no id.
const maxResponseIDLen = 256

// ResponseID returns the id of a Responses API answer from its first
// bytes: the value of the first "id" member, which is the response's own
// in both forms an engine answers with (a response object, whose first
// member is its id, and a stream, whose first event, response.created,
// carries the response object). A quote inside a JSON string is escaped,
// so the first unescaped "id" followed by a colon is a member name. ok is
// false when b holds no complete id.
func ResponseID(b []byte) (string, bool) {
	for i := 0; i+4 < len(b); i++ {
		j := bytes.Index(b[i:], []byte(`"id"`))
		if j < 0 {
			return "", false
		}
		i += j
		if i > 0 && b[i-1] == '\\' {
			continue
		}
		k := skipWS(b, i+4)
		if k >= len(b) || b[k] != ':' {
			continue
		}
		k = skipWS(b, k+1)
		if k >= len(b) || b[k] != '"' {
			return "", false
		}
		end := stringEnd(b, k)
		if end > len(b) || end-k < 3 || b[end-1] != '"' || end-k > maxResponseIDLen+2 {
			return "", false
		}
		return decodeString(b[k:end])
	}
	return "", false
}

// parseConversation reads the Responses API conversation: a non-empty
// string id or an object with one.
func parseConversation(raw json.RawMessage, req *Request) error {
	if isAbsent(raw) {
		return nil
	}
	const msg = "'conversation' must be a non-empty string id or an object with one"
	id := raw
	if raw[0] == '{' {
		id = nil
		for m := (members{b: raw}); ; {
			key, val, ok := m.next()
			if !ok {
				break
			}
			if keyIs(key, "id") {
				id = val
			}
		}
	}
	s, ok := decodeString(id)
	if !ok || s == "" {
		return InvalidRequest("conversation", msg)
	}
	req.Conversation = s
	return nil
}

// parseEmbeddings reads an embeddings request (POST /v1/embeddings): input
// is required and has the forms of a completions prompt; vLLM's chat form
// (messages instead of input) is accepted too. An embeddings answer is not
// streamed, so stream true is refused.
func parseEmbeddings(raw *rawRequest, req *Request) error {
	if req.Stream {
		return InvalidRequest("stream", "'stream' is not an embeddings parameter")
	}
	if isAbsent(raw.Input) {
		if isAbsent(raw.Messages) {
			return InvalidRequest("input", "missing required parameter: 'input'")
		}
		msgs, err := parseMessages(raw.Messages, req.kept[:0])
		req.Messages = msgs
		return err
	}
	return parseTexts(raw.Input, req, "input")
}
