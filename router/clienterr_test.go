package router

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/httpfront"
	"github.com/switchyard-dev/switchyard/router/live"
	"github.com/switchyard-dev/switchyard/router/selection"
)

func TestResponseOutcomeClientError(t *testing.T) {
	now := time.Now()
	for status, want := range map[int]control.Result{400: control.ResultClient, 404: control.ResultClient, 422: control.ResultClient, 413: control.ResultClient,
		408: control.ResultTimeout, 418: control.ResultOther, 500: control.Result5xx, 429: control.Result429, 200: control.ResultOK} {
		if o := responseOutcome(context.Background(), status, nil, now, now, now); o.Result != want {
			t.Errorf("status %d: %v, want %v", status, o.Result, want)
		}
	}
}

// statusEngine answers every request with one status and an OpenAI-shaped
// error body (vLLM's shape for 4xx), or an SSE answer for 200.
type statusEngine struct {
	name     string
	srv      *httptest.Server
	status   atomic.Int32
	requests atomic.Int64
}

func newStatusEngine(t *testing.T, name string, status int) *statusEngine {
	t.Helper()
	e := &statusEngine{name: name}
	e.status.Store(int32(status))
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.requests.Add(1)
		st := int(e.status.Load())
		if st == http.StatusOK {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: {\"engine\":%q}\n\ndata: [DONE]\n\n", e.name)
			return
		}
		typ := "BadRequestError"
		if st == http.StatusNotFound {
			typ = "NotFoundError"
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(st)
		fmt.Fprintf(w, `{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 9000 tokens.","type":%q,"param":null,"code":%d}`, typ, st)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// outcomeRecorder is an Observer that keeps every outcome.
type outcomeRecorder struct {
	mu  sync.Mutex
	out map[string][]control.Result
}

func (o *outcomeRecorder) Request(string) {}
func (o *outcomeRecorder) Outcome(_, engine string, oc control.Outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.out == nil {
		o.out = map[string][]control.Result{}
	}
	o.out[engine] = append(o.out[engine], oc.Result)
}
func (o *outcomeRecorder) results(engine string) []control.Result {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]control.Result(nil), o.out[engine]...)
}

// TestClientErrorsNotBlamed: ten answers that blame the request, from the
// engine a session is pinned to, are relayed as they are, never retried on
// another engine, recorded as client errors, and neither eject the engine
// nor reset or add to its failure count; 408 and 5xx still do.
func TestClientErrorsNotBlamed(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		for _, status := range []int{400, 404, 413, 422} {
			t.Run(fmt.Sprint(status), func(t *testing.T) {
				bad := newStatusEngine(t, "e0", status)
				good := newStatusEngine(t, "e1", http.StatusOK)
				front := func(prot live.ProtectionOptions) (*pfront, *outcomeRecorder) {
					tables := NewStaticTables()
					table := mustTable(t, []selection.Engine{{Name: "e0", URL: bad.srv.URL, Weight: 0.5},
						{Name: "e1", URL: good.srv.URL, Weight: 0.5}}, selection.TableOptions{})
					tables.Set("m", table, control.Info{Generation: 1, Mode: control.ModeSnapshot, Created: time.Now()})
					rec := &outcomeRecorder{}
					h, err := NewHandler(Options{Tables: tables, Cluster: "A", Observer: rec, Protection: prot})
					if err != nil {
						t.Fatal(err)
					}
					url := serveFront(t, kind, h, httpfront.ServerOptions{})
					return &pfront{h: h, url: url, tables: tables, table: table, client: testClient(t)}, rec
				}
				f, rec := front(live.ProtectionOptions{})
				h := f.h
				hdr := map[string]string{messages.HeaderSessionID: f.sessionFor(t, 0)}
				for i := 0; i < 10; i++ {
					r := f.do(streamBody("x"), hdr)
					if r.status != status || !strings.Contains(r.body, "maximum context length") || r.header.Get(messages.HeaderEngine) != "e0" {
						t.Fatalf("request %d: %d from %q: %s", i, r.status, r.header.Get(messages.HeaderEngine), r.body)
					}
				}
				if n := bad.requests.Load(); n != 10 {
					t.Errorf("e0 got %d requests, want 10", n)
				}
				if n := good.requests.Load(); n != 0 {
					t.Errorf("client errors were retried: e1 got %d requests", n)
				}
				if n := f.attempts(); n != 10 {
					t.Errorf("%d upstream attempts, want 10", n)
				}
				if h.Live("m").Engine("e0").Ejected() {
					t.Error("e0 ejected for client errors")
				}
				if n := metricValue(h.metrics.clientErrors.WithLabelValues("m", "e0")); n != 10 {
					t.Errorf("client error metric %v, want 10", n)
				}
				waitFor(t, 2*time.Second, func() bool { return len(rec.results("e0")) == 10 })
				for i, r := range rec.results("e0") {
					if r != control.ResultClient {
						t.Errorf("outcome %d: %v, want client", i, r)
					}
				}
				// Client errors are neutral, not successes: two failures
				// before one and one after still eject (After = 3).
				f, _ = front(live.ProtectionOptions{MaxAttempts: 1})
				for _, st := range []int{500, 502, status, 408} {
					bad.status.Store(int32(st))
					if r := f.do(streamBody("x"), hdr); r.status != st {
						t.Fatalf("status %d answered %d", st, r.status)
					}
				}
				if !f.h.Live("m").Engine("e0").Ejected() {
					t.Error("e0 not ejected after 5xx, 5xx, client error, 408")
				}
			})
		}
	})
}
