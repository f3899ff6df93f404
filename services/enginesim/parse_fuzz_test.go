package enginesim

import (
	"encoding/json"
	"testing"
)

// FuzzParse feeds request bodies to the simulator's request parser, the code
// its HTTP and NATS inference handlers run on every request: a bad body must
// yield a 400 or 404 OpenAI error, a good one a job within the engine's
// limits whose answers render as JSON.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"model":"llama","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"llama","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"llama","prompt":"hello","max_tokens":3}`,
		`{"model":"llama","prompt":[1,2,3],"max_completion_tokens":0}`,
		`{"model":"other","prompt":"x"}`,
		`{"messages":null,"prompt":null}`,
		`{"model":"llama","max_tokens":-1,"prompt":"x"}`,
		`{"model":"llama","max_tokens":1e999,"prompt":"x"}`,
		`{"model":"llama","input":"hi","instructions":"be brief","max_output_tokens":2}`,
		`{"model":"llama","input":[{"role":"user","content":"x"}],"stream":true}`,
		`{"model":"llama","input":[[1,2],[3]]}`,
		`[]`, `null`, `{`, "\xdd\x7f\xff\xff\xff",
	} {
		f.Add([]byte(s))
	}
	e, err := New(Options{Name: "e1", Model: "llama", MaxBatch: 4, BaseTBTMs: 10, OutputTokens: 10, PromptTokens: 100, Seed: 1})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, ep := range []endpoint{endpointOf(body), chatEndpoint, completionEndpoint, responsesEndpoint, embeddingsEndpoint} {
			j := e.parse(ep, body)
			if j.err != nil {
				if (j.err.Status != 400 && j.err.Status != 404) || j.err.Message == "" {
					t.Fatalf("error %+v, want a 400 or 404 with a message", j.err)
				}
				var out struct {
					Error struct {
						Message string `json:"message"`
					} `json:"error"`
				}
				if err := json.Unmarshal(j.err.body(), &out); err != nil || out.Error.Message == "" {
					t.Fatalf("error body %q is not an OpenAI error (%v)", j.err.body(), err)
				}
				continue
			}
			if !json.Valid(body) {
				t.Fatalf("accepted invalid JSON %q", body)
			}
			if j.prompt < 1 || j.maxOut < 1 || j.maxOut > j.fullOut {
				t.Fatalf("job with prompt %d, max out %d of %d", j.prompt, j.maxOut, j.fullOut)
			}
			for _, out := range [][]byte{j.full(j.maxOut), j.chunk(0, j.maxOut, "stop", j.usage(j.maxOut)), j.usageChunk(j.maxOut)} {
				if !json.Valid(out) {
					t.Fatalf("answer %q is not JSON", out)
				}
			}
		}
	})
}
