package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/auth"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/services/enginesim"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/streams/natsembed"
	"github.com/switchyard-dev/switchyard/testenv"
)

// routerCmd runs `switchyard router args...` until the test ends and
// checks that it then stops cleanly; it returns the command's stderr.
func routerCmd(t *testing.T, args ...string) *syncBuffer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stdout syncBuffer
	stderr := &syncBuffer{}
	done := make(chan int, 1)
	go func() { done <- run(ctx, append([]string{"router"}, args...), strings.NewReader(""), &stdout, stderr) }()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != exitOK {
				t.Errorf("router exited %d", code)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("router did not stop within 15 s")
		}
		if t.Failed() {
			t.Logf("router's stderr:\n%s", stderr.String())
		}
	})
	// Fail fast when the command ends on its own (a flag error, a port taken).
	select {
	case code := <-done:
		done <- code
		t.Fatalf("router exited %d at start:\n%s", code, stderr.String())
	case <-time.After(50 * time.Millisecond):
	}
	return stderr
}

// simEngine starts a simulated engine of model on nc (NATS inference and
// signals every 100 ms, HTTP on a free loopback port).
func simEngine(t *testing.T, nc *nats.Conn, model, name string) *enginesim.Engine {
	t.Helper()
	e, err := enginesim.New(enginesim.Options{Name: name, Model: model, MaxBatch: 64, PrefillMsPerToken: 0.001, BaseTBTMs: 0.01,
		TBTGrowthMs: 0.001, OutputTokens: 2, PromptTokens: 4, Conn: nc, SignalInterval: 100 * time.Millisecond, Seed: 1,
		Listen: "127.0.0.1:0", Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

func dial(t *testing.T, url string) *nats.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := streams.Connect(ctx, streams.ConnectOptions{URLs: []string{url}, Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// natsAsk sends a chat request for model to cluster's routers over NATS and
// returns the engine that answered it, or an error.
func natsAsk(nc *nats.Conn, cluster, model string) (string, error) {
	m := nats.NewMsg(fmt.Sprintf("sy.req.%s.%s", cluster, model))
	m.Data = fmt.Appendf(nil, `{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, model)
	r, err := nc.RequestMsg(m, 2*time.Second)
	if err != nil {
		return "", err
	}
	if s := r.Header.Get(messages.HeaderStatus); s != "200" || r.Header.Get(messages.HeaderLast) != "true" {
		return "", fmt.Errorf("status %q, last %q: %s", s, r.Header.Get(messages.HeaderLast), r.Data)
	}
	return r.Header.Get("x-switchyard-engine"), nil
}

// provision creates the layout's streams and buckets through nc.
func provision(t *testing.T, nc *nats.Conn) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := streams.Provision(ctx, js, streams.DefaultNames(), streams.ProvisionOptions{}); err != nil {
		t.Fatal(err)
	}
}

// putWeights writes a snapshot giving engine all of model's weight in
// cluster, at generation gen.
func putWeights(t *testing.T, nc *nats.Conn, model, cluster, engine string, gen uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, streams.DefaultNames().WeightsBucket)
	if err != nil {
		t.Fatalf("weights bucket: %v", err)
	}
	data, err := messages.Encode(&messages.WeightSnapshot{Model: model, Cluster: cluster, Generation: gen,
		Time: time.Now().UnixMilli(), Weights: map[string]float64{engine: 1}})
	if err != nil {
		t.Fatal(err)
	}
	key, _ := streams.WeightsKey(model, cluster)
	if _, err := kv.Put(ctx, key, data); err != nil {
		t.Fatalf("put snapshot: %v", err)
	}
}

// installed reports whether the router at base routes model llama by a
// snapshot of generation gen, by its /readyz detail.
func installed(base string, gen uint64) bool {
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var rd router.Readiness
	if err := json.NewDecoder(resp.Body).Decode(&rd); err != nil {
		return false
	}
	m := rd.Models["llama"]
	return m.Mode == control.ModeSnapshot && m.Generation == gen
}

// waitServedByE1 waits until a NATS request for cluster A's llama on nc is
// answered by engine e1, and fails the test with what, and the last error
// seen, when it is not within d.
func waitServedByE1(t *testing.T, nc *nats.Conn, d time.Duration, what string) {
	t.Helper()
	var lastErr error
	deadline := time.Now().Add(d)
	for {
		eng, err := natsAsk(nc, "A", "llama")
		if err == nil && eng == "e1" {
			return
		}
		if err == nil {
			err = fmt.Errorf("answered by %q", eng)
		}
		lastErr = err
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s (last: %v)", d, what, lastErr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRouterEmbedNATSStandalone runs `switchyard router --embed-nats` with a
// server of its own: it provisions the layout, an engine and a client
// connect to it over TCP, requests on the NATS front reach the engine, and
// a snapshot written into its sy_weights is installed.
func TestRouterEmbedNATSStandalone(t *testing.T) {
	natsPort, httpPort := freePort(t), freePort(t)
	routerCmd(t, "--cluster", "A", "--name", "A-1", "--embed-nats", "--embed-nats-listen", fmt.Sprintf("127.0.0.1:%d", natsPort),
		"--embed-nats-data-dir", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", httpPort), "--log-level", "warn")
	url := fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	var client *nats.Conn
	testenv.WaitFor(t, 10*time.Second, "the embedded server accepts clients", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		nc, err := streams.Connect(ctx, streams.ConnectOptions{URLs: []string{url}})
		if err != nil {
			return false
		}
		client = nc
		return true
	})
	t.Cleanup(client.Close)
	simEngine(t, dial(t, url), "llama", "e1")

	waitServedByE1(t, client, 10*time.Second, "a NATS request through the co-located router is answered by e1")
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	putWeights(t, client, "llama", "A", "e1", 7)
	testenv.WaitFor(t, 10*time.Second, "the router installs generation 7 from its own server's sy_weights", func() bool {
		return installed(base, 7)
	})
	if eng, err := natsAsk(client, "A", "llama"); err != nil || eng != "e1" {
		t.Fatalf("after the snapshot: engine %q, %v", eng, err)
	}
}

// TestRouterEmbedNATSLeaf runs `switchyard router --embed-nats` as a leaf
// node of a hub, with no client listener at all (the router can only reach
// its server in-process), started before the hub: the engine and the client
// are on the hub;
// requests cross hub → leaf → router → leaf → hub → engine and back;
// snapshots written into the hub's sy_weights are installed through the
// leaf; and after the hub restarts, the router installs newer ones without
// a restart of its own.
func TestRouterEmbedNATSLeaf(t *testing.T) {
	hubPort, leafPort, httpPort := freePort(t), freePort(t), freePort(t)
	dataDir := t.TempDir()
	startHub := func() *natsembed.Server {
		t.Helper()
		hub, err := natsembed.Start(natsembed.Options{DataDir: dataDir, Port: hubPort, LeafPort: leafPort, ServerName: "hub"})
		if err != nil {
			t.Fatal(err)
		}
		return hub
	}
	// The router starts first: its leaf node joins the hub when it comes.
	routerCmd(t, "--cluster", "A", "--name", "A-1", "--embed-nats", "--embed-nats-listen", "", "--embed-nats-leaf", fmt.Sprintf("nats-leaf://127.0.0.1:%d", leafPort),
		"--listen", fmt.Sprintf("127.0.0.1:%d", httpPort), "--report-interval", "200ms", "--log-level", "warn")
	hub := startHub()
	t.Cleanup(func() { hub.Shutdown() })
	if got, want := hub.LeafURL(), fmt.Sprintf("nats-leaf://127.0.0.1:%d", leafPort); got != want {
		t.Fatalf("hub's LeafURL %q, want %q", got, want)
	}
	client := dial(t, hub.ClientURL())
	provision(t, client)
	simEngine(t, dial(t, hub.ClientURL()), "llama", "e1")
	reports, err := client.SubscribeSync(streams.DefaultNames().ReportFilter())
	if err != nil {
		t.Fatal(err)
	}

	waitServedByE1(t, client, 15*time.Second, "a NATS request on the hub is served by the leaf's router and answered by e1")
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	putWeights(t, client, "llama", "A", "e1", 1)
	testenv.WaitFor(t, 10*time.Second, "the router installs generation 1 from the hub's sy_weights", func() bool {
		return installed(base, 1)
	})
	if _, err := reports.NextMsg(5 * time.Second); err != nil {
		t.Fatalf("no router report reached the hub: %v", err)
	}

	hub.Shutdown()
	hub = startHub()
	client = dial(t, hub.ClientURL())
	testenv.WaitFor(t, 20*time.Second, "after the hub's restart, the router installs generation 2 written there", func() bool {
		putWeights(t, client, "llama", "A", "e1", 2)
		return installed(base, 2)
	})
	waitServedByE1(t, client, 10*time.Second, "requests flow again after the hub's restart")
}

// TestRouterEmbedNATSLeafSecure runs `switchyard router --embed-nats` as a
// leaf node of a hub in operator mode with mutual TLS on its leaf port, as
// a deployment of `switchyard auth` runs it: the leaf connection presents
// the leaf identity's credentials and a client certificate and checks the
// hub's certificate; requests from the hub reach the router and the
// engine, and snapshots in the hub's sy_weights are installed. Without the
// credentials, or without the CA, the leaf never joins.
func TestRouterEmbedNATSLeafSecure(t *testing.T) {
	m, err := auth.Generate(auth.Options{Dir: t.TempDir(), Identities: []auth.Identity{
		{Name: "leaf-A", Role: auth.RoleLeaf}, {Name: "e1", Role: auth.RoleEngine, Model: "llama"}}})
	if err != nil {
		t.Fatal(err)
	}
	hubPort, leafPort := freePort(t), freePort(t)
	hub, err := natsembed.Start(natsembed.Options{DataDir: t.TempDir(), Port: hubPort, LeafPort: leafPort, ServerName: "hub",
		Auth: m.ServerAuth(), TLS: m.ServerTLS(true)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hub.Shutdown)
	connect := func(identity string) *nats.Conn {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		nc, err := streams.Connect(ctx, m.Connect(identity, true, streams.ConnectOptions{URLs: []string{hub.ClientURL()}, Name: identity}))
		if err != nil {
			t.Fatalf("connect as %s: %v", identity, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	client := connect("admin")
	provision(t, client)
	simEngine(t, connect("e1"), "llama", "e1")
	leafURL := fmt.Sprintf("nats-leaf://127.0.0.1:%d", leafPort)

	// Refused: no credentials, then no CA (the hub's certificate unchecked).
	for _, bad := range []struct {
		cluster string
		args    []string
	}{
		{"X", []string{"--tls-ca", m.Path(auth.CAFile), "--tls-cert", m.Path(auth.ClientCertFile), "--tls-key", m.Path(auth.ClientKeyFile)}},
		{"Y", []string{"--creds", m.CredsFile("leaf-A")}},
	} {
		routerCmd(t, append([]string{"--cluster", bad.cluster, "--name", bad.cluster + "-1", "--embed-nats", "--embed-nats-listen", "",
			"--embed-nats-leaf", leafURL, "--listen", "", "--metrics-addr", "", "--log-level", "error"}, bad.args...)...)
	}

	httpPort := freePort(t)
	routerCmd(t, "--cluster", "A", "--name", "A-1", "--embed-nats", "--embed-nats-listen", "", "--embed-nats-leaf", leafURL,
		"--creds", m.CredsFile("leaf-A"), "--tls-ca", m.Path(auth.CAFile),
		"--tls-cert", m.Path(auth.ClientCertFile), "--tls-key", m.Path(auth.ClientKeyFile),
		"--listen", fmt.Sprintf("127.0.0.1:%d", httpPort), "--metrics-addr", "", "--report-interval", "200ms", "--log-level", "warn")
	waitServedByE1(t, client, 15*time.Second, "a NATS request on the secure hub is served by the leaf's router and answered by e1")
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	putWeights(t, client, "llama", "A", "e1", 1)
	testenv.WaitFor(t, 10*time.Second, "the router installs generation 1 from the hub's sy_weights", func() bool {
		return installed(base, 1)
	})
	if n := hub.Server().NumLeafNodes(); n != 1 {
		t.Errorf("%d leaf nodes joined the hub, want 1 (only the router with credentials and the CA)", n)
	}
}

// TestRouterFlagValidation checks that the --embed-nats and --http-server
// flags are validated before anything starts.
func TestRouterFlagValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"nats-url with embed", []string{"--embed-nats", "--nats-url", "nats://127.0.0.1:4222"}, "exclude each other"},
		{"leaf without embed", []string{"--embed-nats-leaf", "nats-leaf://127.0.0.1:7422"}, "needs --embed-nats"},
		{"listen without embed", []string{"--embed-nats-listen", "127.0.0.1:4223"}, "needs --embed-nats"},
		{"listen without port", []string{"--embed-nats", "--embed-nats-listen", "127.0.0.1"}, "--embed-nats-listen"},
		{"listen port out of range", []string{"--embed-nats", "--embed-nats-listen", "127.0.0.1:70000"}, "1 to 65535"},
		{"leaf not a URL", []string{"--embed-nats", "--embed-nats-listen", "", "--embed-nats-leaf", "127.0.0.1:7422"}, "nats-leaf://host:7422"},
		{"creds with embed, no leaf", []string{"--embed-nats", "--embed-nats-listen", "", "--creds", "leaf.creds"}, "--creds with --embed-nats needs --embed-nats-leaf"},
		{"client certificate without CA", []string{"--embed-nats", "--embed-nats-listen", "", "--embed-nats-leaf", "nats-leaf://127.0.0.1:7422",
			"--tls-cert", "c.pem", "--tls-key", "k.pem"}, "needs --tls-ca"},
		{"bad endpoint range", []string{"--allow-engine-cidr", "10.0.0.0/33"}, "models[0].cidrs[0]"},
		{"no routers", []string{"--routers", "-1"}, "ServiceOptions.Protection.Routers is -1: a cluster has at least one router"},
		{"unknown HTTP server", []string{"--http-server", "nginx"}, `--http-server: router: HTTP server "nginx": want "std" or "fasthttp"`},
		{"unknown RTT probe", []string{"--rtt-probe", "healthz"}, `ServiceOptions.RTTProbe: invalid RTT probe "healthz": want tcp or http:/path`},
		{"RTT probe path not absolute", []string{"--rtt-probe", "http:health"}, `ServiceOptions.RTTProbe: invalid RTT probe "http:health"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr syncBuffer
			args := append([]string{"router", "--cluster", "A", "--listen", "", "--log-level", "warn"}, tc.args...)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if code := run(ctx, args, strings.NewReader(""), &stdout, &stderr); code != exitUsage {
				t.Fatalf("exit %d, want %d (usage); stderr:\n%s", code, exitUsage, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("stderr does not say %q:\n%s", tc.want, stderr.String())
			}
		})
	}
}

// TestRouterLogFieldsOnce: the standalone router's log lines carry each
// field once (cluster, component, router): zerolog appends a field given
// twice twice, and a JSON reader keeps only one of them.
func TestRouterLogFieldsOnce(t *testing.T) {
	stderr := routerCmd(t, "--cluster", "A", "--name", "A-1", "--embed-nats", "--embed-nats-listen", "",
		"--embed-nats-data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--metrics-addr", "", "--log-format", "json")
	testenv.WaitFor(t, 10*time.Second, "a log line of the router service", func() bool {
		return strings.Contains(stderr.String(), `"component":"router"`)
	})
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		if !strings.Contains(line, `"component":"router"`) {
			continue
		}
		if !strings.Contains(line, `"cluster":"A"`) {
			t.Errorf("a router line without its cluster: %s", line)
		}
		if dup := duplicateKeys(t, line); len(dup) > 0 {
			t.Errorf("fields %v appear more than once in %s", dup, line)
		}
	}
}

// duplicateKeys returns the top-level keys of the JSON object line that
// appear more than once.
func duplicateKeys(t *testing.T, line string) []string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("log line %q is not a JSON object", line)
	}
	seen := map[string]bool{}
	var dup []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		k, _ := tok.(string)
		if seen[k] {
			dup = append(dup, k)
		}
		seen[k] = true
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
	}
	return dup
}

// TestParseAlias: --alias splits at the first "=" not escaped, so that a
// model id with "=" needs no quoting and an alias with one is written \=.
func TestParseAlias(t *testing.T) {
	for _, c := range []struct{ in, alias, model string }{
		{"llama=meta-llama/Llama-3.1-8B-Instruct", "llama", "meta-llama/Llama-3.1-8B-Instruct"},
		{"llama=org/model=v2", "llama", "org/model=v2"},
		{`a\=b=org/model=v2`, "a=b", "org/model=v2"},
		{`a\\=m`, `a\`, "m"},
		{`a\b=m`, `a\b`, "m"},
		{`x\\\==m`, `x\=`, "m"},
	} {
		alias, model, err := parseAlias(c.in)
		if err != nil || alias != c.alias || model != c.model {
			t.Errorf("parseAlias(%q) = %q, %q, %v; want %q, %q", c.in, alias, model, err, c.alias, c.model)
		}
	}
	for _, in := range []string{"llama", `a\=b`, "=m", "a=", ""} {
		if alias, model, err := parseAlias(in); err == nil {
			t.Errorf("parseAlias(%q) = %q, %q, want an error", in, alias, model)
		}
	}
	// Through the flag: the alias with "=" reaches the router's options.
	if out, errOut, code := runBounded(t, "router", "--print-config", "--cluster", "A", `--alias=a\=b=org/m=v2`); code != exitOK || !strings.Contains(out, `"a=b": "org/m=v2"`) {
		t.Errorf("router --print-config --alias 'a\\=b=org/m=v2' exited %d:\n%s%s", code, out, errOut)
	}
}
