package enginesim_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestResponsesAndEmbeddings checks the Responses API and embeddings
// answers: their shapes as the OpenAI clients decode them, token counts
// following max_output_tokens, and the streamed Responses API events in
// order.
func TestResponsesAndEmbeddings(t *testing.T) {
	e := startEngine(t, fastOpts("e-resp"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type response struct {
		ID     string `json:"id"`
		Object string `json:"object"`
		Status string `json:"status"`
		Model  string `json:"model"`
		Output []struct {
			Type    string `json:"type"`
			Role    string `json:"role"`
			Content []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"content"`
		} `json:"output"`
		Usage *struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
	}
	cases := []struct {
		name, body string
		wantOut    int
	}{
		{"string input", `{"model":"llama","input":"Tell me a story."}`, 10},
		{"items and instructions", `{"model":"llama","instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"max_output_tokens":3}`, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := post(ctx, http.DefaultClient, e.URL()+"/v1/responses", []byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var r response
			if err := json.Unmarshal(body, &r); err != nil || resp.StatusCode != 200 {
				t.Fatalf("status %d body %s (%v)", resp.StatusCode, body, err)
			}
			if r.Object != "response" || r.Status != "completed" || r.Model != "llama" || !strings.HasPrefix(r.ID, "resp_") ||
				len(r.Output) != 1 || r.Output[0].Type != "message" || r.Output[0].Role != "assistant" ||
				len(r.Output[0].Content) != 1 || r.Output[0].Content[0].Type != "output_text" || r.Output[0].Content[0].Text == "" ||
				r.Usage == nil || r.Usage.OutputTokens != tc.wantOut || r.Usage.InputTokens < 1 {
				t.Errorf("response %s; want a completed response of %d output tokens", body, tc.wantOut)
			}
		})
	}

	t.Run("streamed", func(t *testing.T) {
		resp, err := post(ctx, http.DefaultClient, e.URL()+"/v1/responses", []byte(`{"model":"llama","input":"hi","stream":true}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("status %d content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		var events []string
		var text strings.Builder
		sc := bufio.NewScanner(resp.Body)
		for event := ""; sc.Scan(); {
			line := sc.Text()
			if ev, ok := strings.CutPrefix(line, "event: "); ok {
				event = ev
				continue
			}
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok {
				continue
			}
			var d struct {
				Type  string `json:"type"`
				Delta string `json:"delta"`
			}
			if err := json.Unmarshal([]byte(data), &d); err != nil || d.Type != event {
				t.Fatalf("event %q data %s: type %q (%v)", event, data, d.Type, err)
			}
			events = append(events, event)
			text.WriteString(d.Delta)
		}
		if len(events) < 3 || events[0] != "response.created" || events[len(events)-1] != "response.completed" {
			t.Fatalf("events %v; want response.created, deltas, response.completed", events)
		}
		for _, ev := range events[1 : len(events)-1] {
			if ev != "response.output_text.delta" {
				t.Errorf("event %q between created and completed", ev)
			}
		}
		if text.String() != "The quick brown fox jumps over the lazy dog. The " {
			t.Errorf("deltas add up to %q", text.String())
		}
	})

	t.Run("embeddings", func(t *testing.T) {
		resp, err := post(ctx, http.DefaultClient, e.URL()+"/v1/embeddings", []byte(`{"model":"llama","input":"The food was delicious","encoding_format":"float"}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var r struct {
			Object string `json:"object"`
			Data   []struct {
				Object    string    `json:"object"`
				Index     int       `json:"index"`
				Embedding []float64 `json:"embedding"`
			} `json:"data"`
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(body, &r); err != nil || resp.StatusCode != 200 || r.Object != "list" || len(r.Data) != 1 ||
			r.Data[0].Object != "embedding" || len(r.Data[0].Embedding) == 0 || r.Usage.PromptTokens < 1 {
			t.Errorf("status %d body %s (%v); want one embedding", resp.StatusCode, body, err)
		}
	})

	for _, bad := range []struct{ path, body string }{
		{"/v1/responses", `{"model":"llama"}`},
		{"/v1/embeddings", `{"model":"llama","input":null}`},
	} {
		resp, err := post(ctx, http.DefaultClient, e.URL()+bad.path, []byte(bad.body))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(body), `"invalid_request_error"`) {
			t.Errorf("%s %s: status %d %s; want 400", bad.path, bad.body, resp.StatusCode, body)
		}
	}
}
