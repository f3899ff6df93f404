package protocol

import "testing"

// BenchmarkParseRequest parses a typical chat request: a system prompt, a
// short conversation and the usual sampling parameters.
func BenchmarkParseRequest(b *testing.B) {
	body := []byte(`{"model":"meta-llama/Llama-3.1-8B-Instruct","stream":true,"max_tokens":256,"temperature":0.7,"top_p":0.95,"n":1,` +
		`"messages":[{"role":"system","content":"You are a helpful assistant. Answer briefly and cite your sources."},` +
		`{"role":"user","content":"What is the capital of France?"},{"role":"assistant","content":"Paris."},` +
		`{"role":"user","content":[{"type":"text","text":"And of Germany?"}]}]}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for i := 0; i < b.N; i++ {
		if _, err := ParseRequest(EndpointChat, body); err != nil {
			b.Fatal(err)
		}
	}
}
