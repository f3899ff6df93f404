package router

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/httpfront"
	"github.com/switchyard-dev/switchyard/services/enginesim"
)

// surfaceModel is the model the OpenAI surface tests serve.
const surfaceModel = "m1"

// serveSimEngines serves a front of kind whose model surfaceModel has two
// enginesim engines, "a" and "b", on loopback sockets.
func serveSimEngines(t *testing.T, kind httpfront.ServerKind) string {
	t.Helper()
	var engines []enginesim.Options
	for _, name := range []string{"a", "b"} {
		engines = append(engines, enginesim.Options{Name: name, MaxBatch: 8, BaseTBTMs: 1, OutputTokens: 4, PromptTokens: 8, Seed: 1})
	}
	tables := simTables(t, surfaceModel, engines...)
	h, err := NewHandler(Options{Tables: tables})
	if err != nil {
		t.Fatal(err)
	}
	return serveFront(t, kind, h, httpfront.ServerOptions{})
}

// call sends method path with body (none when empty) and returns the
// status, the engine that answered and the body.
func call(t *testing.T, c *http.Client, method, url, body string, hdr ...string) (int, string, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	return resp.StatusCode, resp.Header.Get(messages.HeaderEngine), b
}

// TestOpenAISurfaceRoutes sends the request shapes of the OpenAI API
// reference (and vLLM's) for /v1/responses and /v1/embeddings through the
// router to enginesim engines, and checks the answers' shapes.
func TestOpenAISurfaceRoutes(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		base := serveSimEngines(t, kind)
		c := testClient(t)
		cases := []struct {
			name, path, body string
			want             []string // substrings of the answer
		}{
			{"responses string input", "/v1/responses", `{"model":"m1","input":"Tell me a three sentence bedtime story about a unicorn."}`,
				[]string{`"object":"response"`, `"status":"completed"`, `"type":"output_text"`, `"input_tokens"`}},
			{"responses items and instructions", "/v1/responses", `{"model":"m1","instructions":"You are a coding assistant.",` +
				`"input":[{"role":"user","content":[{"type":"input_text","text":"what is in this image?"},{"type":"input_image","image_url":"https://example.com/x.jpg"}]},` +
				`{"type":"function_call_output","call_id":"c1","output":"{}"}],"max_output_tokens":3,"temperature":0.2,"store":false}`,
				[]string{`"object":"response"`, `"output_tokens":3`}},
			{"responses streamed", "/v1/responses", `{"model":"m1","input":"hi","stream":true}`,
				[]string{"event: response.created\n", "event: response.output_text.delta\n", "event: response.completed\n"}},
			{"embeddings string", "/v1/embeddings", `{"model":"m1","input":"The food was delicious and the waiter...","encoding_format":"float"}`,
				[]string{`"object":"list"`, `"object":"embedding"`, `"prompt_tokens"`}},
			{"embeddings batch of token arrays", "/v1/embeddings", `{"model":"m1","input":[[1,2,3],[4,5]],"dimensions":8}`,
				[]string{`"object":"embedding"`}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				status, engine, body := call(t, c, http.MethodPost, base+tc.path, tc.body)
				if status != http.StatusOK || engine == "" {
					t.Fatalf("status %d engine %q, want 200 from an engine: %s", status, engine, body)
				}
				for _, w := range tc.want {
					if !bytes.Contains(body, []byte(w)) {
						t.Errorf("answer lacks %q: %s", w, body)
					}
				}
			})
		}
	})
}

// TestOpenAISurfaceRejects checks that bad requests to the new endpoints
// are answered by the router in the OpenAI error shape, naming the
// parameter.
func TestOpenAISurfaceRejects(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		base := serveSimEngines(t, kind)
		c := testClient(t)
		cases := []struct {
			name, path, body, param string
		}{
			{"responses input number", "/v1/responses", `{"model":"m1","input":3}`, "input"},
			{"responses messages", "/v1/responses", `{"model":"m1","messages":[{"role":"user","content":"x"}]}`, "messages"},
			{"responses bad item", "/v1/responses", `{"model":"m1","input":[{"content":"x"}]}`, "input[0]"},
			{"responses max_output_tokens", "/v1/responses", `{"model":"m1","input":"x","max_output_tokens":0}`, "max_output_tokens"},
			{"responses conversation", "/v1/responses", `{"model":"m1","input":"x","conversation":{"id":7}}`, "conversation"},
			{"embeddings no input", "/v1/embeddings", `{"model":"m1"}`, "input"},
			{"embeddings stream", "/v1/embeddings", `{"model":"m1","input":"x","stream":true}`, "stream"},
			{"embeddings dimensions", "/v1/embeddings", `{"model":"m1","input":"x","dimensions":-1}`, "dimensions"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				status, engine, body := call(t, c, http.MethodPost, base+tc.path, tc.body)
				var e struct {
					Error struct {
						Type  string  `json:"type"`
						Param *string `json:"param"`
					} `json:"error"`
				}
				if err := json.Unmarshal(body, &e); err != nil || status != http.StatusBadRequest || engine != "" ||
					e.Error.Type != "invalid_request_error" || e.Error.Param == nil || *e.Error.Param != tc.param {
					t.Errorf("status %d engine %q body %s; want 400 invalid_request_error on %q from the router", status, engine, body, tc.param)
				}
			})
		}
	})
}

// TestOpenAISurfaceAffinity checks that a Responses API conversation (by
// conversation id, previous_response_id, prompt_cache_key or x-session-id) stays on one
// engine while its input changes, and that embeddings, which reuse no
// cache, are spread over both engines.
func TestOpenAISurfaceAffinity(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		base := serveSimEngines(t, kind)
		c := testClient(t)
		cases := []struct {
			name string
			body func(conv, turn int) string
			hdr  func(conv int) []string
		}{
			{"conversation id", func(conv, turn int) string {
				return fmt.Sprintf(`{"model":"m1","conversation":"conv_%d","input":"turn %d"}`, conv, turn)
			}, func(int) []string { return nil }},
			{"conversation object", func(conv, turn int) string {
				return fmt.Sprintf(`{"model":"m1","conversation":{"id":"conv_%d"},"input":[{"role":"user","content":"turn %d"}]}`, conv, turn)
			}, func(int) []string { return nil }},
			{"previous response id", func(conv, turn int) string {
				return fmt.Sprintf(`{"model":"m1","previous_response_id":"resp_%d","input":"turn %d"}`, conv, turn)
			}, func(int) []string { return nil }},
			{"prompt_cache_key", func(conv, turn int) string {
				return fmt.Sprintf(`{"model":"m1","prompt_cache_key":"k%d","input":"turn %d"}`, conv, turn)
			}, func(int) []string { return nil }},
			{"session header", func(_, turn int) string {
				return fmt.Sprintf(`{"model":"m1","input":"turn %d"}`, turn)
			}, func(conv int) []string { return []string{messages.HeaderSessionID, fmt.Sprintf("s-%d", conv)} }},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				seen := map[string]bool{}
				for conv := range 8 {
					first := ""
					for turn := range 4 {
						status, engine, body := call(t, c, http.MethodPost, base+"/v1/responses", tc.body(conv, turn), tc.hdr(conv)...)
						if status != http.StatusOK {
							t.Fatalf("status %d: %s", status, body)
						}
						if first == "" {
							first = engine
						} else if engine != first {
							t.Fatalf("conversation %d turn %d went to %s, its first turn to %s", conv, turn, engine, first)
						}
					}
					seen[first] = true
				}
				if len(seen) != 2 {
					t.Errorf("8 conversations all went to %v; want both engines used", seen)
				}
			})
		}
		t.Run("embeddings spread", func(t *testing.T) {
			seen := map[string]int{}
			for range 20 {
				status, engine, body := call(t, c, http.MethodPost, base+"/v1/embeddings", `{"model":"m1","input":"same text","user":"u1"}`,
					messages.HeaderSessionID, "s1")
				if status != http.StatusOK {
					t.Fatalf("status %d: %s", status, body)
				}
				seen[engine]++
			}
			if len(seen) != 2 {
				t.Errorf("20 identical embeddings went to %v; want both engines (no affinity)", seen)
			}
		})
	})
}

// TestOpenAISurfaceResponseChains checks that a request continuing a
// response (previous_response_id, the id the engine answered with) goes to
// the engine that made it, which keeps it: 8 chains of 5 turns, each turn
// naming the previous turn's id, streamed and not, over two engines.
func TestOpenAISurfaceResponseChains(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		base := serveSimEngines(t, kind)
		c := testClient(t)
		idOf := regexp.MustCompile(`"id":"(resp_[^"]+)"`)
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
				seen := map[string]bool{}
				for chain := range 8 {
					prev, first := "", ""
					for turn := range 5 {
						body := fmt.Sprintf(`{"model":"m1","input":"chain %d turn %d","stream":%v}`, chain, turn, stream)
						if prev != "" {
							body = fmt.Sprintf(`{"model":"m1","previous_response_id":%q,"input":"turn %d","stream":%v}`, prev, turn, stream)
						}
						status, engine, answer := call(t, c, http.MethodPost, base+"/v1/responses", body)
						m := idOf.FindSubmatch(answer)
						if status != http.StatusOK || m == nil {
							t.Fatalf("status %d answer %s", status, answer)
						}
						if first == "" {
							first = engine
						} else if engine != first {
							t.Fatalf("chain %d turn %d (previous_response_id %s) went to %s; the response was made on %s", chain, turn, prev, engine, first)
						}
						prev = string(m[1])
					}
					seen[first] = true
				}
				if len(seen) != 2 {
					t.Errorf("8 chains all started on %v; want both engines used", seen)
				}
			})
		}
	})
}

// TestOpenAISurfaceModelsAndNotFound checks GET /v1/models/{id}, the
// created time of the models list, and the OpenAI-shaped 404 of every
// other path.
func TestOpenAISurfaceModelsAndNotFound(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		base := serveSimEngines(t, kind)
		c := testClient(t)
		before := time.Now().Unix()
		status, _, body := call(t, c, http.MethodGet, base+"/v1/models", "")
		var list struct {
			Data []modelEntry `json:"data"`
		}
		if err := json.Unmarshal(body, &list); err != nil || status != http.StatusOK || len(list.Data) != 1 {
			t.Fatalf("GET /v1/models: status %d %s", status, body)
		}
		if m := list.Data[0]; m.ID != surfaceModel || m.Created < before-1 || m.Created > time.Now().Unix() {
			t.Errorf("models list entry %+v; want id %s created about now", m, surfaceModel)
		}
		for range 2 { // the same object, created unchanged, each time
			status, _, body := call(t, c, http.MethodGet, base+"/v1/models/"+surfaceModel, "")
			var m modelEntry
			if err := json.Unmarshal(body, &m); err != nil || status != http.StatusOK || m != list.Data[0] {
				t.Errorf("GET /v1/models/%s: status %d %s; want %+v", surfaceModel, status, body, list.Data[0])
			}
		}
		cases := []struct {
			name, method, path, typ, code string
			status                        int
		}{
			{"unknown model", http.MethodGet, "/v1/models/nope", "invalid_request_error", "model_not_found", 404},
			{"models slash", http.MethodGet, "/v1/models/", "invalid_request_error", "model_not_found", 404},
			{"model post", http.MethodPost, "/v1/models/" + surfaceModel, "invalid_request_error", "method_not_allowed", 405},
			{"unknown v1 path", http.MethodPost, "/v1/audio/speech", "not_found_error", "not_found", 404},
			{"unknown root path", http.MethodGet, "/nothing/here", "not_found_error", "not_found", 404},
			{"files", http.MethodGet, "/v1/files", "not_found_error", "not_found", 404},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				status, _, body := call(t, c, tc.method, base+tc.path, "")
				var e struct {
					Error struct {
						Message string  `json:"message"`
						Type    string  `json:"type"`
						Code    *string `json:"code"`
					} `json:"error"`
				}
				if err := json.Unmarshal(body, &e); err != nil || status != tc.status || e.Error.Type != tc.typ ||
					e.Error.Code == nil || *e.Error.Code != tc.code || e.Error.Message == "" {
					t.Errorf("%s %s: status %d %s; want %d %s/%s", tc.method, tc.path, status, body, tc.status, tc.typ, tc.code)
				}
			})
		}
	})
}
