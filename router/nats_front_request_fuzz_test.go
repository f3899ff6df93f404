package router_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/natsfront"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/router/upstream"
	"github.com/switchyard-dev/switchyard/testenv"
)

// FuzzNATSFrontRequest sends requests through a running NATS front, over a
// real embedded server, to an engine that answers every request: the
// subject's model, the request id, session and priority headers and the
// body all come from the fuzzer. Every request must get an answer with a
// valid status, and every 4xx answer must be an OpenAI-shaped error.
func FuzzNATSFrontRequest(f *testing.F) {
	env := testenv.StartNATS(f)
	engine := env.Dial(f, "engine")
	sub, err := engine.Subscribe("sy.infer.m.e1", func(m *nats.Msg) {
		r := nats.NewMsg(m.Reply)
		r.Header.Set(messages.HeaderStatus, "200")
		r.Header.Set(messages.HeaderLast, "true")
		r.Data = []byte(`{"object":"chat.completion"}`)
		_ = engine.PublishMsg(r)
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := engine.Flush(); err != nil {
		f.Fatal(err)
	}
	nc := env.Dial(f, "router")
	tables := router.NewStaticTables()
	tb, err := selection.NewTable([]selection.Engine{{Name: "e1", Subject: "sy.infer.m.e1", Weight: 1}}, selection.TableOptions{})
	if err != nil {
		f.Fatal(err)
	}
	tables.Set("m", tb, control.Info{Generation: 1, Mode: control.ModeSnapshot, Created: time.Now()})
	tr, err := upstream.NewNATSTransport(upstream.NATSTransportOptions{Conn: nc})
	if err != nil {
		f.Fatal(err)
	}
	h, err := router.NewHandler(router.Options{Tables: tables, Cluster: "A", Transport: tr})
	if err != nil {
		f.Fatal(err)
	}
	front, err := natsfront.New(natsfront.Options{Conn: nc, Cluster: "A", Pipeline: h})
	if err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = front.Run(ctx) }()
	f.Cleanup(func() { cancel(); <-done })
	client := env.Dial(f, "client")
	testenv.WaitFor(f, 5*time.Second, "the front subscribed", func() bool {
		_, err := client.Request("sy.req.A.m", nil, 100*time.Millisecond)
		return err == nil
	})

	f.Add("m", "", "", "", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	f.Add("m", "req-1", "sess", "critical", `{"model":"m","prompt":"hi","max_tokens":3}`)
	f.Add("m", "", "", "sheddable", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	f.Add("other", "", "", "", `{"model":"other","messages":[{"role":"user","content":"hi"}]}`)
	f.Add("m", "bad id", "", "urgent", `{"model":"m","messages":[]}`)
	f.Add("m", "", "", "", `{"model":"m","messages":[1,1,1]}`)
	f.Add("m", "", "", "", "\xdd\x7f\xff\xff\xff")
	f.Fuzz(func(t *testing.T, model, reqID, session, prio, body string) {
		if model == "" || strings.ContainsAny(model, " \t\r\n.*>") {
			model = "m"
		}
		msg := nats.NewMsg("sy.req.A." + model)
		msg.Data = []byte(body)
		for k, v := range map[string]string{"x-request-id": reqID, "x-session-id": session, "x-switchyard-priority": prio} {
			if v == "" {
				continue
			}
			if strings.ContainsAny(v, "\r\n") {
				return // not a header NATS can carry
			}
			msg.Header.Set(k, v)
		}
		r, err := client.RequestMsg(msg, 5*time.Second)
		if err != nil {
			t.Fatalf("no answer to %q on %s: %v", body, msg.Subject, err)
		}
		status, err := strconv.Atoi(r.Header.Get(messages.HeaderStatus))
		if err != nil || status < 100 || status > 599 {
			t.Fatalf("answer with status header %q", r.Header.Get(messages.HeaderStatus))
		}
		if status >= 400 && status < 500 {
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
				} `json:"error"`
			}
			if err := json.Unmarshal(r.Data, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
				t.Fatalf("%d answer %q is not an OpenAI error (%v)", status, r.Data, err)
			}
		}
	})
}
