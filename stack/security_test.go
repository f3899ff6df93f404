package stack_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-dev/switchyard/auth"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/stack"
	"github.com/switchyard-dev/switchyard/streams"
)

// TestSecureStack runs the stack as `switchyard up` does by default (its
// identities, TLS on the client port) and replays the bus attacks of a
// hostile probe, each from the identity that would try it (or none): each
// must be refused by the server, a permissions violation its client sees,
// and the stack must keep serving every valid request throughout.
func TestSecureStack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := hostileStart(t, ctx, hostileOptions{secure: true})
	m := h.s.Auth()
	url := h.s.NATSURL()

	t.Run("anonymous", func(t *testing.T) {
		for _, opts := range [][]nats.Option{
			{nats.RootCAs(m.Path(auth.CAFile))},                                  // no identity
			{nats.UserCredentials(m.CredsFile("engine-a"))},                      // no TLS
			{nats.UserInfo("admin", "admin"), nats.RootCAs(m.Path(auth.CAFile))}, // a password
		} {
			if nc, err := nats.Connect(url, append(opts, nats.MaxReconnects(0))...); err == nil {
				nc.Close()
				t.Errorf("connected to %s without an identity of the stack", url)
			}
		}
	})

	engB := connectAs(t, m, url, "engine-b")
	routerA := connectAs(t, m, url, stack.RouterIdentity("A"))
	reader := connectAs(t, m, url, stack.ReaderIdentity)
	attacks := []struct {
		name string
		as   *identityConn
		do   func(nc *nats.Conn) error
	}{
		{"forged signal for another engine", engB, pub("sy.signal.llama.engine-a")},
		{"a made-up engine's signal", engB, pub("sy.signal.llama.rogue")},
		{"forged report (demand, outcomes, RTT)", engB, pub("sy.report.llama.B.B-1")},
		{"report for another cluster", routerA, pub("sy.report.llama.B.B-1")},
		{"engine state write", engB, pub("$KV.sy_engines.llama.engine-a")},
		{"demand write", routerA, pub("$KV.sy_demand.llama.A")},
		{"weights write by a router", routerA, pub("$KV.sy_weights.llama.A")},
		{"lease write by a router", routerA, pub("$KV.sy_leases.optimizer")},
		{"weights purge by a router", routerA, pub("$JS.API.STREAM.PURGE.KV_sy_weights")},
		{"engine drain without admin", routerA, pub("$KV.sy_engines.operator.engine-c")},
		{"engine inject without admin", reader, pub("sy.ctl.engine.engine-a")},
		{"calling an engine directly", engB, pub("sy.infer.llama.engine-a")},
		{"reading requests", engB, sub("sy.req.>", "")},
		{"reading another cluster's requests", routerA, sub("sy.req.B.>", "sy-router-B")},
		{"reading inference", routerA, sub("sy.infer.>", "")},
		{"reading inference as an engine", engB, sub("sy.infer.llama.engine-a", "")},
		{"reading others' replies", reader, sub("_INBOX.>", "")},
		{"reading another identity's replies", engB, sub("_INBOX_router-A.>", "")},
		{"joining the routers' queue group", engB, sub("sy.req.A.llama", "sy-router-A")},
		{"stealing the aggregator's signals", reader, pub("$JS.API.CONSUMER.MSG.NEXT.SY_SIGNALS.sy-aggregator-signals")},
	}
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			a.as.drain()
			if err := a.do(a.as.nc); err != nil && !isViolation(err) {
				t.Fatal(err)
			}
			if err := a.as.nc.FlushTimeout(5 * time.Second); err != nil && !isViolation(err) {
				t.Fatal(err)
			}
			if err := a.as.violation(); err != nil {
				t.Fatalf("%s as %s: %v", a.name, a.as.name, err)
			}
		})
	}

	// Pre-sending another engine's next Nats-Msg-Ids from a subject the
	// attacker may publish: the ids it can guess are not the engine's.
	// The attacker knows engine-a's sequence number (signals say it) and
	// the id's old shape, <engine>-<seq>, and sends its next 400.
	t.Run("Nats-Msg-Id pre-sending", func(t *testing.T) {
		var seen messages.EngineSignal
		h.capture("sy.signal.llama.engine-a", &seen)
		for i := range 400 {
			msg := nats.NewMsg("sy.signal.llama.engine-b")
			msg.Header.Set(nats.MsgIdHdr, fmt.Sprintf("engine-a-%d", seen.Seq+uint64(i)+1))
			msg.Data = []byte{0xc0}
			if err := engB.nc.PublishMsg(msg); err != nil {
				t.Fatal(err)
			}
		}
		if err := engB.nc.FlushTimeout(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	})
	// engine-b may publish only its own subject; a signal there that
	// claims to be engine-a is rejected and counted by reason "subject" by
	// the aggregator and by every router.
	t.Run("names disagree with the subject", func(t *testing.T) {
		var sig messages.EngineSignal
		h.capture("sy.signal.llama.engine-a", &sig)
		sig.Seq++
		sig.Time = time.Now().UnixMilli()
		agg := metricRef{"switchyard_aggregator_bad_messages_total", map[string]string{"stream": "signals", "reason": "subject"}}
		rt := metricRef{"switchyard_router_signals_rejected_total", map[string]string{"reason": "subject"}}
		aggBefore, rtBefore := h.sum([]metricRef{agg}), h.sum([]metricRef{rt})
		if err := engB.nc.Publish("sy.signal.llama.engine-b", mustEncode(t, &sig)); err != nil {
			t.Fatal(err)
		}
		h.requireRise("a signal for engine-a on engine-b's subject", []metricRef{agg}, aggBefore, 1, 5*time.Second)
		h.requireRise("a signal for engine-a on engine-b's subject", []metricRef{rt}, rtBefore, float64(len(h.s.Routers())), 5*time.Second)
	})
	// engine-b's own identity, on its own subject, advertises an address
	// that is not its own: an attacker's, and engine-a's loopback port.
	// The stack's policy pins every engine to the address it listens on:
	// every router and the aggregator ignore those signals and count them,
	// sy_engines (what the dashboard shows) never holds another address for
	// engine-b, no request reaches the attacker, and router B's traffic
	// still reaches engine-b.
	t.Run("engine-b advertises another endpoint", func(t *testing.T) {
		attacker, hits := attackerServer(t)
		var engA, engBURL string
		for _, e := range h.s.Engines() {
			switch e.Name() {
			case "engine-a":
				engA = e.URL()
			case "engine-b":
				engBURL = e.URL()
			}
		}
		var routerB *router.Service
		for _, r := range h.s.Routers() {
			if r.Name() == "B-1" {
				routerB = r
			}
		}
		if engA == "" || engBURL == "" || routerB == nil {
			t.Fatal("the stack has no engine-a, engine-b or router B-1")
		}
		var sig messages.EngineSignal
		h.capture("sy.signal.llama.engine-b", &sig)
		refused := []metricRef{{"switchyard_router_endpoints_refused_total", map[string]string{"reason": "url"}}}
		before := h.sum(refused)
		aggRefused := []metricRef{{"switchyard_aggregator_endpoints_refused_total", map[string]string{"reason": "url"}}}
		aggBefore := h.sum(aggRefused)
		stored := h.watchURLs("engine-b")
		const rounds = 5
		for i := range rounds {
			for j, u := range []string{attacker.URL, engA} {
				f := sig
				f.Seq += uint64(2*i + j + 1)
				f.Time = time.Now().UnixMilli()
				f.Transports = []messages.Transport{{Kind: messages.TransportHTTP, Address: u}}
				if err := engB.nc.Publish("sy.signal.llama.engine-b", mustEncode(t, &f)); err != nil {
					t.Fatal(err)
				}
			}
			if err := engB.nc.FlushTimeout(5 * time.Second); err != nil {
				t.Fatal(err)
			}
			for k := range 3 {
				if code := h.chat(routerB, 1000+3*i+k); code != http.StatusOK {
					t.Errorf("router B answered %d while engine-b's identity advertised other addresses", code)
				}
			}
		}
		h.requireRise("engine-b advertising other addresses", refused, before, float64(2*rounds*len(h.s.Routers())), 5*time.Second)
		h.requireRise("engine-b advertising other addresses", aggRefused, aggBefore, 2*rounds, 5*time.Second)
		written := len(stored())
		h.checkFor(5*time.Second, "engine-b's state rewritten in sy_engines after the forgeries", func() (bool, string) {
			return len(stored()) > written, fmt.Sprintf("%d writes seen", len(stored()))
		})
		for i, u := range stored() {
			if u != engBURL {
				t.Errorf("write %d of engine-b's state in sy_engines advertises %q, want its own %q", i, u, engBURL)
			}
		}
		for _, r := range h.s.Routers() {
			if ep, _ := r.Signals().Endpoints(hostileModel, "engine-b"); ep.URL != engBURL {
				t.Errorf("router %s has engine-b at %q, want its own %q", r.Name(), ep.URL, engBURL)
			}
		}
		served := []metricRef{{"switchyard_router_engine_requests_total", map[string]string{"engine": "engine-b", "code": "200"}}}
		servedBefore := h.sum(served)
		session := 2000
		h.checkFor(10*time.Second, "router B's requests reach engine-b", func() (bool, string) {
			session++
			code := h.chat(routerB, session)
			return h.sum(served) > servedBefore, fmt.Sprintf("last answer %d; engine-b served %v", code, h.sum(served)-servedBefore)
		})
		if n := hits.Load(); n != 0 {
			t.Errorf("the attacker's server got %d requests", n)
		}
	})
	// An engine no one configured, announced by an identity that may
	// publish anything (a leaked admin's, a leaf's): its signals advertise
	// the attacker's URL. Routers and the aggregator ignore them (so
	// sy_engines, which the optimizer plans from, never lists it), no
	// snapshot weighs it, and no request reaches it.
	t.Run("an engine no one configured", func(t *testing.T) {
		attacker, hits := attackerServer(t)
		var sig messages.EngineSignal
		h.capture("sy.signal.llama.engine-b", &sig)
		sig.Engine = "rogue"
		sig.Transports = []messages.Transport{{Kind: messages.TransportHTTP, Address: attacker.URL}}
		refused := []metricRef{{"switchyard_router_endpoints_refused_total", map[string]string{"reason": "url"}}}
		before := h.sum(refused)
		aggRefused := []metricRef{{"switchyard_aggregator_endpoints_refused_total", map[string]string{"reason": "url"}}}
		aggBefore := h.sum(aggRefused)
		for i := range 20 { // 4 s at 200 ms, past the optimizer's grace
			sig.Seq++
			sig.Time = time.Now().UnixMilli()
			h.publish("sy.signal.llama.rogue", mustEncode(t, &sig))
			if code := h.chat(h.s.Routers()[i%len(h.s.Routers())], 3000+i); code != http.StatusOK {
				t.Errorf("a router answered %d while a rogue engine signalled", code)
			}
			time.Sleep(200 * time.Millisecond)
		}
		h.flush()
		h.requireRise("a rogue engine's signals", refused, before, float64(20*len(h.s.Routers())), 5*time.Second)
		h.requireRise("a rogue engine's signals", aggRefused, aggBefore, 20, 5*time.Second)
		if st := h.engineState("rogue"); st != nil {
			t.Errorf("sy_engines holds the rogue engine, advertising %v", st.Transports)
		}
		for _, c := range h.s.File().Clusters {
			key, _ := streams.WeightsKey(hostileModel, c.Name)
			var snap messages.WeightSnapshot
			if h.readState("sy_weights", key, &snap) && snap.Weights["rogue"] > 0 {
				t.Errorf("cluster %s's snapshot gives the rogue engine weight %v", c.Name, snap.Weights["rogue"])
			}
		}
		if n := hits.Load(); n != 0 {
			t.Errorf("the attacker's server got %d requests", n)
		}
	})
	h.requireStaysHealthy("after the attacks", 2*time.Second)
	h.requireHealthy("after the attacks")
	if v := h.log.violationLines(); len(v) == 0 {
		t.Error("the server logged none of the violations")
	}
	for _, l := range h.log.violationLines() {
		for _, own := range []string{"switchyard-up-aggregator", "switchyard-up-optimizer", "switchyard-up-engine", "switchyard-up-router", "switchyard-up-admin", "switchyard-up-reader"} {
			if strings.Contains(l, own) {
				t.Errorf("a component of the stack hit its own permissions: %s", l)
			}
		}
	}
}

// attackerServer is an HTTP server on 127.0.0.1 that answers every
// request with a forged completion, and counts them.
func attackerServer(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	hits := &atomic.Int64{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"forged"},"finish_reason":"stop"}]}`)
	}))
	t.Cleanup(srv.Close)
	return srv, hits
}

// identityConn is a client of the stack's server as one identity, with
// the asynchronous errors the server sent it.
type identityConn struct {
	name string
	nc   *nats.Conn
	errs chan error
}

func connectAs(t *testing.T, m *auth.Material, url, identity string) *identityConn {
	t.Helper()
	c := &identityConn{name: identity, errs: make(chan error, 64)}
	nc, err := nats.Connect(url, nats.UserCredentials(m.CredsFile(identity)), nats.RootCAs(m.Path(auth.CAFile)),
		nats.CustomInboxPrefix("_INBOX_"+identity), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case c.errs <- err:
			default:
			}
		}))
	if err != nil {
		t.Fatalf("connect as %s: %v", identity, err)
	}
	t.Cleanup(nc.Close)
	c.nc = nc
	return c
}

// drain forgets the errors of earlier attacks.
func (c *identityConn) drain() {
	for {
		select {
		case <-c.errs:
		default:
			return
		}
	}
}

// violation waits for the server's permissions violation.
func (c *identityConn) violation() error {
	select {
	case err := <-c.errs:
		if isViolation(err) {
			return nil
		}
		return fmt.Errorf("got %v, want a permissions violation", err)
	case <-time.After(5 * time.Second):
		return fmt.Errorf("allowed: no permissions violation within 5 s")
	}
}

func isViolation(err error) bool {
	return err != nil && strings.Contains(strings.ToLower(err.Error()), "permissions violation")
}

func pub(subject string) func(*nats.Conn) error {
	return func(nc *nats.Conn) error { return nc.Publish(subject, []byte{0xc0}) }
}

func sub(subject, queue string) func(*nats.Conn) error {
	return func(nc *nats.Conn) error {
		if queue != "" {
			_, err := nc.QueueSubscribeSync(subject, queue)
			return err
		}
		_, err := nc.SubscribeSync(subject)
		return err
	}
}

func mustEncode(t *testing.T, m messages.Message) []byte {
	t.Helper()
	b, err := messages.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
