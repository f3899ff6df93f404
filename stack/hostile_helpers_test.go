package stack_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/switchyard-dev/switchyard/auth"
	"github.com/switchyard-dev/switchyard/auth/endpoints"
	"github.com/switchyard-dev/switchyard/dashboard"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/services/aggregator"
	"github.com/switchyard-dev/switchyard/stack"
	"github.com/switchyard-dev/switchyard/testenv"
)

// The hostile-input suite runs the stack as `switchyard up` runs it (the
// built-in case study, 200 ms signals, the services' default options, the
// network emulated) and attacks it through the channels anyone with access
// has: a plain nats.go client on the embedded server's TCP port, KV puts,
// and HTTP over 127.0.0.1. These bounds are what an operator can expect of
// the defaults; they are not tuned to any one input.
const (
	// hostileModel is the built-in stack's model.
	hostileModel = "llama"
	// hostileRecover bounds how long the stack may take to serve every
	// valid request again after an input: a few of the aggregator's
	// default down-after periods (6 s), so that an engine wrongly marked
	// down has time to come back, but far less than the minutes the
	// unfixed stack needed (85 s of shedding, 5 min of crash loops).
	hostileRecover = 20 * time.Second
	// hostileProbeRequests is how many valid requests each router must
	// answer with 200 once recovered: none may be shed or fail.
	hostileProbeRequests = 12
)

// hostileEnv is one running stack under attack, with what a case inspects:
// the services' metrics, the captured log, a plain client of the embedded
// NATS server, and the dashboard over a real socket.
type hostileEnv struct {
	t       *testing.T
	ctx     context.Context
	dir     string
	s       *stack.Stack
	reg     *prometheus.Registry
	log     *lineCounter
	nc      *nats.Conn
	js      jetstream.JetStream
	dashURL string
	client  *http.Client
	// probed, set by hostileStart with a probe, returns the statuses of
	// the valid requests sent from the start.
	probed func() map[int]int
}

// hostileOptions are what a hostile test may change in the stack `up` runs.
type hostileOptions struct {
	// dir is the data dir; empty means a new one.
	dir string
	// probe, when set, sends valid requests to every router from the
	// moment the stack has started, for that long (see startProbe);
	// h.probed waits for their statuses.
	probe time.Duration
	// aggregator holds aggregator options (zero: `up`'s defaults).
	aggregator aggregator.Options
	// secure runs the stack as `up` does by default: every component with
	// its own identity, TLS on the client port, anonymous clients refused;
	// h.nc is then the admin identity over TLS.
	secure bool
}

// hostileStart starts the stack as `up` runs it, with the dashboard served
// on a 127.0.0.1 port, and waits until it serves: every engine up, every
// router on a snapshot answering valid requests.
func hostileStart(t *testing.T, ctx context.Context, o hostileOptions) *hostileEnv {
	t.Helper()
	dir, probe := o.dir, o.probe
	if dir == "" {
		dir = t.TempDir()
	}
	h := &hostileEnv{t: t, ctx: ctx, dir: dir, reg: prometheus.NewRegistry(), log: &lineCounter{},
		client: &http.Client{Timeout: 10 * time.Second}}
	log := zerolog.New(h.log).Level(zerolog.InfoLevel).With().Timestamp().Logger()
	var material *auth.Material
	if o.secure {
		var err error
		if material, err = auth.Generate(auth.Options{Dir: dir + "/auth", Identities: stack.Identities(stack.Default())}); err != nil {
			t.Fatal(err)
		}
	}
	s, err := stack.Start(ctx, stack.Options{DataDir: dir, NATSHost: "127.0.0.1", NATSPort: -1,
		SignalInterval: 200 * time.Millisecond, RouterAddr: "127.0.0.1:0", EmulateNetwork: true,
		Aggregator: o.aggregator, Logger: log, Registerer: h.reg, Auth: material})
	if err != nil {
		t.Fatalf("start the stack on %s: %v", dir, err)
	}
	h.s = s
	t.Cleanup(h.stop)
	if probe > 0 {
		h.probed = h.startProbe(probe)
	}

	dash, err := dashboard.New(dashboard.Options{Conn: s.Conn(), Logger: log, Routers: dashboard.RouterStatuses(s.Routers)})
	if err != nil {
		t.Fatal(err)
	}
	dctx, stopDash := context.WithCancel(context.Background())
	dashDone := make(chan struct{})
	go func() { defer close(dashDone); _ = dash.Run(dctx) }()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: dash.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	h.dashURL = "http://" + l.Addr().String()
	t.Cleanup(func() { _ = srv.Close(); stopDash(); <-dashDone })

	// The attacker: a plain nats.go client over TCP, no Switchyard helpers
	// (the admin identity on a secure stack).
	copts := []nats.Option{nats.Name("hostile"), nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}
	if material != nil {
		copts = append(copts, nats.UserCredentials(material.CredsFile(stack.AdminIdentity)), nats.RootCAs(material.Path(auth.CAFile)))
	}
	h.nc, err = nats.Connect(s.NATSURL(), copts...)
	if err != nil {
		t.Fatalf("connect to %s: %v", s.NATSURL(), err)
	}
	t.Cleanup(h.nc.Close)
	if h.js, err = jetstream.New(h.nc); err != nil {
		t.Fatal(err)
	}
	h.requireHealthy("at start")
	return h
}

// startProbe sends valid requests to every router, one every 50 ms each,
// for d from now, and returns a function that waits until the probe ends
// and returns the statuses counted.
func (h *hostileEnv) startProbe(d time.Duration) func() map[int]int {
	out := map[int]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for _, r := range h.s.Routers() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(end) && h.ctx.Err() == nil && i < int(d/(50*time.Millisecond))+1; i++ {
				st := h.chat(r, i)
				mu.Lock()
				out[st]++
				mu.Unlock()
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}
	return func() map[int]int {
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return out
	}
}

// stop stops the stack (once).
func (h *hostileEnv) stop() {
	if h.s != nil {
		h.s.Close()
		h.s = nil
	}
}

// lineCounter is the stack's log sink: it counts lines by level and keeps
// the last few for failure messages. zerolog writes one line per Write.
type lineCounter struct {
	mu     sync.Mutex
	total  int
	warn   int // warn, error, fatal and panic lines
	recent []string
	// violations are the lines that report a NATS permissions violation.
	violations []string
}

// Write implements io.Writer.
func (c *lineCounter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total++
	for _, l := range []string{`"level":"warn"`, `"level":"error"`, `"level":"fatal"`, `"level":"panic"`} {
		if bytes.Contains(p, []byte(l)) {
			c.warn++
			break
		}
	}
	line := string(p)
	if strings.Contains(line, "Violation") && len(c.violations) < 64 {
		c.violations = append(c.violations, strings.TrimSpace(line))
	}
	if len(line) > 300 {
		line = line[:300] + "…"
	}
	c.recent = append(c.recent, strings.TrimSpace(line))
	if len(c.recent) > 8 {
		c.recent = c.recent[1:]
	}
	return len(p), nil
}

// violationLines returns the permission violations logged so far.
func (c *lineCounter) violationLines() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.violations...)
}

// counts returns the lines and warn-or-worse lines written so far.
func (c *lineCounter) counts() (total, warn int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total, c.warn
}

// last returns the last lines written.
func (c *lineCounter) last() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.recent, "\n")
}

// metric sums the series of metric name matching match over the
// aggregator's and optimizer's registry and every router's.
func (h *hostileEnv) metric(name string, match map[string]string) float64 {
	h.t.Helper()
	sum := testenv.MetricSum(h.t, h.reg, name, match)
	for _, r := range h.s.Routers() {
		sum += testenv.MetricSum(h.t, r.Handler().Metrics(), name, match)
	}
	return sum
}

// metricRef names a metric series a case expects to rise.
type metricRef struct {
	name  string
	match map[string]string
}

func (m metricRef) String() string {
	if len(m.match) == 0 {
		return m.name
	}
	var ls []string
	for k, v := range m.match {
		ls = append(ls, k+"="+v)
	}
	sort.Strings(ls)
	return m.name + "{" + strings.Join(ls, ",") + "}"
}

// sum returns the summed value of refs.
func (h *hostileEnv) sum(refs []metricRef) float64 {
	total := 0.0
	for _, r := range refs {
		total += h.metric(r.name, r.match)
	}
	return total
}

// requireAlive fails when a component of the stack stopped on its own.
func (h *hostileEnv) requireAlive(when string) {
	h.t.Helper()
	select {
	case err := <-h.s.Errors():
		h.t.Fatalf("%s: a component stopped: %v", when, err)
	default:
	}
}

// chat sends one valid chat completion to router r and returns its status
// (0 when the request failed below HTTP).
func (h *hostileEnv) chat(r *router.Service, session int) int {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello %d"}],"max_tokens":4,"user":"probe-%d"}`,
		hostileModel, session, session)
	return h.post(r, []byte(body))
}

// post sends body to r's chat completions endpoint and returns the status.
func (h *hostileEnv) post(r *router.Service, body []byte) int {
	status, _ := h.postBody(r, body)
	return status
}

// postBody is post that also returns (the start of) the answer's body.
func (h *hostileEnv) postBody(r *router.Service, body []byte) (int, string) {
	req, err := http.NewRequestWithContext(h.ctx, http.MethodPost, "http://"+r.Addr()+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b)
}

// statuses sends n valid requests (distinct sessions) to each router, all
// at once, and returns the statuses counted per router.
func (h *hostileEnv) statuses(n int) map[string]map[int]int {
	out := map[string]map[int]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, r := range h.s.Routers() {
		out[r.Name()] = map[int]int{}
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st := h.chat(r, i)
				mu.Lock()
				out[r.Name()][st]++
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	return out
}

// allOK reports whether every status in st is 200.
func allOK(st map[string]map[int]int) bool {
	for _, m := range st {
		for code := range m {
			if code != http.StatusOK {
				return false
			}
		}
	}
	return true
}

// engineState reads engine's state from sy_engines, nil when absent or
// undecodable.
func (h *hostileEnv) engineState(engine string) *messages.EngineState {
	var st messages.EngineState
	if !h.readState("sy_engines", hostileModel+"."+engine, &st) {
		return nil
	}
	return &st
}

// watchURLs watches engine's state in sy_engines from now on, and returns
// a function that gives the HTTP URL (endpoints.Of) of every value written
// since, in order.
func (h *hostileEnv) watchURLs(engine string) func() []string {
	h.t.Helper()
	kv, err := h.js.KeyValue(h.ctx, "sy_engines")
	if err != nil {
		h.t.Fatal(err)
	}
	w, err := kv.Watch(h.ctx, hostileModel+"."+engine, jetstream.UpdatesOnly())
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = w.Stop() })
	var mu sync.Mutex
	var urls []string
	go func() {
		for e := range w.Updates() {
			var st messages.EngineState
			if e == nil || e.Operation() != jetstream.KeyValuePut || messages.DecodeInto(e.Value(), &st) != nil {
				continue
			}
			u, _ := endpoints.Of(st.Transports)
			mu.Lock()
			urls = append(urls, u)
			mu.Unlock()
		}
	}()
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(urls)
	}
}

// readState decodes the value of key in bucket into m, and reports whether
// it was there and decoded.
func (h *hostileEnv) readState(bucket, key string, m messages.Message) bool {
	kv, err := h.js.KeyValue(h.ctx, bucket)
	if err != nil {
		return false
	}
	return readValue(h.ctx, kv, key, m)
}

// fleetState describes what is not yet healthy, "" when everything is:
// every simulated engine up in sy_engines, every router on a snapshot (not
// its local policy), every router answering valid requests with 200, and
// the dashboard answering /api/state.
func (h *hostileEnv) fleetState() string {
	for _, e := range h.s.Engines() {
		st := h.engineState(e.Name())
		if st == nil {
			return e.Name() + ": no readable state in sy_engines"
		}
		if st.Status != messages.StatusUp {
			return fmt.Sprintf("%s is %s in sy_engines", e.Name(), st.Status)
		}
	}
	for _, r := range h.s.Routers() {
		if m := r.Handler().Readiness().Mode; m != control.ModeSnapshot {
			return fmt.Sprintf("router %s routes in mode %s", r.Name(), m)
		}
	}
	if st := h.statuses(3); !allOK(st) {
		return fmt.Sprintf("valid requests answered %v", st)
	}
	if _, _, err := h.dashboardState(); err != nil {
		return "dashboard: " + err.Error()
	}
	return ""
}

// requireHealthy waits up to hostileRecover for the fleet to be healthy,
// then requires hostileProbeRequests valid requests on every router to be
// answered 200: none shed (429), none unavailable (503), none failed.
func (h *hostileEnv) requireHealthy(when string) time.Duration {
	h.t.Helper()
	start := time.Now()
	last := ""
	ok := false
	for deadline := start.Add(hostileRecover); ; {
		h.requireAlive(when)
		if last = h.fleetState(); last == "" {
			ok = true
			break
		}
		if time.Now().After(deadline) || h.ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !ok {
		h.t.Fatalf("%s: the stack did not recover within %s: %s\nlast log lines:\n%s", when, hostileRecover, last, h.log.last())
	}
	took := time.Since(start)
	if st := h.statuses(hostileProbeRequests); !allOK(st) {
		h.t.Fatalf("%s: after recovering, valid requests were answered %v (want every one 200)", when, st)
	}
	h.requireAlive(when)
	return took
}

// requireStaysHealthy requires the fleet to stay healthy (see fleetState)
// at every check over window.
func (h *hostileEnv) requireStaysHealthy(when string, window time.Duration) {
	h.t.Helper()
	for end := time.Now().Add(window); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		h.requireAlive(when)
		if reason := h.fleetState(); reason != "" {
			h.t.Fatalf("%s: the stack recovered, then relapsed: %s\nlast log lines:\n%s", when, reason, h.log.last())
		}
	}
}

// requireRise waits up to within for the sum of refs to rise by at least
// min above before.
func (h *hostileEnv) requireRise(when string, refs []metricRef, before, min float64, within time.Duration) {
	h.t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := h.sum(refs) - before
		if got >= min {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s: %v rose by %.0f within %s, want at least %.0f (the input was not counted)", when, refs, got, within, min)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// publish publishes data on subject with the attacker's connection and
// flushes, so that the server has it.
func (h *hostileEnv) publish(subject string, data []byte) {
	h.t.Helper()
	if err := h.nc.Publish(subject, data); err != nil {
		h.t.Fatalf("publish on %s: %v", subject, err)
	}
}

// flush waits until the server has everything published so far.
func (h *hostileEnv) flush() {
	h.t.Helper()
	if err := h.nc.FlushTimeout(10 * time.Second); err != nil {
		h.t.Fatalf("flush: %v", err)
	}
}

// kvPut puts value under key in bucket with the attacker's connection.
func (h *hostileEnv) kvPut(bucket, key string, value []byte) {
	h.t.Helper()
	kv, err := h.js.KeyValue(h.ctx, bucket)
	if err != nil {
		h.t.Fatalf("bucket %s: %v", bucket, err)
	}
	if _, err := kv.Put(h.ctx, key, value); err != nil {
		h.t.Fatalf("put %s/%s: %v", bucket, key, err)
	}
}

// capture returns the next message published on subject (a real engine's
// signal, a real router's report), decoded into m.
func (h *hostileEnv) capture(subject string, m messages.Message) {
	h.t.Helper()
	sub, err := h.nc.SubscribeSync(subject)
	if err != nil {
		h.t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		msg, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			break
		}
		if messages.DecodeInto(msg.Data, m) == nil {
			return
		}
	}
	h.t.Fatalf("no valid %s seen on %s within 10s", m.MessageKind(), subject)
}

// rawEncode encodes m as the services encode messages, but without
// stamping or validating it: what a careless or hostile writer can send.
func rawEncode(t *testing.T, m any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	if err := enc.Encode(m); err != nil {
		t.Fatalf("encode %T: %v", m, err)
	}
	return buf.Bytes()
}

// mp hand-encodes MessagePack, so that a test can write the container
// headers no encoder would write for the data that follows.
type mp []byte

// fixmap, map16 or map32 header of n entries.
func (b mp) mapHdr(n uint32) mp {
	switch {
	case n < 16:
		return append(b, 0x80|byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, 0xde), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(b, 0xdf), n)
	}
}

// map32 header claiming n entries, whatever n.
func (b mp) map32(n uint32) mp { return binary.BigEndian.AppendUint32(append(b, 0xdf), n) }

// array32 header claiming n elements.
func (b mp) array32(n uint32) mp { return binary.BigEndian.AppendUint32(append(b, 0xdd), n) }

// array16 header claiming n elements.
func (b mp) array16(n uint16) mp { return binary.BigEndian.AppendUint16(append(b, 0xdc), n) }

// str32 header claiming n bytes of string.
func (b mp) str32(n uint32) mp { return binary.BigEndian.AppendUint32(append(b, 0xdb), n) }

// bin32 header claiming n bytes.
func (b mp) bin32(n uint32) mp { return binary.BigEndian.AppendUint32(append(b, 0xc6), n) }

// ext32 header claiming n bytes of extension type typ.
func (b mp) ext32(n uint32, typ int8) mp {
	return append(binary.BigEndian.AppendUint32(append(b, 0xc9), n), byte(typ))
}

// str appends a string (fixstr or str8).
func (b mp) str(s string) mp {
	if len(s) < 32 {
		return append(append(b, 0xa0|byte(len(s))), s...)
	}
	return append(append(b, 0xd9, byte(len(s))), s...)
}

// uint appends a positive fixint (v < 128).
func (b mp) fixint(v byte) mp { return append(b, v&0x7f) }

// poison returns a message of kind kind, {"v":1,"k":kind,<key>:<tail>},
// where tail is a hand-written value: the shape of the probe's poison
// messages (with key "tx" and an array32 header of 2^31−1 elements, 21
// bytes for a signal).
func poison(kind messages.Kind, key string, tail mp) []byte {
	b := mp(nil).mapHdr(3).str("v").fixint(1).str("k").str(string(kind)).str(key)
	return append(b, tail...)
}

// dashboardState fetches the dashboard's /api/state over HTTP and returns
// its size in bytes and how many engines it lists.
func (h *hostileEnv) dashboardState() (size, engines int, err error) {
	req, err := http.NewRequestWithContext(h.ctx, http.MethodGet, h.dashURL+"/api/state", nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return 0, 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return len(b), 0, fmt.Errorf("/api/state answered %d", resp.StatusCode)
	}
	var st dashboard.State
	if err := json.Unmarshal(b, &st); err != nil {
		return len(b), 0, fmt.Errorf("/api/state: %w", err)
	}
	for _, m := range st.Models {
		engines += len(m.Engines)
	}
	return len(b), engines, nil
}

// kvKeys counts the keys of bucket with prefix.
func (h *hostileEnv) kvKeys(bucket, prefix string) (int, error) {
	kv, err := h.js.KeyValue(h.ctx, bucket)
	if err != nil {
		return 0, err
	}
	lister, err := kv.ListKeys(h.ctx)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return 0, nil
		}
		return 0, err
	}
	n := 0
	for k := range lister.Keys() {
		if strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n, nil
}

// checkFor polls cond every 20 ms until it reports true, and fails the
// test after within with msg and cond's last account of what is missing.
func (h *hostileEnv) checkFor(within time.Duration, msg string, cond func() (bool, string)) {
	h.t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) || h.ctx.Err() != nil {
			h.t.Fatalf("not within %s: %s: %s", within, msg, why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
