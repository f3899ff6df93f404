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
