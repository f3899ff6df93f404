package router

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/httpfront"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/router/upstream"
)

// outcomeLog is an Observer that keeps every outcome, by engine.
type outcomeLog struct {
	mu       sync.Mutex
	outcomes map[string][]control.Outcome
}

func (o *outcomeLog) Request(string) {}

func (o *outcomeLog) Outcome(_, engine string, oc control.Outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.outcomes == nil {
		o.outcomes = map[string][]control.Outcome{}
	}
	o.outcomes[engine] = append(o.outcomes[engine], oc)
}

func (o *outcomeLog) of(engine string) []control.Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]control.Outcome(nil), o.outcomes[engine]...)
}

// mapResolver is an EndpointResolver over a map, for tests.
type mapResolver struct {
	mu sync.Mutex
	m  map[string]control.Endpoints
}

func (r *mapResolver) Endpoints(model, engine string) (control.Endpoints, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ep, ok := r.m[model+"."+engine]
	return ep, ok
}

func (r *mapResolver) set(model, engine string, ep control.Endpoints) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[model+"."+engine] = ep
}

// unaddressedFront serves model "m" over a table of a live engine "live"
// and an engine "nowhere" that has no address in the table, each of weight
// 0.5, forwarding through a TransportPolicy.
func unaddressedFront(t *testing.T, opts Options) (*Handler, *progEngine, string, *outcomeLog) {
	t.Helper()
	live := newProgEngine(t, "live", modeOK)
	tbl := mustTable(t, []selection.Engine{{Name: "live", URL: live.srv.URL, Weight: 0.5}, {Name: "nowhere", Weight: 0.5}}, selection.TableOptions{})
	tables := NewStaticTables()
	tables.Set("m", tbl, control.Info{Generation: 1, Mode: control.ModeSnapshot, Created: time.Now()})
	obs := &outcomeLog{}
	opts.Tables, opts.Cluster, opts.Observer = tables, "A", obs
	opts.Transport = &upstream.TransportPolicy{HTTP: upstream.NewHTTPTransport(upstream.HTTPTransportOptions{}), Endpoints: opts.Endpoints}
	h, err := NewHandler(opts)
	if err != nil {
		t.Fatal(err)
	}
	return h, live, serveFront(t, httpfront.ServerStd, h, httpfront.ServerOptions{}), obs
}

// noTransportBlamed fails t when anything counted against engine.
func noTransportBlamed(t *testing.T, h *Handler, obs *outcomeLog, engine string) {
	t.Helper()
	if oc := obs.of(engine); len(oc) > 0 {
		t.Errorf("outcomes reported for %s: %+v", engine, oc)
	}
	if h.Live("m").Engine(engine).Ejected() {
		t.Errorf("%s ejected", engine)
	}
	if n := metricValue(h.metrics.retries.WithLabelValues("connect")) + metricValue(h.metrics.retries.WithLabelValues("other")); n > 0 {
		t.Errorf("%v retries counted", n)
	}
}

// TestNoTransportIsNotTheEngines: an engine the transport has no address
// for (no URL, no subject, no live endpoints) is passed over: every request
// is served by the other engine, and nothing is counted against it — no
// outcome reported, no ejection, no retry — however many requests pick it.
func TestNoTransportIsNotTheEngines(t *testing.T) {
	h, live, url, obs := unaddressedFront(t, Options{})
	client := testClient(t)
	for i := 0; i < 60; i++ {
		r := doChat(t, client, url, fmt.Sprintf("s%d", i))
		if r.status != http.StatusOK || r.header.Get(messages.HeaderEngine) != "live" {
			t.Fatalf("request %d: status %d engine %q: %s", i, r.status, r.header.Get(messages.HeaderEngine), r.body)
		}
	}
	if live.requests.Load() != 60 {
		t.Fatalf("live engine served %d of 60", live.requests.Load())
	}
	noTransportBlamed(t, h, obs, "nowhere")
	if n := metricValue(h.metrics.unaddressed.WithLabelValues("m", "nowhere")); n == 0 {
		t.Errorf("no pass over the engine without address counted (with 60 requests, half of them its keys)")
	}
}

// TestUnaddressedEngineNotPickedUntilItHasEndpoints: with Options.Endpoints
// set, an engine without address is not selectable (not even picked and
// passed over), requests that arrive before Settled is closed wait for it,
// and once SetEngineEndpoints gives the engine an address it serves its
// share.
func TestUnaddressedEngineNotPickedUntilItHasEndpoints(t *testing.T) {
	other := newProgEngine(t, "nowhere", modeOK)
	res := &mapResolver{m: map[string]control.Endpoints{}}
	settled := make(chan struct{})
	h, live, url, obs := unaddressedFront(t, Options{Endpoints: res, Settled: settled})
	client := testClient(t)

	if rd := h.Readiness(); rd.Ready || !rd.Starting {
		t.Fatalf("before Settled: readiness %+v, want starting and not ready", rd)
	}
	early := make(chan result, 1)
	go func() { early <- doChat(t, client, url, "early") }()
	select {
	case r := <-early:
		t.Fatalf("a request was answered before the router settled: %d %s", r.status, r.body)
	case <-time.After(200 * time.Millisecond):
	}
	close(settled)
	if r := <-early; r.status != http.StatusOK {
		t.Fatalf("held request: status %d: %s", r.status, r.body)
	}
	if rd := h.Readiness(); !rd.Ready || rd.Starting {
		t.Fatalf("after Settled: readiness %+v", rd)
	}
	for i := 0; i < 40; i++ {
		if r := doChat(t, client, url, fmt.Sprintf("s%d", i)); r.status != http.StatusOK || r.header.Get(messages.HeaderEngine) != "live" {
			t.Fatalf("request %d: status %d engine %q", i, r.status, r.header.Get(messages.HeaderEngine))
		}
	}
	if n := metricValue(h.metrics.unaddressed.WithLabelValues("m", "nowhere")); n != 0 {
		t.Errorf("%v passes over an engine the guard should have skipped at the pick", n)
	}
	noTransportBlamed(t, h, obs, "nowhere")

	// The engine's signals give it an address: it takes its share.
	res.set("m", "nowhere", control.Endpoints{URL: other.srv.URL})
	h.SetEngineEndpoints("m", "nowhere", control.Endpoints{URL: other.srv.URL})
	for i := 0; i < 40; i++ {
		if r := doChat(t, client, url, fmt.Sprintf("t%d", i)); r.status != http.StatusOK {
			t.Fatalf("request %d: status %d", i, r.status)
		}
	}
	if other.requests.Load() == 0 || live.requests.Load() <= 41 {
		t.Fatalf("after the address came: nowhere %d, live %d requests", other.requests.Load(), live.requests.Load())
	}
	// And withdrawing it makes it unselectable again.
	h.SetEngineEndpoints("m", "nowhere", control.Endpoints{})
	before := other.requests.Load()
	for i := 0; i < 20; i++ {
		if r := doChat(t, client, url, fmt.Sprintf("t%d", i)); r.status != http.StatusOK || r.header.Get(messages.HeaderEngine) != "live" {
			t.Fatalf("after withdrawal, request %d: status %d engine %q", i, r.status, r.header.Get(messages.HeaderEngine))
		}
	}
	if other.requests.Load() != before {
		t.Fatalf("engine without address served %d more", other.requests.Load()-before)
	}
}

func doChat(t *testing.T, client *http.Client, url, session string) result {
	t.Helper()
	f := &pfront{url: url, client: client}
	return f.do(streamBody("hi"), map[string]string{messages.HeaderSessionID: session})
}
