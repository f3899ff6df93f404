package enginesim_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/enginesim"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/testenv"
)

func TestControlSubject(t *testing.T) {
	env := testenv.StartNATS(t)
	o := fastOpts("e-ctl")
	o.Conn = env.Dial(t, "e-ctl")
	o.NoSignals = true
	e := startEngine(t, o)
	subj, err := enginesim.ControlSubject(streams.Names{}, "e-ctl")
	if err != nil || subj != "sy.ctl.engine.e-ctl" {
		t.Fatalf("ControlSubject: %q %v", subj, err)
	}
	if _, err := enginesim.ControlSubject(streams.Names{}, "a.b"); err == nil {
		t.Errorf("ControlSubject accepted a dotted name")
	}
	nc := env.Dial(t, "operator")
	ask := func(body string) (int, enginesim.Failure, string) {
		t.Helper()
		m, err := nc.Request(subj, []byte(body), 2*time.Second)
		if err != nil {
			t.Fatalf("request %s: %v", body, err)
		}
		var f enginesim.Failure
		if m.Header.Get(messages.HeaderStatus) == "200" {
			if err := json.Unmarshal(m.Data, &f); err != nil {
				t.Fatal(err)
			}
		}
		status := 0
		switch m.Header.Get(messages.HeaderStatus) {
		case "200":
			status = 200
		case "400":
			status = 400
		}
		return status, f, string(m.Data)
	}
	start := time.Now()
	if st, f, _ := ask(`{"error_rate":0.5,"ttft_factor":3}`); st != 200 || f.ErrorRate != 0.5 || f.TTFTFactor != 3 {
		t.Fatalf("set: %d %+v", st, f)
	}
	t.Logf("control round trip %s", time.Since(start).Round(time.Microsecond))
	if got := e.Failure(); got.ErrorRate != 0.5 || got.TTFTFactor != 3 {
		t.Errorf("engine's failure %+v", got)
	}
	if st, f, _ := ask(``); st != 200 || f.ErrorRate != 0.5 {
		t.Errorf("read: %d %+v", st, f)
	}
	if st, _, body := ask(`{"error_rate":2}`); st != 400 || !strings.Contains(body, "ErrorRate") {
		t.Errorf("invalid: %d %s", st, body)
	}
	if st, _, body := ask(`{"nope":1}`); st != 400 || !strings.Contains(body, "nope") {
		t.Errorf("unknown field: %d %s", st, body)
	}
	// A crashed engine still takes control requests, and recovers.
	if st, f, _ := ask(`{"crashed":true}`); st != 200 || !f.Crashed {
		t.Fatalf("crash: %d %+v", st, f)
	}
	if st, f, body := ask(`{"error_rate":0,"added_latency_ms":0,"hang":false,"crash_after":0,"crashed":false,"capacity_factor":0,"silent":false,"ttft_factor":0}`); st != 200 || f != (enginesim.Failure{}) {
		t.Fatalf("clear: %d %+v %s", st, f, body)
	}
}

func TestTTFTFactor(t *testing.T) {
	o := fastOpts("e-slow")
	o.PrefillMsPerToken = 0.5 // 100 tokens: 50 ms prefill
	e := startEngine(t, o)
	_, normal := streamed(t, t.Context(), http.DefaultClient, e.URL())
	if err := e.SetFailure(enginesim.Failure{TTFTFactor: 4}); err != nil {
		t.Fatal(err)
	}
	_, slow := streamed(t, t.Context(), http.DefaultClient, e.URL())
	t.Logf("TTFT normal %s, with ttft_factor 4: %s", normal, slow)
	if slow < normal+120*time.Millisecond {
		t.Errorf("TTFT with factor 4 is %s, normal %s: want about 150 ms more", slow, normal)
	}
}
