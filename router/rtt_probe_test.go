package router_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/testenv"
)

// reportLog collects the router reports published on a NATS server, by
// router name.
type reportLog struct {
	mu   sync.Mutex
	reps map[string][]messages.RouterReport
	bad  []error
}

func collectReports(t *testing.T, env *testenv.NATS) *reportLog {
	t.Helper()
	l := &reportLog{reps: map[string][]messages.RouterReport{}}
	nc := env.Dial(t, "reports")
	sub, err := nc.Subscribe(env.Names.ReportFilter(), func(m *nats.Msg) {
		var r messages.RouterReport
		err := messages.DecodeInto(m.Data, &r)
		l.mu.Lock()
		defer l.mu.Unlock()
		if err != nil {
			l.bad = append(l.bad, err)
			return
		}
		l.reps[r.Router] = append(l.reps[r.Router], r)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return l
}

// rtt returns the RTT router last reported for engine, and whether any
// report carried one.
func (l *reportLog) rtt(router, engine string) (float64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var d float64
	var ok bool
	for _, r := range l.reps[router] {
		if v, has := r.RTTMs[engine]; has {
			d, ok = v, true
		}
	}
	return d, ok
}

// since counts router's reports stamped after t.
func (l *reportLog) since(router string, t time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.reps[router] {
		if r.Time > t.UnixMilli() {
			n++
		}
	}
	return n
}

// engineErrors sums the errors and timeouts router reported for engine.
func (l *reportLog) engineErrors(router, engine string) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var n int64
	for _, r := range l.reps[router] {
		o := r.Engines[engine]
		n += o.Timeouts
		for _, c := range o.Errors {
			n += c
		}
	}
	return n
}

// vllmLikeEngine serves what vLLM serves: /health and the OpenAI API, and
// 404 on anything else (/healthz among them). It counts hits per path.
type vllmLikeEngine struct {
	srv  *httptest.Server
	mu   sync.Mutex
	hits map[string]int
	// lastMiss is when /healthz was last asked for.
	lastMiss time.Time
}

func newVLLMLikeEngine(t *testing.T, name string) *vllmLikeEngine {
	t.Helper()
	e := &vllmLikeEngine{hits: map[string]int{}}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.hits[r.URL.Path]++
		e.mu.Unlock()
		switch r.URL.Path {
		case "/health":
			w.WriteHeader(http.StatusOK)
		case "/v1/chat/completions":
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"x","object":"chat.completion","engine":%q}`, name)
		default:
			if r.URL.Path == "/healthz" {
				e.mu.Lock()
				e.lastMiss = time.Now()
				e.mu.Unlock()
			}
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *vllmLikeEngine) count(path string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.hits[path]
}

// TestRTTProbeModes runs one router per probe mode in front of an engine
// that, like vLLM, answers 404 on /healthz: the tcp default and http:/health
// measure the RTT; http:/healthz measures none, and in no mode does the
// probe count against the engine, which keeps serving.
func TestRTTProbeModes(t *testing.T) {
	env := testenv.StartNATS(t)
	eng := newVLLMLikeEngine(t, "v1")
	publishSignals(t, env.Dial(t, "engines"), env.Names, 100*time.Millisecond,
		fakeSignal{model: "m", engine: "v1", capacity: 10, health: 1, url: eng.srv.URL})
	log := collectReports(t, env)
	svcs := map[string]*router.Service{}
	for name, probe := range map[string]string{"r-default": "", "r-tcp": "tcp", "r-health": "http:/health", "r-healthz": "http:/healthz"} {
		svcs[name] = runService(t, router.ServiceOptions{Conn: env.Dial(t, name), Cluster: "A", Router: name,
			ReportInterval: 100 * time.Millisecond, RTTProbe: probe})
	}
	testenv.WaitFor(t, 10*time.Second, "RTTs from the tcp, default and http:/health probes", func() bool {
		_, a := log.rtt("r-default", "v1")
		_, b := log.rtt("r-tcp", "v1")
		_, c := log.rtt("r-health", "v1")
		return a && b && c
	})
	for _, r := range []string{"r-default", "r-tcp", "r-health"} {
		d, _ := log.rtt(r, "v1")
		if d <= 0 || d > 1000 {
			t.Errorf("%s reported RTT %.3f ms to a loopback engine", r, d)
		}
		t.Logf("%s: RTT %.3f ms", r, d)
	}
	if n := eng.count("/health"); n == 0 {
		t.Errorf("the http:/health router never asked for /health")
	}
	// The http:/healthz router probed (and got 404): its reports after that
	// probe must carry no RTT.
	testenv.WaitFor(t, 10*time.Second, "the /healthz probe answered 404", func() bool { return eng.count("/healthz") > 0 })
	eng.mu.Lock()
	missed := eng.lastMiss
	eng.mu.Unlock()
	testenv.WaitFor(t, 10*time.Second, "three reports after the 404", func() bool { return log.since("r-healthz", missed) >= 3 })
	if d, ok := log.rtt("r-healthz", "v1"); ok {
		t.Errorf("a probe answered 404 was reported as an RTT of %.3f ms", d)
	}
	// Nothing counts against the engine: each router still routes to it,
	// and none reports an error of it.
	client := &http.Client{}
	for name, svc := range svcs {
		testenv.WaitFor(t, 5*time.Second, name+" routable", func() bool {
			tb, _, ok := svc.Store().Table("m")
			return ok && tb.Slots() > 0
		})
		if status, got, body := postChat(t, client, svc.Addr(), chatJSON("m", false, "hi"), ""); status != 200 || got != "v1" {
			t.Errorf("%s: status %d engine %q body %s", name, status, got, body)
		}
		if n := log.engineErrors(name, "v1"); n != 0 {
			t.Errorf("%s reported %d errors of v1", name, n)
		}
		if r := readiness(t, svc.Addr()); !r.Ready {
			t.Errorf("%s not ready: %+v", name, r)
		}
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	if len(log.bad) > 0 {
		t.Fatalf("bad reports: %v", log.bad)
	}
}

// TestRTTProbeTCP probes, with the default probe, an engine address where
// a plain TCP listener (no HTTP at all) accepts, and one where connects are
// refused: the first gets an RTT, the second none.
func TestRTTProbeTCP(t *testing.T) {
	env := testenv.StartNATS(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	goneURL := "http://" + gone.Addr().String()
	_ = gone.Close() // connects there are refused from now on
	publishSignals(t, env.Dial(t, "engines"), env.Names, 100*time.Millisecond,
		fakeSignal{model: "m", engine: "raw", capacity: 10, health: 1, url: "http://" + ln.Addr().String()},
		fakeSignal{model: "m", engine: "gone", capacity: 10, health: 1, url: goneURL})
	log := collectReports(t, env)
	start := time.Now()
	runService(t, router.ServiceOptions{Conn: env.Dial(t, "router"), Cluster: "A", Router: "r1",
		ReportInterval: 100 * time.Millisecond})
	testenv.WaitFor(t, 10*time.Second, "an RTT to the plain TCP listener", func() bool {
		_, ok := log.rtt("r1", "raw")
		return ok
	})
	if accepted.Load() == 0 {
		t.Errorf("RTT reported without a connect to the listener")
	}
	// Both endpoints are probed in the same round: later reports show the
	// refused one still without an RTT.
	testenv.WaitFor(t, 10*time.Second, "three more reports", func() bool { return log.since("r1", start.Add(300*time.Millisecond)) >= 3 })
	if d, ok := log.rtt("r1", "gone"); ok {
		t.Errorf("a refused connect was reported as an RTT of %.3f ms", d)
	}
}

// TestRTTProbeValidation checks that a service refuses an invalid RTT
// probe and names the field (CheckRTTProbe's cases are router/control's).
func TestRTTProbeValidation(t *testing.T) {
	env := testenv.StartNATS(t)
	_, err := router.NewService(router.ServiceOptions{Conn: env.Dial(t, "router"), Cluster: "A", HTTPAddr: "127.0.0.1:0",
		RTTProbe: "http:health"})
	if !errors.Is(err, control.ErrBadRTTProbe) || !strings.Contains(err.Error(), "RTTProbe") {
		t.Fatalf("NewService with RTTProbe http:health: %v, want control.ErrBadRTTProbe naming RTTProbe", err)
	}
}
