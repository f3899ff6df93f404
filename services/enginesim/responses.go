package enginesim

import "encoding/json"

// The Responses API and embeddings answers, in the shapes vLLM and OpenAI
// give them: enough for clients and the router's tests, not the whole
// Responses API (no tools, no stored responses).

// responseText is an output_text content part.
type responseText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

// responseItem is a message output item.
type responseItem struct {
	Type    string         `json:"type"`
	ID      string         `json:"id"`
	Status  string         `json:"status"`
	Role    string         `json:"role"`
	Content []responseText `json:"content"`
}

// responseUsage is the Responses API usage.
type responseUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

// responseObject is a Responses API response object.
type responseObject struct {
	ID        string         `json:"id"`
	Object    string         `json:"object"`
	CreatedAt int64          `json:"created_at"`
	Model     string         `json:"model"`
	Status    string         `json:"status"`
	Output    []responseItem `json:"output"`
	Usage     *responseUsage `json:"usage"`
}

// itemID is the id of the job's one output message.
func (j *job) itemID() string { return "msg_" + j.id }

// response renders the job's response object with status after generated
// tokens (no output while in progress).
func (j *job) response(status string, generated int) responseObject {
	o := responseObject{ID: j.id, Object: "response", CreatedAt: j.created, Model: j.model, Status: status, Output: []responseItem{}}
	if status == "completed" {
		o.Output = append(o.Output, responseItem{Type: "message", ID: j.itemID(), Status: "completed", Role: "assistant",
			Content: []responseText{{Type: "output_text", Text: tokenText(0, generated), Annotations: []any{}}}})
		o.Usage = &responseUsage{InputTokens: j.prompt, OutputTokens: generated, TotalTokens: j.prompt + generated}
	}
	return o
}

// responseEvents returns the token emitter of a streamed response: a
// response.created event before the first tokens, then one
// response.output_text.delta event per step.
func (j *job) responseEvents(send func(event string, data []byte) error) func(from, to int) error {
	return func(from, to int) error {
		if from == 0 {
			b, _ := json.Marshal(map[string]any{"type": "response.created", "sequence_number": 0, "response": j.response("in_progress", 0)})
			if err := send("response.created", b); err != nil {
				return err
			}
		}
		b, _ := json.Marshal(map[string]any{"type": "response.output_text.delta", "sequence_number": to, "item_id": j.itemID(),
			"output_index": 0, "content_index": 0, "delta": tokenText(from, to)})
		return send("response.output_text.delta", b)
	}
}

// responseDone sends the closing response.completed event.
func (j *job) responseDone(send func(event string, data []byte) error) error {
	b, _ := json.Marshal(map[string]any{"type": "response.completed", "sequence_number": j.maxOut + 1, "response": j.response("completed", j.maxOut)})
	return send("response.completed", b)
}

// embeddingDims is the length of the simulator's embeddings: small, as
// nothing reads their values.
const embeddingDims = 8

// embedding renders an embeddings answer: one vector for the request
// (derived from its id, so answers differ), OpenAI's list shape.
func (j *job) embedding() []byte {
	vec := make([]float64, embeddingDims)
	seed := uint64(len(j.id))
	for _, c := range j.id {
		seed = seed*31 + uint64(c)
	}
	for i := range vec {
		seed = seed*6364136223846793005 + 1442695040888963407
		vec[i] = float64(seed>>40)/float64(1<<24)*2 - 1
	}
	b, _ := json.Marshal(map[string]any{"object": "list", "model": j.model,
		"data":  []map[string]any{{"object": "embedding", "index": 0, "embedding": vec}},
		"usage": map[string]int{"prompt_tokens": j.prompt, "total_tokens": j.prompt}})
	return b
}
