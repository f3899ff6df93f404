package router

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-dev/switchyard/kvindex"
	"github.com/switchyard-dev/switchyard/router/httpfront"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/services/enginesim"
)

// oneIndex is a KVIndexes of one model's index.
type oneIndex struct {
	model string
	x     *kvindex.Index
}

func (o oneIndex) Index(model string) *kvindex.Index {
	if model != o.model {
		return nil
	}
	return o.x
}

// fixedTokens tokenizes every chat request as the same ids (and counts
// its calls); other endpoints it cannot.
type fixedTokens struct {
	ids   []uint32
	calls atomic.Int64
}

func (f *fixedTokens) Tokens(dst []uint32, _ string, req *protocol.Request) ([]uint32, bool) {
	f.calls.Add(1)
	if req.Endpoint != protocol.EndpointChat {
		return dst, false
	}
	return append(dst, f.ids...), true
}

// TestKVIndexPlacesTokenRequests: with Options.KV, a token-id prompt and a
// chat request the Tokenizer tokenizes go to the engine the engine-exact
// index says holds their prefix, whatever the router routed before, and
// are counted as kv_events picks; a text request keeps text keys and the
// router's own index.
func TestKVIndexPlacesTokenRequests(t *testing.T) {
	var engines []enginesim.Options
	for _, name := range []string{"a", "b", "c"} {
		engines = append(engines, enginesim.Options{Name: name, MaxBatch: 8, BaseTBTMs: 1, OutputTokens: 2, PromptTokens: 8, Seed: 1})
	}
	tables := simTables(t, "llama", engines...)
	x, err := kvindex.New(kvindex.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]uint32, 64) // four blocks
	for i := range ids {
		ids[i] = uint32(1000 + i)
	}
	chatIDs := &fixedTokens{ids: make([]uint32, 48)}
	for i := range chatIDs.ids {
		chatIDs.ids[i] = uint32(7 + 3*i)
	}
	reg := prometheus.NewRegistry()
	h, err := NewHandler(Options{Tables: tables, KV: oneIndex{"llama", x}, Tokenizer: chatIDs, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	base := serveFront(t, httpfront.DefaultServerKind, h, httpfront.ServerOptions{})
	c := testClient(t)
	var prompt strings.Builder
	for i, id := range ids {
		if i > 0 {
			prompt.WriteByte(',')
		}
		fmt.Fprint(&prompt, id)
	}
	completion := `{"model":"llama","max_tokens":2,"prompt":[` + prompt.String() + `]}`
	chat := `{"model":"llama","max_tokens":2,"messages":[{"role":"user","content":"what the tokenizer reads"}]}`
	send := func(path, body string) string {
		t.Helper()
		status, engine, out := call(t, c, http.MethodPost, base+path, body)
		if status != http.StatusOK {
			t.Fatalf("%s: status %d %s", path, status, out)
		}
		return engine
	}
	first := send("/v1/completions", completion) // no engine reports it: the router's pick, remembered
	if got := send("/v1/completions", completion); got != first {
		t.Fatalf("the same token prompt went to %s then %s with no KV events: want the router's own memory to keep it", first, got)
	}
	holder := "a"
	if first == "a" {
		holder = "c"
	}
	if err := x.Store(holder, protocol.TokenKeys(nil, ids)); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if got := send("/v1/completions", completion); got != holder {
			t.Fatalf("token prompt went to %s, want %s, which the KV events say holds it (the router sent it to %s)", got, holder, first)
		}
	}
	if err := x.Store("b", protocol.TokenKeys(nil, chatIDs.ids)); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if got := send("/v1/chat/completions", chat); got != "b" {
			t.Fatalf("tokenized chat went to %s, want b, which the KV events say holds its tokens", got)
		}
	}
	if n := chatIDs.calls.Load(); n != 3 {
		t.Errorf("the tokenizer was called %d times, want 3 (the chat requests; token prompts need none)", n)
	}
	kv, routed := metricValue(h.metrics.prefixFromKV), metricValue(h.metrics.prefixFromRouted)
	if kv != 6 || routed != 2 {
		t.Errorf("prefix picks: %v from KV events, %v from what was routed; want 6 and 2", kv, routed)
	}
	// A request the tokenizer cannot read keeps its text keys: the KV
	// events are not asked.
	send("/v1/completions", `{"model":"llama","max_tokens":2,"prompt":"a text prompt"}`)
	if got := metricValue(h.metrics.prefixFromKV) + metricValue(h.metrics.prefixFromRouted); got != 8 {
		t.Errorf("a text prompt counted as a prefix pick of the engine-exact index (%v picks, want 8)", got)
	}
}
