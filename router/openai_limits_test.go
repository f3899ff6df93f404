package router

import (
	"bytes"
	"encoding/json"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/httpfront"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/selection"
)

func TestParseRequestParams(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		params    string
		wantParam string // "" accepted
		wantCode  string
	}{
		{`"max_tokens":1`, "", ""},
		{`"max_tokens":16777216`, "", ""},
		{`"max_tokens":100.0`, "", ""},
		{`"max_tokens":null`, "", ""},
		{`"max_tokens":0`, "max_tokens", "integer_below_min_value"},
		{`"max_tokens":-5`, "max_tokens", "integer_below_min_value"},
		{`"max_tokens":16777217`, "max_tokens", "integer_above_max_value"},
		{`"max_tokens":1e300`, "max_tokens", "integer_above_max_value"},
		{`"max_tokens":1e999`, "max_tokens", "integer_above_max_value"},
		{`"max_tokens":` + strings.Repeat("9", 100), "max_tokens", "integer_above_max_value"},
		{`"max_tokens":-` + strings.Repeat("9", 100), "max_tokens", "integer_below_min_value"},
		{`"max_tokens":1.5`, "max_tokens", "invalid_type"},
		{`"max_tokens":"10"`, "max_tokens", "invalid_type"},
		{`"max_tokens":true`, "max_tokens", "invalid_type"},
		{`"max_tokens":[10]`, "max_tokens", "invalid_type"},
		{`"max_completion_tokens":0`, "max_completion_tokens", "integer_below_min_value"},
		{`"max_completion_tokens":50`, "", ""},
		{`"n":1`, "", ""},
		{`"n":128`, "", ""},
		{`"n":0`, "n", "integer_below_min_value"},
		{`"n":129`, "n", "integer_above_max_value"},
		{`"n":2.5`, "n", "invalid_type"},
		{`"temperature":0`, "", ""},
		{`"temperature":2`, "", ""},
		{`"temperature":0.7`, "", ""},
		{`"temperature":-0.1`, "temperature", "decimal_below_min_value"},
		{`"temperature":2.01`, "temperature", "decimal_above_max_value"},
		{`"temperature":"hot"`, "temperature", "invalid_type"},
		{`"top_p":1`, "", ""},
		{`"top_p":0.01`, "", ""},
		{`"top_p":0`, "top_p", "decimal_below_min_value"},
		{`"top_p":1.0000001`, "top_p", "decimal_above_max_value"},
		{`"top_p":{}`, "top_p", "invalid_type"},
		{`"stream":1`, "stream", ""},
		{`"presence_penalty":-2`, "", ""},
		{`"presence_penalty":2`, "", ""},
		{`"presence_penalty":2.5`, "presence_penalty", "decimal_above_max_value"},
		{`"frequency_penalty":-2.1`, "frequency_penalty", "decimal_below_min_value"},
		{`"frequency_penalty":"x"`, "frequency_penalty", "invalid_type"},
		{`"max_tokens":5,"max_tokens":0`, "max_tokens", "integer_below_min_value"}, // the last counts, as engines read it
	} {
		for _, ep := range []protocol.Endpoint{protocol.EndpointChat, protocol.EndpointCompletions} {
			body := `{"model":"m",` + tc.params + `,` + msgs + `}`
			if ep == protocol.EndpointCompletions {
				body = `{"model":"m",` + tc.params + `,"prompt":"hi"}`
			}
			_, err := protocol.ParseRequest(ep, []byte(body))
			if tc.wantParam == "" {
				if err != nil {
					t.Errorf("%s on %s: %v", tc.params, ep.Path(), err)
				}
				continue
			}
			ae, ok := err.(*protocol.APIError)
			if !ok || ae.Status != http.StatusBadRequest || ae.Type != protocol.ErrTypeInvalidRequest || ae.Param == nil || *ae.Param != tc.wantParam {
				t.Errorf("%s on %s: %v, want a 400 about %s", tc.params, ep.Path(), err, tc.wantParam)
				continue
			}
			if tc.wantCode != "" && (ae.Code == nil || *ae.Code != tc.wantCode) {
				t.Errorf("%s: code %v, want %s", tc.params, ae.Code, tc.wantCode)
			}
		}
	}
}

// TestParamErrorsOnTheWire: a bad parameter is answered by the router
// itself in the OpenAI error shape, on both servers, and reaches no engine.
func TestParamErrorsOnTheWire(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		e := newStatusEngine(t, "e0", http.StatusOK)
		tables := NewStaticTables()
		tables.Set("m", mustTable(t, []selection.Engine{{Name: "e0", URL: e.srv.URL, Weight: 1}}, selection.TableOptions{}), control.Info{Generation: 1, Mode: control.ModeSnapshot})
		h, err := NewHandler(Options{Tables: tables, Cluster: "A"})
		if err != nil {
			t.Fatal(err)
		}
		f := &pfront{h: h, url: serveFront(t, kind, h, httpfront.ServerOptions{}), client: testClient(t)}
		for _, p := range []string{`"max_tokens":0`, `"n":1000`, `"temperature":3`, `"top_p":0`, `"max_completion_tokens":-1`} {
			r := f.do(`{"model":"m",`+p+`,"messages":[{"role":"user","content":"hi"}]}`, nil)
			var got struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    *string `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(r.body), &got); err != nil || r.status != 400 || got.Error.Type != protocol.ErrTypeInvalidRequest ||
				got.Error.Param == nil || !strings.HasPrefix(p, `"`+*got.Error.Param+`"`) || got.Error.Code == nil || got.Error.Message == "" {
				t.Errorf("%s: %d %s (%v)", p, r.status, r.body, err)
			}
		}
		if n := e.requests.Load(); n != 0 {
			t.Errorf("the engine got %d invalid requests", n)
		}
	})
}

// pathologicalBodies are 8 MiB bodies that make a parser that decodes or
// counts what it reads allocate many times their size.
func pathologicalBodies() map[string][]byte {
	const size = 8 << 20
	fill := func(head, item, tail string) []byte {
		var b bytes.Buffer
		b.Grow(size)
		b.WriteString(head)
		for b.Len()+len(item)+len(tail) < size {
			b.WriteString(item)
			b.WriteByte(',')
		}
		b.WriteString(item)
		b.WriteString(tail)
		return b.Bytes()
	}
	return map[string][]byte{
		"messages of numbers":   fill(`{"model":"llama","messages":[`, `1`, `]}`),
		"messages of objects":   fill(`{"model":"llama","messages":[`, `{"role":"u"}`, `]}`),
		"many content parts":    fill(`{"model":"llama","messages":[{"role":"user","content":[`, `{"type":"text","text":"ab"}`, `]}]}`),
		"prompt of strings":     fill(`{"model":"llama","prompt":[`, `""`, `]}`),
		"prompt of token lists": fill(`{"model":"llama","prompt":[`, `[1]`, `]}`),
		"one long string":       append(append([]byte(`{"model":"llama","messages":[{"role":"user","content":"`), bytes.Repeat([]byte(`\u00e9`), size/6)...), `"}]}`...),
		"long model":            append(append([]byte(`{"model":"`), bytes.Repeat([]byte("m"), size)...), `","messages":[]}`...),
		"long user":             append(append([]byte(`{"model":"llama","user":"`), bytes.Repeat([]byte("u"), size)...), `","messages":[{"role":"user","content":"x"}]}`...),
	}
}

// TestParseAllocationBounded: parsing an 8 MiB body allocates at most
// twice its size, whatever it holds (the user field, kept whole, is the
// largest: one copy).
func TestParseAllocationBounded(t *testing.T) {
	for name, body := range pathologicalBodies() {
		ep := protocol.EndpointChat
		if bytes.Contains(body[:40], []byte(`"prompt"`)) {
			ep = protocol.EndpointCompletions
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err := protocol.ParseRequest(ep, body)
		runtime.ReadMemStats(&after)
		alloc := after.TotalAlloc - before.TotalAlloc
		t.Logf("%s: %d bytes, allocated %d (%.3fx), err %v", name, len(body), alloc, float64(alloc)/float64(len(body)), err)
		if alloc > 2*uint64(len(body)) {
			t.Errorf("%s: parsing %d bytes allocated %d (%.1fx), want at most 2x", name, len(body), alloc, float64(alloc)/float64(len(body)))
		}
	}
}
