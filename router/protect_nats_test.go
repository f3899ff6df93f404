package router_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/guard"
	"github.com/switchyard-dev/switchyard/router/natsfront"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestNATSFrontShedAndReport: a shed request over NATS gets status 429,
// Retry-After and an OpenAI error body at once, and the report counts it.
func TestNATSFrontShedAndReport(t *testing.T) {
	env := testenv.StartNATS(t)
	e1 := newHTTPEngine(t, "e1")
	tables := router.NewStaticTables()
	tb, err := selection.NewTable([]selection.Engine{{Name: "e1", URL: e1.srv.URL, Weight: 0.5}}, selection.TableOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tables.Set("m", tb, control.Info{Generation: 1, Mode: control.ModeSnapshot, Created: time.Now(),
		Figures: &guard.Figures{ShedFraction: 0.5, HasShedByPriority: true, ShedByPriority: [3]float64{1, 0, 0}}})
	nc := env.Dial(t, "router")
	rep, err := control.NewReporter(control.ReporterOptions{Conn: nc, Cluster: "A", Router: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	h, err := router.NewHandler(router.Options{Tables: tables, Cluster: "A", Observer: rep})
	if err != nil {
		t.Fatal(err)
	}
	front, err := natsfront.New(natsfront.Options{Conn: nc, Cluster: "A", Pipeline: h})
	if err != nil {
		t.Fatal(err)
	}
	client := runNATSFront(t, env, front, "A")
	start := time.Now()
	msgs := natsRequest(t, client, "sy.req.A.m", chatJSON("m", false, "x"), map[string]string{"x-switchyard-priority": "sheddable"})
	if d := time.Since(start); d > time.Second {
		t.Fatalf("shed answer took %v", d)
	}
	var body struct {
		Error struct{ Type, Code string }
	}
	if len(msgs) != 1 || msgs[0].Header.Get(messages.HeaderStatus) != "429" || msgs[0].Header.Get("Retry-After") != "1" ||
		json.Unmarshal(msgs[0].Data, &body) != nil || body.Error.Code != "overloaded" {
		t.Fatalf("shed over NATS: %d messages, headers %v, body %q", len(msgs), msgs[0].Header, msgs[0].Data)
	}
	msgs = natsRequest(t, client, "sy.req.A.m", chatJSON("m", false, "x"), map[string]string{"x-switchyard-priority": "critical"})
	if msgs[0].Header.Get(messages.HeaderStatus) != "200" || !strings.Contains(string(msgs[0].Data), "e1") {
		t.Fatalf("critical over NATS: headers %v body %q", msgs[0].Header, msgs[0].Data)
	}
	msgs = natsRequest(t, client, "sy.req.A.m", chatJSON("m", false, "x"), map[string]string{"x-switchyard-priority": "bogus"})
	if msgs[0].Header.Get(messages.HeaderStatus) != "400" {
		t.Fatalf("bad priority over NATS: headers %v", msgs[0].Header)
	}
	reps := rep.Collect()
	if len(reps) != 1 || reps[0].Shed != 1 || reps[0].Requests != 2 || reps[0].DemandByPriority["sheddable"] != 1 ||
		reps[0].DemandByPriority["critical"] != 1 {
		t.Fatalf("report: %+v", reps)
	}
}
