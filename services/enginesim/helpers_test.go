package enginesim_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/services/enginesim"
)

// fastOpts is a small, quick engine for tests: 10 output tokens, 10 ms TBT.
func fastOpts(name string) enginesim.Options {
	return enginesim.Options{
		Name: name, Model: "llama", Region: "r1",
		MaxBatch: 4, PrefillMsPerToken: 0.02, BaseTBTMs: 10, TBTGrowthMs: 0.5,
		OutputTokens: 10, PromptTokens: 100, Seed: 1,
	}
}

func startEngine(t *testing.T, opts enginesim.Options) *enginesim.Engine {
	t.Helper()
	e, err := enginesim.New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// prompt400 is a 400-byte prompt, 100 tokens by the simulator's estimate.
var prompt400 = strings.Repeat("abcd", 100)

func chatBody(stream bool, maxTokens int) []byte {
	m := map[string]any{
		"model":    "llama",
		"messages": []map[string]any{{"role": "user", "content": prompt400[:396]}},
		"stream":   stream,
	}
	if maxTokens > 0 {
		m["max_tokens"] = maxTokens
	}
	b, _ := json.Marshal(m)
	return b
}

func post(ctx context.Context, client *http.Client, url string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return client.Do(req)
}

// sseEvent is one data line of a server-sent event stream and when it arrived.
type sseEvent struct {
	data string
	at   time.Time
}

func readSSE(t *testing.T, r io.Reader) []sseEvent {
	t.Helper()
	var evs []sseEvent
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("SSE line %q lacks the data: prefix", line)
		}
		evs = append(evs, sseEvent{data: data, at: time.Now()})
	}
	return evs
}

// streamed runs one streaming chat request and returns its events and the time to the first.
func streamed(t *testing.T, ctx context.Context, client *http.Client, url string) ([]sseEvent, time.Duration) {
	t.Helper()
	start := time.Now()
	resp, err := post(ctx, client, url+"/v1/chat/completions", chatBody(true, 0))
	if err != nil {
		t.Errorf("streaming request: %v", err)
		return nil, 0
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("streaming request: status %d", resp.StatusCode)
		return nil, 0
	}
	evs := readSSE(t, resp.Body)
	if len(evs) == 0 {
		t.Errorf("no events")
		return nil, 0
	}
	return evs, evs[0].at.Sub(start)
}

type chunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Delta struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

func decodeChunk(t *testing.T, data []byte) chunk {
	t.Helper()
	var c chunk
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatalf("decode %q: %v", data, err)
	}
	return c
}
