package control_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-dev/switchyard/auth/endpoints"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestSignalsEndpointPolicy sends signals over a real NATS server to a
// Signals with an endpoint policy: an endpoint the policy refuses leaves
// the engine's accepted endpoints as they were (or the engine unknown),
// and is counted by reason.
func TestSignalsEndpointPolicy(t *testing.T) {
	n := testenv.StartNATS(t)
	nc := n.Dial(t, "signals")
	pub := n.Dial(t, "engines")
	pol, err := endpoints.New(endpoints.File{Models: []endpoints.Rules{{Model: "m",
		Engines: []endpoints.EngineRule{{Name: "engine-a", URLs: []string{"http://127.0.0.1:8001"}}},
		CIDRs:   []string{"10.0.0.0/8"}}}},
		endpoints.Options{OwnSubject: func(model, engine string) string { return "sy.infer." + model + "." + engine }})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s, err := control.NewSignals(control.SignalOptions{Conn: nc, Endpoints: pol, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()

	seq := uint64(0)
	send := func(engine string, ts ...messages.Transport) {
		t.Helper()
		seq++
		data, err := messages.Encode(&messages.EngineSignal{Model: "m", Engine: engine, Time: time.Now().UnixMilli(), Seq: seq,
			TTFTMs: 100, TBTMs: 10, CapacityRPS: 10, Replicas: 1, Health: 1, Transports: ts})
		if err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish("sy.signal.m."+engine, data); err != nil {
			t.Fatal(err)
		}
		if err := pub.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	http := func(u string) messages.Transport { return messages.Transport{Kind: messages.TransportHTTP, Address: u} }
	nats := func(s string) messages.Transport { return messages.Transport{Kind: messages.TransportNATS, Address: s} }
	refused := func(reason string) float64 {
		return testenv.MetricSum(t, reg, "switchyard_router_endpoints_refused_total", map[string]string{"reason": reason})
	}
	// Every case sends one signal; then a marker signal of engine-m, which
	// the policy allows, shows the case's signal was handled (one
	// subscription delivers in order).
	marker := 0
	settle := func() {
		t.Helper()
		marker++
		want := "http://10.9.9.9:" + itoa(marker)
		send("engine-m", http(want))
		waitFor(t, 5*time.Second, func() bool { ep, _ := s.Endpoints("m", "engine-m"); return ep.URL == want })
	}
	// Until Run has subscribed, signals are lost: send markers until one lands.
	waitFor(t, 5*time.Second, func() bool {
		send("engine-m", http("http://10.9.9.9:1"))
		time.Sleep(20 * time.Millisecond)
		_, ok := s.Endpoints("m", "engine-m")
		return ok
	})
	marker = 1
	cases := []struct {
		name, engine string
		ts           []messages.Transport
		reason       string // "" when accepted
		wantURL      string // engine's URL after the case ("" unknown)
	}{
		{"pinned engine at its URL", "engine-a", []messages.Transport{http("http://127.0.0.1:8001/"), nats("sy.infer.m.engine-a")}, "", "http://127.0.0.1:8001"},
		{"pinned engine at another loopback port", "engine-a", []messages.Transport{http("http://127.0.0.1:8002")}, endpoints.ReasonURL, "http://127.0.0.1:8001"},
		{"pinned engine at an attacker's address", "engine-a", []messages.Transport{http("http://203.0.113.7")}, endpoints.ReasonURL, "http://127.0.0.1:8001"},
		{"pinned engine, another's subject", "engine-a", []messages.Transport{http("http://127.0.0.1:8001"), nats("sy.infer.m.engine-b")}, endpoints.ReasonSubject, "http://127.0.0.1:8001"},
		{"unknown engine outside the range", "rogue", []messages.Transport{http("http://127.0.0.1:9")}, endpoints.ReasonURL, ""},
		{"unknown engine on the request subject", "rogue", []messages.Transport{nats("sy.req.A.m")}, endpoints.ReasonSubject, ""},
		{"engine in the range", "engine-x", []messages.Transport{http("http://10.1.2.3:8000")}, "", "http://10.1.2.3:8000"},
		{"engine in the range moves out", "engine-x", []messages.Transport{http("http://192.0.2.1:8000")}, endpoints.ReasonURL, "http://10.1.2.3:8000"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := refused(c.reason)
			send(c.engine, c.ts...)
			settle()
			if c.reason != "" {
				if got := refused(c.reason) - before; got != 1 {
					t.Errorf("refused{reason=%s} rose by %v, want 1", c.reason, got)
				}
			}
			ep, ok := s.Endpoints("m", c.engine)
			if c.wantURL == "" {
				if ok {
					t.Fatalf("engine %s known with %+v, want its signals ignored", c.engine, ep)
				}
				return
			}
			if ep.URL != c.wantURL {
				t.Fatalf("engine %s at %q, want %q", c.engine, ep.URL, c.wantURL)
			}
		})
	}
	if got := refused(endpoints.ReasonURL) + refused(endpoints.ReasonSubject); got != 6 {
		t.Errorf("%v signals refused in all, want 6", got)
	}
}

func itoa(i int) string {
	b := []byte{}
	for ; i > 0 || len(b) == 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}

func waitFor(t *testing.T, within time.Duration, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(within); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("condition not met within %s", within)
		}
	}
}
