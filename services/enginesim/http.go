package enginesim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/switchyard-dev/switchyard/messages"
)

// maxBody bounds an inference request body.
const maxBody = 4 << 20

// apiError is an OpenAI-style error with an HTTP-like status.
type apiError struct {
	Status  int    `json:"-"`
	Message string `json:"message"`
	Type    string `json:"type"`
	Param   any    `json:"param"`
	Code    string `json:"code"`
}

func (a *apiError) Error() string { return fmt.Sprintf("%d %s: %s", a.Status, a.Code, a.Message) }

func (a *apiError) body() []byte {
	b, _ := json.Marshal(struct {
		Error *apiError `json:"error"`
	}{a})
	return b
}

func errUnavailable(msg string) *apiError {
	return &apiError{Status: 503, Type: "server_error", Code: "unavailable", Message: msg}
}

type endpoint int

const (
	chatEndpoint endpoint = iota
	completionEndpoint
	// responsesEndpoint is the Responses API (POST /v1/responses).
	responsesEndpoint
	// embeddingsEndpoint is POST /v1/embeddings: a prefill of one step, no text.
	embeddingsEndpoint
)

// apiRequest holds the fields of an OpenAI request the simulator uses; others are ignored.
type apiRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	Input               json.RawMessage `json:"input"`        // responses and embeddings
	Instructions        string          `json:"instructions"` // responses
	MaxOutputTokens     *int            `json:"max_output_tokens"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// job is a parsed inference request; err, when set, is answered after failure
// injection has had its say.
type job struct {
	ep           endpoint
	id           string
	created      int64
	model        string
	stream       bool
	includeUsage bool
	prompt       int
	tokens       []uint32 // the prompt's token ids, when the engine keeps a prefix cache
	maxOut       int
	fullOut      int // the engine's OutputTokens
	err          *apiError
}

// estimateTokens is the simulator's tokenizer: four bytes a token, at least one.
func estimateTokens(n int) int { return max(1, (n+3)/4) }

func rawLen(raw json.RawMessage) int {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return len(s)
	}
	return len(raw)
}

// parse reads an OpenAI request for ep; a bad request yields a job with err set.
func (e *Engine) parse(ep endpoint, body []byte) *job {
	e.mu.Lock()
	e.nextID++
	n := e.nextID
	e.mu.Unlock()
	j := &job{ep: ep, created: time.Now().Unix(), model: e.opts.servedName(), maxOut: e.opts.OutputTokens, fullOut: e.opts.OutputTokens}
	prefix := [...]string{chatEndpoint: "chatcmpl-", completionEndpoint: "cmpl-", responsesEndpoint: "resp_", embeddingsEndpoint: "embd-"}[ep]
	j.id = prefix + e.opts.Name + "-" + strconv.FormatUint(n, 10)
	bad := func(format string, args ...any) *job {
		j.err = &apiError{Status: 400, Type: "invalid_request_error", Code: "invalid_request", Message: fmt.Sprintf(format, args...)}
		return j
	}
	var req apiRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return bad("request body is not a valid JSON request: %v", err)
	}
	if req.Model != "" && req.Model != e.opts.servedName() {
		j.err = &apiError{Status: 404, Type: "invalid_request_error", Code: "model_not_found",
			Message: fmt.Sprintf("the model %q is not served by engine %s (it serves %q)", req.Model, e.opts.Name, e.opts.servedName())}
		return j
	}
	size := 0
	switch ep {
	case chatEndpoint:
		if len(req.Messages) == 0 {
			return bad("messages is missing or empty")
		}
		for _, m := range req.Messages {
			size += len(m.Role) + rawLen(m.Content)
		}
	case completionEndpoint:
		if len(req.Prompt) == 0 || string(req.Prompt) == "null" {
			return bad("prompt is missing")
		}
		size = rawLen(req.Prompt)
	case responsesEndpoint:
		if isNull(req.Input) && req.Instructions == "" {
			return bad("input is missing")
		}
		size = len(req.Instructions) + rawLen(req.Input)
		req.MaxTokens = req.MaxOutputTokens
	case embeddingsEndpoint:
		if isNull(req.Input) {
			return bad("input is missing")
		}
		size = rawLen(req.Input)
		req.Stream, req.MaxTokens, req.MaxCompletionTokens = false, nil, nil
		j.maxOut, j.fullOut = 1, 1
	}
	j.prompt = estimateTokens(size)
	if e.kv != nil {
		var ids []uint32
		if ep == completionEndpoint && json.Unmarshal(req.Prompt, &ids) == nil {
			// A prompt of token ids is cached as given, as vLLM does.
			j.tokens = ids
		} else {
			j.tokens = Tokenize(promptText(&req, ep))
		}
	}
	limit := req.MaxTokens
	if req.MaxCompletionTokens != nil {
		limit = req.MaxCompletionTokens
	}
	if limit != nil {
		if *limit < 1 {
			return bad("max_tokens is %d, want >= 1", *limit)
		}
		j.maxOut = min(j.maxOut, *limit)
	}
	j.stream = req.Stream
	j.includeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	return j
}

func isNull(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

// endpointOf tells a chat request from a completion request by its body, for NATS.
func endpointOf(body []byte) endpoint {
	var probe struct {
		Messages json.RawMessage `json:"messages"`
	}
	if json.Unmarshal(body, &probe) == nil && len(probe.Messages) > 0 && string(probe.Messages) != "null" {
		return chatEndpoint
	}
	return completionEndpoint
}

// vocabulary is the simulator's output: token i is its word i mod 9, with the
// space that follows it.
const vocabulary = "The quick brown fox jumps over the lazy dog. "

// wordEnds holds the end offset (after the space) of each vocabulary word.
const wordEnds = "\x04\x0a\x10\x14\x1a\x1f\x23\x28\x2d"

func tokenText(from, to int) string {
	var b strings.Builder
	for i := from; i < to; i++ {
		w := i % len(wordEnds)
		start := 0
		if w > 0 {
			start = int(wordEnds[w-1])
		}
		b.WriteString(vocabulary[start:wordEnds[w]])
	}
	return b.String()
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type chatMessage struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content,omitempty"`
}

type choice struct {
	Index        int          `json:"index"`
	Delta        *chatMessage `json:"delta,omitempty"`
	Message      *chatMessage `json:"message,omitempty"`
	Text         *string      `json:"text,omitempty"`
	FinishReason *string      `json:"finish_reason"`
}

type completion struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"`
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Choices []choice `json:"choices"`
	Usage   *usage   `json:"usage,omitempty"`
}

func (j *job) usage(generated int) *usage {
	return &usage{PromptTokens: j.prompt, CompletionTokens: generated, TotalTokens: j.prompt + generated}
}

// finishReason is "length" when max_tokens cut the answer short, else "stop".
func (j *job) finishReason() string {
	if j.maxOut < j.fullOut {
		return "length"
	}
	return "stop"
}

// chunk renders one streaming chunk: text for tokens [from, to), or, with
// finish set, the closing chunk with the finish reason (and usage when u is set).
func (j *job) chunk(from, to int, finish string, u *usage) []byte {
	c := completion{ID: j.id, Created: j.created, Model: j.model, Usage: u}
	ch := choice{}
	if finish != "" {
		ch.FinishReason = &finish
	}
	text := tokenText(from, to)
	if j.ep == chatEndpoint {
		c.Object = "chat.completion.chunk"
		ch.Delta = &chatMessage{Content: text}
		if from == 0 && to > 0 {
			ch.Delta.Role = "assistant"
		}
	} else {
		c.Object = "text_completion"
		ch.Text = &text
	}
	c.Choices = []choice{ch}
	b, _ := json.Marshal(c)
	return b
}

// usageChunk is the extra chunk OpenAI sends with stream_options.include_usage.
func (j *job) usageChunk(generated int) []byte {
	c := completion{ID: j.id, Created: j.created, Model: j.model, Choices: []choice{}, Usage: j.usage(generated)}
	c.Object = "chat.completion.chunk"
	if j.ep == completionEndpoint {
		c.Object = "text_completion"
	}
	b, _ := json.Marshal(c)
	return b
}

// full renders the non-streaming response.
func (j *job) full(generated int) []byte {
	switch j.ep {
	case responsesEndpoint:
		b, _ := json.Marshal(j.response("completed", generated))
		return b
	case embeddingsEndpoint:
		return j.embedding()
	}
	finish := j.finishReason()
	c := completion{ID: j.id, Created: j.created, Model: j.model, Usage: j.usage(generated)}
	text := tokenText(0, generated)
	ch := choice{FinishReason: &finish}
	if j.ep == chatEndpoint {
		c.Object = "chat.completion"
		ch.Message = &chatMessage{Role: "assistant", Content: text}
	} else {
		c.Object = "text_completion"
		ch.Text = &text
	}
	c.Choices = []choice{ch}
	b, _ := json.Marshal(c)
	return b
}

func (e *Engine) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", e.inferHTTP(chatEndpoint))
	mux.HandleFunc("POST /v1/completions", e.inferHTTP(completionEndpoint))
	mux.HandleFunc("POST /v1/responses", e.inferHTTP(responsesEndpoint))
	mux.HandleFunc("POST /v1/embeddings", e.inferHTTP(embeddingsEndpoint))
	mux.HandleFunc("GET /v1/models", e.models)
	e.observeRoutes(mux)
	return e.tag(mux)
}

// observeRoutes adds what a real engine serves beside inference, and an
// agent scrapes there: health and metrics.
func (e *Engine) observeRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /healthz", e.healthz)
	mux.HandleFunc("GET /health", e.healthz) // the path vLLM, SGLang, TGI and llama.cpp serve
	mux.Handle("GET /metrics", promhttp.HandlerFor(e.metrics.reg, promhttp.HandlerOpts{}))
}

// adminRoutes is the admin listener's (Options.AdminListen): health,
// metrics and failure injection. Injection is never on the inference
// port, where any client of the engine could reach it.
func (e *Engine) adminRoutes() http.Handler {
	mux := http.NewServeMux()
	e.observeRoutes(mux)
	mux.HandleFunc("GET /admin/failure", e.getFailure)
	mux.HandleFunc("POST /admin/failure", e.postFailure)
	return e.tag(mux)
}

// tag sets the engine header on every response.
func (e *Engine) tag(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(messages.NATSHeaderEngine, e.opts.Name)
		h.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func (e *Engine) models(w http.ResponseWriter, _ *http.Request) {
	e.mu.Lock()
	start := e.stats.start
	e.mu.Unlock()
	b, _ := json.Marshal(map[string]any{"object": "list", "data": []map[string]any{{
		"id": e.opts.servedName(), "object": "model", "created": start.Unix(), "owned_by": "switchyard-enginesim",
	}}})
	writeJSON(w, http.StatusOK, b)
}

func (e *Engine) healthz(w http.ResponseWriter, _ *http.Request) {
	e.mu.Lock()
	f := e.failure
	e.mu.Unlock()
	status, code := "ok", http.StatusOK
	if f.Crashed {
		status, code = "crashed", http.StatusServiceUnavailable
	}
	b, _ := json.Marshal(map[string]any{"status": status, "engine": e.opts.Name, "model": e.opts.Model, "health": f.health()})
	writeJSON(w, code, b)
}

func (e *Engine) getFailure(w http.ResponseWriter, _ *http.Request) {
	b, _ := json.Marshal(e.Failure())
	writeJSON(w, http.StatusOK, b)
}

// postFailure merges the JSON object in the body into the current failure injection.
func (e *Engine) postFailure(w http.ResponseWriter, r *http.Request) {
	f := e.Failure()
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		a := &apiError{Status: 400, Type: "invalid_request_error", Code: "invalid_failure", Message: "failure JSON: " + err.Error()}
		writeJSON(w, a.Status, a.body())
		return
	}
	if err := e.SetFailure(f); err != nil {
		a := &apiError{Status: 400, Type: "invalid_request_error", Code: "invalid_failure", Message: err.Error()}
		writeJSON(w, a.Status, a.body())
		return
	}
	b, _ := json.Marshal(e.Failure())
	writeJSON(w, http.StatusOK, b)
}

func (e *Engine) inferHTTP(ep endpoint) http.HandlerFunc {
	return func(w http.ResponseWriter, hr *http.Request) {
		ctx := hr.Context()
		body, err := io.ReadAll(http.MaxBytesReader(w, hr.Body, maxBody))
		var j *job
		if err != nil {
			j = &job{err: &apiError{Status: 400, Type: "invalid_request_error", Code: "invalid_request", Message: "read request body: " + err.Error()}}
		} else {
			j = e.parse(ep, body)
		}
		r, err := e.admit(ctx, j)
		if err != nil {
			var a *apiError
			if errors.As(err, &a) {
				writeJSON(w, a.Status, a.body())
			}
			return // crashed or client gone: nothing to say
		}
		if !j.stream {
			err := e.wait(ctx, r, nil)
			e.outcome(err)
			if err != nil {
				if errors.Is(err, errClosing) {
					a := errUnavailable("engine " + e.opts.Name + " is shutting down")
					writeJSON(w, a.Status, a.body())
				}
				return
			}
			writeJSON(w, http.StatusOK, j.full(j.maxOut))
			return
		}
		rc := http.NewResponseController(w)
		started := false
		var buf bytes.Buffer
		send := func(event string, data []byte) error {
			if !started {
				// Headers go with the first token, so time to first byte is TTFT.
				h := w.Header()
				h.Set("Content-Type", "text/event-stream")
				h.Set("Cache-Control", "no-cache")
				w.WriteHeader(http.StatusOK)
				started = true
			}
			buf.Reset()
			if event != "" {
				buf.WriteString("event: ")
				buf.WriteString(event)
				buf.WriteByte('\n')
			}
			buf.WriteString("data: ")
			buf.Write(data)
			buf.WriteString("\n\n")
			if _, err := w.Write(buf.Bytes()); err != nil {
				return err
			}
			return rc.Flush()
		}
		emit := func(from, to int) error { return send("", j.chunk(from, to, "", nil)) }
		if j.ep == responsesEndpoint {
			emit = j.responseEvents(send)
		}
		err = e.wait(ctx, r, emit)
		e.outcome(err)
		if err != nil {
			if errors.Is(err, errClosing) && !started {
				a := errUnavailable("engine " + e.opts.Name + " is shutting down")
				writeJSON(w, a.Status, a.body())
			}
			return
		}
		if j.ep == responsesEndpoint {
			_ = j.responseDone(send)
			return
		}
		if send("", j.chunk(j.maxOut, j.maxOut, j.finishReason(), nil)) != nil {
			return
		}
		if j.includeUsage && send("", j.usageChunk(j.maxOut)) != nil {
			return
		}
		_ = send("", []byte("[DONE]"))
	}
}
