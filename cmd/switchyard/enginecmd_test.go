package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/enginesim"
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

// TestEngineListStates lists engines whose records put them in different
// states: each row names the state enginestate.Of gives, with its figure.
func TestEngineListStates(t *testing.T) {
	env := testenv.StartNATS(t)
	ctx := context.Background()
	kv, err := env.JS.KeyValue(ctx, env.Names.EnginesBucket)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	state := func(engine string, health, load, errRate float64) *messages.EngineState {
		st := &messages.EngineState{Model: "llama", Engine: engine, Status: messages.StatusUp, Time: now, LastSignal: now,
			CapacityRPS: 100, Replicas: 1, Health: health, Signals: 5, LoadRPS: messages.Window{Fast: load, Slow: load}, InFlight: int64(load / 2)}
		if errRate >= 0 {
			st.Outcomes = &messages.EngineOutcomes{LastReport: now, Reports: 3, ErrorRate: messages.Window{Fast: errRate, Slow: errRate}}
		}
		return st
	}
	records := map[string]messages.Message{
		"llama.engine-a":          state("engine-a", 1, 50, 0),
		"llama.engine-b":          state("engine-b", 0, 0, 1),
		"llama.engine-c":          state("engine-c", 1, 0, -1),
		"operator.engine-c":       &messages.Operator{Engine: "engine-c", Action: messages.ActionDrain, Time: now},
		"llama.engine-d":          state("engine-d", 1, 40, 0.25),
		"llama.engine-e":          state("engine-e", 1, 40, 0.5),
		"penalty.llama.engine-e":  &messages.Penalty{Model: "llama", Engine: "engine-e", Time: now, Phase: messages.PhasePenalised, Multiplier: 0.25, Reason: messages.ReasonErrorRate, Since: now, Until: now + 60_000, RecoverUntil: now + 120_000, Strikes: 1},
		"llama.engine-f":          state("engine-f", 1, 30, 0),
		"operator.engine-f":       &messages.Operator{Engine: "engine-f", Action: messages.ActionDrain, Time: now},
		"penalty.llama.engine-a":  &messages.Penalty{Model: "llama", Engine: "engine-a", Time: now, Phase: messages.PhaseRecovered, Reason: messages.ReasonTimeouts, Since: now - 30_000, Until: now - 20_000, RecoverUntil: now - 10_000, Strikes: 1},
		"operator.engine-nothing": &messages.Operator{Engine: "engine-nothing", Action: messages.ActionCordon, Time: now},
	}
	for key, m := range records {
		data, err := messages.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, key, data); err != nil {
			t.Fatal(err)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run(ctx, []string{"engine", "list", "--nats-url", env.URL()}, strings.NewReader(""), &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	rows := map[string]string{}
	for _, line := range strings.Split(stdout.String(), "\n") {
		if f := strings.Fields(line); len(f) > 2 {
			rows[f[1]] = line
		}
	}
	for _, c := range []struct{ engine, state, figure string }{
		{"engine-a", "up", "0.0%"},
		{"engine-b", "ejected", "reports health 0; errors 100% of attempts"},
		{"engine-c", "drained", "operator drain"},
		{"engine-d", "degraded", "errors 25% of attempts"},
		{"engine-e", "penalised", "×0.25 until"},
		{"engine-f", "draining", "15 requests in flight"},
	} {
		f := strings.Fields(rows[c.engine])
		if len(f) < 3 || f[2] != c.state || !strings.Contains(rows[c.engine], c.figure) {
			t.Errorf("%s: row %q, want state %s with %q\n%s", c.engine, rows[c.engine], c.state, c.figure, stdout.String())
		}
	}
	if _, ok := rows["engine-nothing"]; ok {
		t.Errorf("an operator record without an engine state is listed as an engine")
	}
}

// TestEngineInjectAdmin: inject --admin posts to the engine simulator's
// admin listener (no NATS needed), and names a listener of another engine.
func TestEngineInjectAdmin(t *testing.T) {
	e, err := enginesim.New(enginesim.Options{Name: "e1", Model: "m", Region: "r1", MaxBatch: 2, OutputTokens: 4, PromptTokens: 10,
		BaseTBTMs: 1, PrefillMsPerToken: 0.01, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"engine", "inject", "e1", "--error-rate", "0.5", "--admin", e.AdminURL()}, exitOK, `"error_rate":0.5`},
		{[]string{"engine", "inject", "e2", "--clear", "--admin", e.AdminURL()}, exitError, `admin listener of engine "e1", not of e2`},
		{[]string{"engine", "drain", "e1", "--admin", e.AdminURL()}, exitUsage, "--admin is inject's"},
		{[]string{"engine", "inject", "e1", "--clear", "--admin", "127.0.0.1:1"}, exitUsage, "not a URL"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(ctx, c.args, strings.NewReader(""), &stdout, &stderr)
		if code != c.code || !strings.Contains(stdout.String()+stderr.String(), c.want) {
			t.Errorf("%v: exit %d, output %q %q; want %d and %q", c.args, code, stdout.String(), stderr.String(), c.code, c.want)
		}
	}
	if f := e.Failure(); f.ErrorRate != 0.5 {
		t.Fatalf("failure in force %+v, want error_rate 0.5", f)
	}
}
