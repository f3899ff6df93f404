package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestEngineListSkipsPoison lists engines from a bucket that holds values
// that do not decode or are misfiled beside a valid one: the valid engine
// is listed, the others are skipped and counted on stderr.
func TestEngineListSkipsPoison(t *testing.T) {
	env := testenv.StartNATS(t)
	ctx := context.Background()
	kv, err := env.JS.KeyValue(ctx, env.Names.EnginesBucket)
	if err != nil {
		t.Fatal(err)
	}
	st, err := messages.Encode(&messages.EngineState{Model: "llama", Engine: "engine-a", Status: messages.StatusUp,
		Time: time.Now().UnixMilli(), CapacityRPS: 100, Replicas: 1, Health: 1, Signals: 1})
	if err != nil {
		t.Fatal(err)
	}
	for key, v := range map[string][]byte{
		"llama.engine-a": st,
		"llama.misfiled": st,
		"llama.poison":   []byte("\x83\xa1v\x01\xa1k\xacengine_state\xa2tx"),
		"llama.engine-w": {0xc1},
	} {
		if _, err := kv.Put(ctx, key, v); err != nil {
			t.Fatal(err)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run(ctx, []string{"engine", "list", "--nats-url", env.URL()}, strings.NewReader(""), &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "engine-a") || strings.Contains(stdout.String(), "misfiled") {
		t.Errorf("listing:\n%s", stdout.String())
	}
	if !strings.Contains(stderr.String(), "skipped 3 values") {
		t.Errorf("stderr does not count the 3 skipped values: %s", stderr.String())
	}
}

// TestEngineHealthFlag: --health is recognised as given whatever its value
// (no value stands for "not given"), only with the health action.
func TestEngineHealthFlag(t *testing.T) {
	env := testenv.StartNATS(t)
	ctx := context.Background()
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"engine", "health", "e1"}, exitUsage, "want --health"},
		{[]string{"engine", "drain", "e1", "--health", "0.5"}, exitUsage, "goes with the health action"},
		{[]string{"engine", "health", "e1", "--health", "-1"}, exitUsage, "health"},
		{[]string{"engine", "health", "e1", "--health", "0"}, exitOK, "recorded"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(ctx, append(c.args, "--nats-url", env.URL()), strings.NewReader(""), &stdout, &stderr)
		if code != c.code || !strings.Contains(stdout.String()+stderr.String(), c.want) {
			t.Errorf("%v: exit %d, output %q %q; want %d and %q", c.args, code, stdout.String(), stderr.String(), c.code, c.want)
		}
	}
}
