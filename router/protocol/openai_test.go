package protocol

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

func TestParseRequest(t *testing.T) {
	cases := []struct {
		name      string
		ep        Endpoint
		body      string
		wantErr   bool
		wantParam string
		check     func(*testing.T, *Request)
	}{
		{name: "chat", ep: EndpointChat, body: `{"model":"m","stream":true,"user":"u","messages":[{"role":"user","content":"hi"}]}`,
			check: func(t *testing.T, r *Request) {
				if r.Model != "m" || !r.Stream || r.User != "u" || len(r.Messages) != 1 || r.Messages[0].Text[0] != "hi" {
					t.Errorf("parsed %+v", r)
				}
			}},
		{name: "chat parts and null", ep: EndpointChat, body: `{"model":"m","messages":[{"role":"system","content":null},{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]},{"role":"assistant","content":null}]}`,
			check: func(t *testing.T, r *Request) {
				// Kept: the first system message and the first other one.
				if len(r.Messages) != 2 || r.Messages[0].Text != nil || r.Messages[1].Role != "user" || len(r.Messages[1].Text) != 1 {
					t.Errorf("parsed %+v", r.Messages)
				}
			}},
		{name: "chat keeps what the key reads", ep: EndpointChat, body: `{"model":"m","messages":[{"role":"user","content":"u1"},{"role":"assistant","content":"a"},{"role":"developer","content":"d"},{"role":"system","content":"s"},{"role":"user","content":"u2"}]}`,
			check: func(t *testing.T, r *Request) {
				if len(r.Messages) != 2 || r.Messages[0].Text[0] != "u1" || r.Messages[1].Role != "developer" || r.Messages[1].Text[0] != "d" {
					t.Errorf("parsed %+v", r.Messages)
				}
			}},
		{name: "completion strings", ep: EndpointCompletions, body: `{"model":"m","prompt":["a","b"]}`,
			check: func(t *testing.T, r *Request) {
				if len(r.Prompts) != 1 || r.Prompts[0] != "a" {
					t.Errorf("prompts %v", r.Prompts)
				}
			}},
		{name: "completion strings then a number", ep: EndpointCompletions, body: `{"model":"m","prompt":["a",1]}`, wantErr: true, wantParam: "prompt"},
		{name: "later message bad role", ep: EndpointChat, body: `{"model":"m","messages":[{"role":"user","content":"x"},{"role":"","content":"y"}]}`, wantErr: true, wantParam: "messages[1].role"},
		{name: "later message bad part", ep: EndpointChat, body: `{"model":"m","messages":[{"role":"user","content":"x"},{"role":"user","content":"y"},{"role":"user","content":[{"type":"text","text":3}]}]}`, wantErr: true, wantParam: "messages[2].content[0].text"},
		{name: "model too long escaped", ep: EndpointChat, body: `{"model":"` + strings.Repeat(`\u0041`, 300) + `","messages":[{"role":"user","content":"hi"}]}`, wantErr: true, wantParam: "model"},
		{name: "completion tokens", ep: EndpointCompletions, body: `{"model":"m","prompt":[1,2]}`,
			check: func(t *testing.T, r *Request) {
				if string(r.PromptTokens) != "[1,2]" {
					t.Errorf("tokens %s", r.PromptTokens)
				}
			}},
		{name: "completion token batch", ep: EndpointCompletions, body: `{"model":"m","prompt":[[1,2],[3]]}`},
		{name: "malformed", ep: EndpointChat, body: `{"model":"m",`, wantErr: true},
		{name: "not an object", ep: EndpointChat, body: `["model"]`, wantErr: true},
		{name: "empty", ep: EndpointChat, body: ``, wantErr: true},
		{name: "trailing garbage", ep: EndpointChat, body: `{"model":"m","messages":[{"role":"user","content":"x"}]} x`, wantErr: true},
		{name: "missing model", ep: EndpointChat, body: `{"messages":[{"role":"user","content":"hi"}]}`, wantErr: true, wantParam: "model"},
		{name: "null model", ep: EndpointChat, body: `{"model":null,"messages":[]}`, wantErr: true, wantParam: "model"},
		{name: "model number", ep: EndpointChat, body: `{"model":3,"messages":[{"role":"user","content":"hi"}]}`, wantErr: true, wantParam: "model"},
		{name: "empty model", ep: EndpointChat, body: `{"model":"","messages":[{"role":"user","content":"hi"}]}`, wantErr: true, wantParam: "model"},
		{name: "stream string", ep: EndpointChat, body: `{"model":"m","stream":"yes","messages":[{"role":"user","content":"hi"}]}`, wantErr: true, wantParam: "stream"},
		{name: "user number", ep: EndpointChat, body: `{"model":"m","user":1,"messages":[{"role":"user","content":"hi"}]}`, wantErr: true, wantParam: "user"},
		{name: "messages missing", ep: EndpointChat, body: `{"model":"m"}`, wantErr: true, wantParam: "messages"},
		{name: "messages object", ep: EndpointChat, body: `{"model":"m","messages":{"role":"user"}}`, wantErr: true, wantParam: "messages"},
		{name: "messages empty", ep: EndpointChat, body: `{"model":"m","messages":[]}`, wantErr: true, wantParam: "messages"},
		{name: "message string", ep: EndpointChat, body: `{"model":"m","messages":["hi"]}`, wantErr: true, wantParam: "messages[0]"},
		{name: "role missing", ep: EndpointChat, body: `{"model":"m","messages":[{"content":"hi"}]}`, wantErr: true, wantParam: "messages[0].role"},
		{name: "content number", ep: EndpointChat, body: `{"model":"m","messages":[{"role":"user","content":5}]}`, wantErr: true, wantParam: "messages[0].content"},
		{name: "part without type", ep: EndpointChat, body: `{"model":"m","messages":[{"role":"user","content":[{"text":"a"}]}]}`, wantErr: true, wantParam: "messages[0].content[0]"},
		{name: "text part number", ep: EndpointChat, body: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`, wantErr: true, wantParam: "messages[0].content[0].text"},
		{name: "prompt on chat", ep: EndpointChat, body: `{"model":"m","prompt":"x","messages":[{"role":"user","content":"hi"}]}`, wantErr: true, wantParam: "prompt"},
		{name: "prompt number", ep: EndpointCompletions, body: `{"model":"m","prompt":42}`, wantErr: true, wantParam: "prompt"},
		{name: "prompt object", ep: EndpointCompletions, body: `{"model":"m","prompt":{"text":"x"}}`, wantErr: true, wantParam: "prompt"},
		{name: "prompt mixed", ep: EndpointCompletions, body: `{"model":"m","prompt":["a",1]}`, wantErr: true, wantParam: "prompt"},
		{name: "prompt float tokens", ep: EndpointCompletions, body: `{"model":"m","prompt":[1.5]}`, wantErr: true, wantParam: "prompt"},
		{name: "prompt empty array", ep: EndpointCompletions, body: `{"model":"m","prompt":[]}`, wantErr: true, wantParam: "prompt"},
		{name: "messages on completions", ep: EndpointCompletions, body: `{"model":"m","messages":[]}`, wantErr: true, wantParam: "messages"},
		{name: "responses", ep: EndpointResponses, body: `{"model":"m","instructions":"be brief","conversation":{"id":"c1"},"previous_response_id":"r1",` +
			`"input":[{"role":"developer","content":"d"},{"type":"reasoning"},{"role":"user","content":[{"type":"input_image"},{"type":"input_text","text":"q"}]}]}`,
			check: func(t *testing.T, r *Request) {
				// Kept: instructions as the system message, then the first user message.
				if r.Conversation != "c1" || r.PreviousResponseID != "r1" || len(r.Messages) != 2 || r.Messages[0].Text[0] != "be brief" || r.Messages[1].Text[0] != "q" {
					t.Errorf("parsed %+v", r)
				}
			}},
		{name: "responses bad part", ep: EndpointResponses, body: `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":1}]}]}`, wantErr: true, wantParam: "input[0].content[0].text"},
		{name: "responses instructions number", ep: EndpointResponses, body: `{"model":"m","instructions":1}`, wantErr: true, wantParam: "instructions"},
		{name: "responses previous empty", ep: EndpointResponses, body: `{"model":"m","previous_response_id":""}`, wantErr: true, wantParam: "previous_response_id"},
		{name: "embeddings strings", ep: EndpointEmbeddings, body: `{"model":"m","input":["a","b"]}`,
			check: func(t *testing.T, r *Request) {
				if len(r.Prompts) != 1 || r.Prompts[0] != "a" {
					t.Errorf("prompts %v", r.Prompts)
				}
			}},
		{name: "embeddings chat form", ep: EndpointEmbeddings, body: `{"model":"m","messages":[{"role":"user","content":"x"}]}`},
		{name: "embeddings input object", ep: EndpointEmbeddings, body: `{"model":"m","input":{"a":1}}`, wantErr: true, wantParam: "input"},
		{name: "embeddings dimensions float", ep: EndpointEmbeddings, body: `{"model":"m","input":"x","dimensions":1.5}`, wantErr: true, wantParam: "dimensions"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, err := ParseRequest(c.ep, []byte(c.body))
			if c.wantErr {
				ae, ok := err.(*APIError)
				if !ok {
					t.Fatalf("error %v (%T), want *APIError", err, err)
				}
				if ae.Status != http.StatusBadRequest || ae.Type != ErrTypeInvalidRequest {
					t.Fatalf("error %+v, want 400 invalid_request_error", ae)
				}
				gotParam := ""
				if ae.Param != nil {
					gotParam = *ae.Param
				}
				if gotParam != c.wantParam {
					t.Fatalf("param %q, want %q (%s)", gotParam, c.wantParam, ae.Message)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseRequest: %v", err)
			}
			if string(req.Body) != c.body {
				t.Fatalf("body not kept")
			}
			if c.check != nil {
				c.check(t, req)
			}
		})
	}
}

func FuzzParseRequest(f *testing.F) {
	seeds := []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","stream":true,"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"x"}]}]}`,
		`{"model":"m","prompt":"hello"}`,
		`{"model":"m","prompt":["a","b"]}`,
		`{"model":"m","prompt":[1,2,3]}`,
		`{"model":"m","prompt":[[1],[2]]}`,
		`{"model":3}`,
		`{"model":"m","prompt":[`,
		`[]`,
		`null`,
		`{"model":"m","messages":[null]}`,
		`{"model":"m","max_tokens":0,"n":1.0,"temperature":2,"top_p":1e-3,"presence_penalty":-2,"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","max_completion_tokens":1e99,"frequency_penalty":"x","prompt":"p"}`,
		`{"model":"m","messages":[1,1,1,1]}`,
		`{"model":"m","messages":[{"role":"assistant","content":"a"},{"role":"developer","content":"\u00e9"},{"role":"tool"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[null]}]}`,
		`{"model":"m","prompt":[[]]}`,
		"\xff{",
	}
	seeds = append(seeds,
		`{"model":"m","input":"hi","instructions":"be brief","previous_response_id":"resp_1","conversation":{"id":"c"}}`,
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"x"}]},{"type":"function_call_output"}]}`,
		`{"model":"m","input":[{"role":3}],"max_output_tokens":2}`,
		`{"model":"m","input":[[1,2],[3]],"dimensions":4}`,
		`{"model":"m","input":"x","stream":true}`)
	for _, s := range seeds {
		for ep := range uint8(len(endpointPaths)) {
			f.Add(s, ep)
		}
	}
	f.Fuzz(func(t *testing.T, body string, epn uint8) {
		ep := Endpoint(epn % uint8(len(endpointPaths)))
		req, err := ParseRequest(ep, []byte(body))
		if err != nil {
			ae, ok := err.(*APIError)
			if !ok || ae.Status != http.StatusBadRequest || ae.Message == "" {
				t.Fatalf("error %v (%T), want a 400 *APIError with a message", err, err)
			}
			return
		}
		if req.Model == "" || !json.Valid([]byte(body)) {
			t.Fatalf("accepted %q with model %q", body, req.Model)
		}
		if ep == EndpointChat && len(req.Messages) == 0 {
			t.Fatalf("accepted chat body %q without messages", body)
		}
		// The scanner agrees with encoding/json on the fields it reads
		// (a map keeps exact keys; the last of repeated keys counts).
		var top map[string]json.RawMessage
		if err := json.Unmarshal([]byte(body), &top); err != nil {
			t.Fatalf("accepted %q, which encoding/json rejects: %v", body, err)
		}
		var model string
		if err := json.Unmarshal(top["model"], &model); err != nil || model != req.Model {
			t.Fatalf("model %q, encoding/json reads %q (%v)", req.Model, model, err)
		}
		if wantStream := string(top["stream"]) == "true"; req.Stream != wantStream {
			t.Fatalf("stream %v, body has %s", req.Stream, top["stream"])
		}
		if wantChat := !isAbsent(top["messages"]); (EndpointOf([]byte(body)) == EndpointChat) != wantChat {
			t.Fatalf("natsEndpoint(%q) misreads messages %s", body, top["messages"])
		}
		again, err := ParseRequest(ep, []byte(body))
		if err != nil || again.Model != req.Model || again.Stream != req.Stream || again.User != req.User {
			t.Fatalf("reparse differs: %+v vs %+v (%v)", again, req, err)
		}
		// The model's span is the value encoding/json reads, and a body
		// with the model replaced parses as the same request under the
		// new name.
		if got := body[req.ModelAt:req.ModelEnd]; got != string(top["model"]) {
			t.Fatalf("model span %q, encoding/json's value %s", got, top["model"])
		}
		renamed := req.WithModel(nil, "org/x.y \"q\"")
		re, err := ParseRequest(ep, renamed)
		if err != nil || re.Model != "org/x.y \"q\"" || re.Stream != req.Stream || re.User != req.User || len(re.Messages) != len(req.Messages) {
			t.Fatalf("renamed body %q: %+v, %v", renamed, re, err)
		}
		if same := req.WithModel(nil, req.Model); json.Valid(same) != true {
			t.Fatalf("body with its own model re-written is not JSON: %q", same)
		}
	})
}

func TestWithModel(t *testing.T) {
	body := []byte(`{"messages":[{"role":"user","content":"hi"}], "model" : "llama-8b" ,"stream":true}`)
	req, err := ParseRequest(EndpointChat, body)
	if err != nil {
		t.Fatal(err)
	}
	got := string(req.WithModel(nil, "meta-llama/Llama-3.1-8B-Instruct"))
	want := `{"messages":[{"role":"user","content":"hi"}], "model" : "meta-llama/Llama-3.1-8B-Instruct" ,"stream":true}`
	if got != want {
		t.Errorf("WithModel = %s, want %s", got, want)
	}
	if n := testing.AllocsPerRun(100, func() { _ = req.WithModel(make([]byte, 0, 256), "x") }); n > 1 {
		t.Errorf("WithModel allocates %v times into a buffer of room, want the buffer only", n)
	}
}

func TestResponseID(t *testing.T) {
	cases := []struct {
		name, in, want string
		ok             bool
	}{
		{"response object", `{"id":"resp_1","object":"response","output":[{"id":"msg_1"}]}`, "resp_1", true},
		{"spaces", `{ "id" : "resp_2" }`, "resp_2", true},
		{"stream's first event", "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_3\",\"object\":\"response\"}}\n\n", "resp_3", true},
		{"quoted id in a string first", `{"instructions":"say \"id\": \"x\"","id":"resp_4"}`, "resp_4", true},
		{"id not a member", `{"ids":"x","id" "y"}`, "", false},
		{"truncated", `{"id":"resp_5`, "", false},
		{"truncated after an escape", `{"id":"resp_6\"`, "", false},
		{"empty", `{"id":""}`, "", false},
		{"number", `{"id":5}`, "", false},
		{"none", `{"object":"response"}`, "", false},
		{"too long", `{"id":"` + strings.Repeat("r", maxResponseIDLen+1) + `"}`, "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := ResponseID([]byte(c.in))
			if got != c.want || ok != c.ok {
				t.Errorf("ResponseID(%q) = %q, %v; want %q, %v", c.in, got, ok, c.want, c.ok)
			}
		})
	}
}

func FuzzResponseID(f *testing.F) {
	for _, s := range []string{`{"id":"resp_1"}`, "data: {\"response\":{\"id\":\"r\"}}", `{"id":"\u0041"}`, `"id"`, `{"id":"x\"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, ok := ResponseID([]byte(s))
		if ok != (id != "") || len(id) > 6*maxResponseIDLen {
			t.Fatalf("ResponseID(%q) = %q, %v", s, id, ok)
		}
		if ok && !strings.Contains(s, `"id"`) {
			t.Fatalf("ResponseID(%q) found %q with no id member", s, id)
		}
	})
}
