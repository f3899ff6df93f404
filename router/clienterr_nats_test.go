package router_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/router/upstream"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestNATSEngineClientErrors: an engine served over NATS that answers
// Sy-Status 400 (a prompt over its context window) is classified by the
// same rule as over HTTP: relayed, not retried on the other engine, not
// ejected, and reported under the "client" error class, not as a failure.
func TestNATSEngineClientErrors(t *testing.T) {
	env := testenv.StartNATS(t)
	engine := env.Dial(t, "engine")
	var answered [2]atomic.Int64
	for i, status := range []string{"400", "200"} {
		sub, err := engine.Subscribe(fmt.Sprintf("sy.infer.m.e%d", i), func(m *nats.Msg) {
			answered[i].Add(1)
			r := nats.NewMsg(m.Reply)
			r.Header.Set(messages.HeaderStatus, status)
			r.Header.Set(messages.HeaderLast, "true")
			r.Data = []byte(`{"object":"error","message":"This model's maximum context length is 4096 tokens.","type":"BadRequestError","param":null,"code":400}`)
			if status == "200" {
				r.Data = []byte(`{"id":"x","object":"chat.completion","choices":[]}`)
			}
			_ = engine.PublishMsg(r)
		})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	if err := engine.Flush(); err != nil {
		t.Fatal(err)
	}
	nc := env.Dial(t, "router")
	tr, err := upstream.NewNATSTransport(upstream.NATSTransportOptions{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	tables := router.NewStaticTables()
	tb, err := selection.NewTable([]selection.Engine{{Name: "e0", Subject: "sy.infer.m.e0", Weight: 0.5},
		{Name: "e1", Subject: "sy.infer.m.e1", Weight: 0.5}}, selection.TableOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tables.Set("m", tb, control.Info{Generation: 1, Mode: control.ModeSnapshot, Created: time.Now()})
	rep, err := control.NewReporter(control.ReporterOptions{Conn: nc, Cluster: "A", Router: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	h, err := router.NewHandler(router.Options{Tables: tables, Cluster: "A", Observer: rep, Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(h)
	defer front.Close()
	session := ""
	for k := 0; session == ""; k++ {
		s := fmt.Sprintf("s%d", k)
		key, _ := protocol.AffinityKey(s, &protocol.Request{Model: "m"})
		if j, _ := tb.Primary(key); j == 0 {
			session = s
		}
	}
	for i := 0; i < 10; i++ {
		req, _ := http.NewRequest(http.MethodPost, front.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"long"}]}`))
		req.Header.Set("x-session-id", session)
		resp, err := front.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(body), "maximum context length") {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	if a, b := answered[0].Load(), answered[1].Load(); a != 10 || b != 0 {
		t.Errorf("e0 answered %d, e1 %d: want 10 and 0 (no retries)", a, b)
	}
	if h.Live("m").Engine("e0").Ejected() {
		t.Error("e0 ejected for client errors")
	}
	var o messages.EngineOutcome
	for _, r := range rep.Collect() {
		if r.Model == "m" {
			o = r.Engines["e0"]
		}
	}
	if o.Sent != 10 || o.Succeeded != 0 || o.Errors[messages.ErrorClassClient] != 10 || len(o.Errors) != 1 || o.Timeouts != 0 {
		t.Errorf("e0's reported outcome %+v, want 10 sent, all client errors", o)
	}
}
