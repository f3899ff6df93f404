package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPrintConfig runs every command that runs a component with
// --print-config: it exits 0 by itself, without waiting for a signal, prints
// the effective options as JSON with the documented defaults, leaves the
// ports it was given unbound, and a bad option exits 2 naming the field.
func TestPrintConfig(t *testing.T) {
	port := freePort(t)
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	dir := t.TempDir()
	stackFile := filepath.Join("..", "..", "examples", "stack.yaml")
	cases := []struct {
		args []string
		// want maps a path of keys (dot-separated) to the printed value.
		want map[string]any
	}{
		{[]string{"up", "--nats-port", fmt.Sprint(port), "--metrics-addr", metrics, "--data-dir", dir},
			map[string]any{"stack.model": "llama", "components.NATS.Port": float64(port), "components.Aggregator.DownAfter": "6s",
				"components.Optimizer.Instance": "up", "components.Optimizer.Penalties.SlowStart": "10s", "dashboard.History": "5m0s",
				"flags.metrics-addr": metrics}},
		{[]string{"nats", "--port", fmt.Sprint(port), "--data-dir", dir, "--replicas", "3"},
			map[string]any{"nats.Port": float64(port), "nats.Host": "127.0.0.1", "nats.StartTimeout": "10s", "provision.Replicas": float64(3), "provision.SignalMaxAge": "5m0s"}},
		{[]string{"aggregator", "--metrics-addr", metrics, "--nats-url", "nats://user:hunter2@127.0.0.1:1"},
			map[string]any{"aggregator.StaleAfter": "2s", "aggregator.ForgetAfter": "10m0s", "aggregator.Names.SignalStream": "SY_SIGNALS",
				"flags.nats-url": "nats://user:xxxxx@127.0.0.1:1"}},
		{[]string{"optimizer", "--stack", stackFile, "--metrics-addr", metrics, "--instance", "o1"},
			map[string]any{"optimizer.Instance": "o1", "optimizer.TargetUtilisation": float64(1), "optimizer.NetworkMs.A.engine-a": float64(1),
				"optimizer.Penalties.StrikeDecay": "1m0s", "optimizer.Penalties.NoSlowStart": false}},
		{[]string{"engine-sim", "--name", "e1", "--listen", fmt.Sprintf("127.0.0.1:%d", port)},
			map[string]any{"engine.Name": "e1", "engine.MaxBatch": float64(32), "engine.SignalInterval": "200ms", "engine.NATSTimeout": "2m0s"}},
		{[]string{"agent", "--engine", "name=v1,url=http://127.0.0.1:8000,metrics=vllm", "--metrics-addr", metrics},
			map[string]any{"agent.Interval": "500ms", "agent.StaleAfter": "5s", "agent.HealthFailures": float64(3)}},
		{[]string{"router", "--cluster", "A", "--listen", fmt.Sprintf("127.0.0.1:%d", port)},
			map[string]any{"router.Cluster": "A", "router.HTTPAddr": fmt.Sprintf("127.0.0.1:%d", port), "router.ReportInterval": "1s"}},
		{[]string{"load", "--rate", "5", "--duration", "2s"},
			map[string]any{"load.MaxInFlight": float64(2000), "load.Duration": "2s", "load.StreamFraction": 0.5}},
	}
	for _, c := range cases {
		t.Run(c.args[0], func(t *testing.T) {
			out, errOut, code := runBounded(t, append(c.args, "--print-config")...)
			if code != exitOK {
				t.Fatalf("exit %d, stderr %s", code, errOut)
			}
			var doc map[string]any
			if err := json.Unmarshal([]byte(out), &doc); err != nil {
				t.Fatalf("output is not JSON: %v\n%s", err, out)
			}
			for path, want := range c.want {
				if got := lookup(doc, path); got != want {
					t.Errorf("%s = %v (%T), want %v", path, got, got, want)
				}
			}
			if strings.Contains(out, "hunter2") {
				t.Error("a password is printed")
			}
			if lookup(doc, "flags.print-config") != "true" {
				t.Error("flags section missing")
			}
			for _, addr := range []string{fmt.Sprintf("127.0.0.1:%d", port), metrics} {
				if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
					conn.Close()
					t.Errorf("%s is listening after --print-config", addr)
				}
			}
		})
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("--print-config wrote into the data dir: %v", entries)
	}

	bad := []struct {
		args []string
		want string
	}{
		{[]string{"aggregator", "--stale-after", "10s"}, "StaleAfter 10s"},
		{[]string{"nats", "--leaf-port", "70000"}, "LeafPort is 70000"},
		{[]string{"nats", "--cluster-name", "c"}, "ServerName is empty"},
		{[]string{"optimizer", "--stack", stackFile, "--target-utilisation", "2"}, "TargetUtilisation is 2"},
		{[]string{"engine-sim", "--name", "e.1"}, "Name"},
		{[]string{"agent", "--engine", "name=v1,url=http://127.0.0.1:8000,metrics=vllm", "--health-failures", "-1"}, "HealthFailures is -1"},
		{[]string{"up", "--nats-port", "70000", "--data-dir", dir}, "Port is 70000"},
		{[]string{"up", "--router-addr", "127.0.0.1:8081", "--data-dir", dir}, "RouterAddr"},
		{[]string{"load", "--url", "127.0.0.1:8081"}, "URL"},
	}
	for _, c := range bad {
		t.Run("bad "+strings.Join(c.args, " "), func(t *testing.T) {
			_, errOut, code := runBounded(t, append(c.args, "--print-config")...)
			if code != exitUsage || !strings.Contains(errOut, c.want) {
				t.Errorf("exit %d, stderr %q; want %d naming %q", code, errOut, exitUsage, c.want)
			}
		})
	}
}

// runBounded runs the command line and fails the test unless it returns by
// itself within 20 s.
func runBounded(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut bytes.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, strings.NewReader(""), &out, &errOut) }()
	select {
	case code = <-done:
		return out.String(), errOut.String(), code
	case <-time.After(20 * time.Second):
		cancel()
		<-done
		t.Fatalf("%v did not return by itself: it started something", args)
		return "", "", 0
	}
}

// lookup follows a dot-separated path of keys in a decoded JSON document.
func lookup(doc map[string]any, path string) any {
	var v any = doc
	for _, k := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// printable is a configuration with every kind of field printConfig meets.
type printable struct {
	Name      string
	Wait      time.Duration
	Token     string
	APIKey    string
	Password  string `yaml:"password"`
	Hidden    string `config:"secret"`
	OutTokens int
	URLs      []string
	Ratio     float64
	Table     map[string]float64
	Inner     *printable
	Conn      *bytes.Buffer
	Hook      func()
	Writer    any
	private   int
}

// TestPrintConfigValues: field order, durations as strings, secrets and URL
// passwords redacted, handles left out, map keys sorted, NaN as a string.
func TestPrintConfigValues(t *testing.T) {
	var b bytes.Buffer
	v := printable{Name: "n", Wait: 1500 * time.Millisecond, Token: "t0k", APIKey: "k3y", Password: "pw", Hidden: "h",
		OutTokens: 7, URLs: []string{"nats://u:pa55@h:4222", "nats://s3cr3t@h:4222", "nats://h:4222"},
		Ratio: math.NaN(), Table: map[string]float64{"b": 2, "a": 1}, Inner: &printable{Name: "i"}, Conn: &bytes.Buffer{},
		Hook: func() {}, Writer: &bytes.Buffer{}, private: 1}
	if err := printConfig(&b, section{"s", v}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, leak := range []string{"t0k", "k3y", `"pw"`, `"h"`, "pa55", "s3cr3t", "Conn", "Hook", "Writer", "private"} {
		if strings.Contains(out, leak) {
			t.Errorf("printed %q:\n%s", leak, out)
		}
	}
	for _, want := range []string{`"Wait": "1.5s"`, `"OutTokens": 7`, `"Ratio": "NaN"`, `"password": "REDACTED"`, `"nats://h:4222"`, `"nats://u:xxxxx@h:4222"`} {
		if !strings.Contains(out, want) {
			t.Errorf("no %s in:\n%s", want, out)
		}
	}
	if strings.Index(out, `"Name"`) > strings.Index(out, `"Wait"`) || strings.Index(out, `"a": 1`) > strings.Index(out, `"b": 2`) {
		t.Errorf("fields or keys out of order:\n%s", out)
	}
}
