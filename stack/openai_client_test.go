package stack_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/stack"
)

// hfModel is a model id as vLLM serves it and OpenAI clients send it.
const hfModel = "meta-llama/Llama-3.1-8B-Instruct"

// realNamesStack serves hfModel under the alias llama-8b on two simulated
// engines, one of which (e2) serves it under another name, as vLLM started
// with --served-model-name llama does.
const realNamesStack = `
model: meta-llama/Llama-3.1-8B-Instruct
aliases: [llama-8b]
network: {intra_region_ms: 0, inter_region_ms: 0}
sim: {output_tokens: 8, prompt_tokens: 16, base_tbt_ms: 1, tbt_growth_ms: 0.01, prefill_ms_per_token: 0.01}
clusters:
  - {name: A, region: r1, demand_rps: 5}
engines:
  - {name: e1, region: r1, capacity_rps: 200}
  - {name: e2, region: r1, capacity_rps: 200, served_model_name: llama}
`

// TestOpenAIClientRealModelNames runs the official OpenAI Go client
// against a stack whose model id has a slash and dots: chat completions
// plain and streamed, under the id and under an alias, reach both engines
// (each under the name it serves: an engine answers 404 to any other), and
// the models list and get give the id and the alias as they are.
func TestOpenAIClientRealModelNames(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f, err := stack.Parse("real-names", []byte(realNamesStack))
	if err != nil {
		t.Fatal(err)
	}
	s, err := stack.Start(ctx, stack.Options{File: f, DataDir: t.TempDir(), NATSPort: -1, RouterAddr: "127.0.0.1:0", Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	waitSnapshots(t, s, hfModel)
	base := "http://" + s.Routers()[0].Addr() + "/v1/"
	client := openai.NewClient(option.WithBaseURL(base), option.WithAPIKey("unused"), option.WithMaxRetries(0),
		option.WithHTTPClient(&http.Client{Timeout: 10 * time.Second}))

	engines := map[string]int{}
	// At least 16 requests, and on until both engines answered (the
	// optimizer's first plan may put the low demand on one): bounded.
	for i := 0; i < 16 || (engines["e1"] == 0 || engines["e2"] == 0) && i < 400; i++ {
		model := hfModel
		if i%2 == 1 {
			model = "llama-8b"
		}
		var raw *http.Response
		params := openai.ChatCompletionNewParams{Model: model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("hello %d", i))}}
		if i%4 < 2 {
			resp, err := client.Chat.Completions.New(ctx, params, option.WithResponseInto(&raw))
			if err != nil {
				t.Fatalf("chat completion %d (model %q): %v", i, model, err)
			}
			if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" {
				t.Fatalf("chat completion %d: %+v", i, resp)
			}
		} else {
			stream := client.Chat.Completions.NewStreaming(ctx, params, option.WithResponseInto(&raw))
			var acc openai.ChatCompletionAccumulator
			chunks := 0
			for stream.Next() {
				acc.AddChunk(stream.Current())
				chunks++
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("streamed chat completion %d (model %q): %v", i, model, err)
			}
			if chunks < 2 || len(acc.Choices) != 1 || acc.Choices[0].Message.Content == "" {
				t.Fatalf("streamed chat completion %d: %d chunks, %+v", i, chunks, acc.ChatCompletion)
			}
		}
		if raw == nil {
			t.Fatalf("request %d: no HTTP response recorded", i)
		}
		engines[raw.Header.Get(messages.HeaderEngine)]++
	}
	if engines["e1"] == 0 || engines["e2"] == 0 {
		t.Errorf("engines that answered %v; want both (e2 only under its served name)", engines)
	}

	page, err := client.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range page.Data {
		ids = append(ids, m.ID)
	}
	if want := []string{"llama-8b", hfModel}; !slices.Equal(ids, want) {
		t.Errorf("models list %q, want %q", ids, want)
	}
	for _, id := range []string{hfModel, "llama-8b"} {
		m, err := client.Models.Get(ctx, id)
		if err != nil || m.ID != id || m.Object != "model" {
			t.Errorf("models get %q = %+v, %v", id, m, err)
		}
	}
	if _, err := client.Models.Get(ctx, "meta-llama/nope"); err == nil {
		t.Error("models get of an unknown id succeeded")
	}
}
