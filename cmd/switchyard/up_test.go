package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-dev/switchyard/stack"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/testenv"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// syncBuffer is a bytes.Buffer safe for concurrent writes and reads.
type syncBuffer = testenv.Buffer

// TestUp runs `switchyard up` as a new user would and checks, with a NATS
// client, that within 10 seconds sy_engines lists the three engines and that
// `switchyard decode` prints engine-b's state as JSON; then Ctrl-C stops
// everything and leaves no goroutine behind.
func TestUp(t *testing.T) {
	before := runtime.NumGoroutine()
	port := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	dataDir := t.TempDir()
	go func() {
		done <- run(ctx, []string{"up", "--nats-port", fmt.Sprint(port), "--data-dir", dataDir, "--metrics-addr", "", "--router-addr", "127.0.0.1:0", "--log-level", "warn"},
			strings.NewReader(""), &stdout, &stderr)
	}()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("up's stdout:\n%s\nup's stderr:\n%s", stdout.String(), stderr.String())
		}
	})
	started := time.Now()
	var kv jetstream.KeyValue
	var client *nats.Conn
	testenv.WaitFor(t, 10*time.Second, "sy_engines lists engine-a, engine-b and engine-c", func() bool {
		if kv == nil {
			url := fmt.Sprintf("nats://127.0.0.1:%d", port)
			nc, err := streams.Connect(ctx, streams.ConnectOptions{URLs: []string{url}, Creds: filepath.Join(dataDir, "auth", "admin.creds")})
			if err != nil {
				return false
			}
			client = nc
			// up is secure by default: the server that let admin in refuses anonymous clients.
			if anon, err := streams.Connect(ctx, streams.ConnectOptions{URLs: []string{url}}); err == nil {
				anon.Close()
				t.Fatal("up let an anonymous client connect")
			}
			js, _ := jetstream.New(nc)
			if kv, err = js.KeyValue(ctx, "sy_engines"); err != nil {
				kv = nil
				nc.Close()
				return false
			}
		}
		keys, err := kv.Keys(ctx)
		if err != nil {
			return false
		}
		return strings.Join(keys, ",") == "llama.engine-a,llama.engine-b,llama.engine-c"
	})
	t.Logf("engines listed %s after start", time.Since(started).Round(time.Millisecond))
	// up prints its summary once the stack started, which may be after
	// the engines' states are stored.
	testenv.WaitFor(t, 10*time.Second, "up prints the nats commands", func() bool {
		return strings.Contains(stdout.String(), "kv get sy_engines llama.engine-b --raw")
	})
	entry, err := kv.Get(ctx, "llama.engine-b")
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run(ctx, []string{"decode"}, bytes.NewReader(entry.Value()), &out, &errOut); code != 0 {
		t.Fatalf("decode exited %d: %s", code, errOut.String())
	}
	var state map[string]any
	if err := json.Unmarshal(out.Bytes(), &state); err != nil {
		t.Fatalf("decode printed no JSON: %v\n%s", err, out.String())
	}
	if state["engine"] != "engine-b" || state["status"] != "up" {
		t.Fatalf("decoded state: %s", out.String())
	}

	client.Close()
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("up exited %d: %s", code, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("up did not stop within 15s of Ctrl-C")
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before+2 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("%d goroutines left behind (%d before):\n%s", runtime.NumGoroutine()-before, before, buf[:n])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestUpPortTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"up", "--nats-port", fmt.Sprint(port), "--data-dir", t.TempDir(), "--metrics-addr", ""}, strings.NewReader(""), &out, &errOut)
	if code == 0 || !strings.Contains(errOut.String(), "already in use") || !strings.Contains(errOut.String(), fmt.Sprint(port)) {
		t.Fatalf("exit %d, stderr %q: want a clear error naming port %d", code, errOut.String(), port)
	}
}

// TestUpRefusesEngineNamedAsAComponent: a stack file whose engine is named
// after a component's identity (here the agent's) is refused before
// anything starts, with an error naming the engine: the two would
// otherwise share one identity's credentials.
func TestUpRefusesEngineNamedAsAComponent(t *testing.T) {
	file := filepath.Join(t.TempDir(), "fleet.yaml")
	src := strings.Replace(string(stack.DefaultFileBytes()), "name: engine-b", "name: agent", 1)
	if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"up", "--stack", file, "--nats-port", "0", "--data-dir", t.TempDir(), "--metrics-addr", ""},
		strings.NewReader(""), &out, &errOut)
	if code == 0 || !strings.Contains(errOut.String(), `engines[1].name: "agent" is the identity name of the agent`) {
		t.Fatalf("exit %d, stderr %q: want an error naming engines[1] and the agent", code, errOut.String())
	}
}
