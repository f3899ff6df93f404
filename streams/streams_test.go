package streams_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/testenv"
)

func TestSubjects(t *testing.T) {
	n := streams.DefaultNames()
	cases := []struct {
		got  func() (string, error)
		want string
	}{
		{func() (string, error) { return n.SignalSubject("llama", "engine-a") }, "sy.signal.llama.engine-a"},
		{func() (string, error) { return n.ReportSubject("llama", "A", "r1") }, "sy.report.llama.A.r1"},
		{func() (string, error) { return n.RequestSubject("A", "llama") }, "sy.req.A.llama"},
		{func() (string, error) { return n.InferSubject("llama", "engine-a") }, "sy.infer.llama.engine-a"},
		{func() (string, error) { return streams.EngineKey("llama", "engine-a") }, "llama.engine-a"},
		{func() (string, error) { return streams.RTTKey("A", "engine-a") }, "rtt.A.engine-a"},
	}
	for _, c := range cases {
		got, err := c.got()
		if err != nil || got != c.want {
			t.Errorf("got %q, %v; want %q", got, err, c.want)
		}
	}
	for _, bad := range []string{"a.b", "*", ">", "", "a b"} {
		if _, err := n.SignalSubject("llama", bad); !errors.Is(err, messages.ErrInvalid) {
			t.Errorf("SignalSubject(llama, %q) = %v, want ErrInvalid", bad, err)
		}
	}
	// A model may not take a word that prefixes the buckets' other records:
	// EngineKey("operator", e) would be OperatorKey(e).
	for _, reserved := range []string{"operator", "penalty", "rtt"} {
		if k, err := streams.EngineKey(reserved, "engine-a"); !errors.Is(err, messages.ErrInvalid) {
			t.Errorf("EngineKey(%q, engine-a) = %q, %v; want ErrInvalid", reserved, k, err)
		}
	}
	toks, ok := n.ParseSubject("sy.report.llama.A.r1", "report", 3)
	if !ok || toks[0] != "llama" || toks[1] != "A" || toks[2] != "r1" {
		t.Errorf("ParseSubject = %v %v", toks, ok)
	}
	if _, ok := n.ParseSubject("sy.report.llama.A", "report", 3); ok {
		t.Error("short subject parsed")
	}
}

// TestKeyLayout pins the KV key layout of DESIGN.md: the validating builders
// and the joiners used on hot paths agree, the validating ones refuse what
// the joiners would happily concatenate, and the parsers recognise exactly
// the shapes the builders produce.
func TestKeyLayout(t *testing.T) {
	valid := []struct {
		got  func() (string, error)
		join string
		want string
		what string
	}{
		{func() (string, error) { return streams.EngineKey("llama", "engine-a") }, streams.JoinKey("llama", "engine-a"), "llama.engine-a", "EngineKey"},
		{func() (string, error) { return streams.DemandKey("llama", "A") }, streams.JoinKey("llama", "A"), "llama.A", "DemandKey"},
		{func() (string, error) { return streams.WeightsKey("llama", "A") }, streams.JoinKey("llama", "A"), "llama.A", "WeightsKey"},
		{func() (string, error) { return streams.RTTKey("A", "engine-a") }, streams.JoinRTTKey("A", "engine-a"), "rtt.A.engine-a", "RTTKey"},
		{func() (string, error) { return streams.OperatorKey("engine-a") }, streams.JoinOperatorKey("engine-a"), "operator.engine-a", "OperatorKey"},
		{func() (string, error) { return streams.PenaltyKey("llama", "engine-a") }, streams.PenaltyPrefix + "llama.engine-a", "penalty.llama.engine-a", "PenaltyKey"},
	}
	for _, c := range valid {
		got, err := c.got()
		if err != nil || got != c.want || c.join != c.want {
			t.Errorf("%s = %q, %v (joined %q); want %q", c.what, got, err, c.join, c.want)
		}
	}
	bad := map[string]func() (string, error){
		"DemandKey(llama, a.b)":   func() (string, error) { return streams.DemandKey("llama", "a.b") },
		"WeightsKey(rtt, A)":      func() (string, error) { return streams.WeightsKey("rtt", "A") },
		"RTTKey(A, >)":            func() (string, error) { return streams.RTTKey("A", ">") },
		"RTTKey(, e)":             func() (string, error) { return streams.RTTKey("", "e") },
		"OperatorKey(a.b)":        func() (string, error) { return streams.OperatorKey("a.b") },
		"PenaltyKey(operator, e)": func() (string, error) { return streams.PenaltyKey("operator", "e") },
		"PenaltyKey(llama, *)":    func() (string, error) { return streams.PenaltyKey("llama", "*") },
	}
	for name, f := range bad {
		if k, err := f(); !errors.Is(err, messages.ErrInvalid) || k != "" {
			t.Errorf("%s = %q, %v; want \"\", ErrInvalid", name, k, err)
		}
	}

	for key, want := range map[string]string{"rtt.A.engine-a": "A.engine-a", "rtt.A": "", "rtt.A.b.c": "", "llama.A": "", "rttx.A.b": ""} {
		rest, ok := streams.CutRTTKey(key)
		if ok != (want != "") || (ok && rest != want) {
			t.Errorf("CutRTTKey(%q) = %q, %v; want %q", key, rest, ok, want)
		}
		if ok {
			if c, e, split := streams.SplitKey(rest); !split || streams.JoinRTTKey(c, e) != key {
				t.Errorf("CutRTTKey(%q) then SplitKey = %q %q %v; does not rebuild the key", key, c, e, split)
			}
		}
	}
	if a, b, ok := streams.CutKey(streams.JoinKey("llama", "engine-a")); !ok || a != "llama" || b != "engine-a" {
		t.Errorf("CutKey(JoinKey(llama, engine-a)) = %q %q %v", a, b, ok)
	}
	if _, _, ok := streams.CutKey("nodot"); ok {
		t.Error("CutKey split a key without a dot")
	}
	for key, want := range map[string]bool{"operator.engine-a": true, "operator.a.b": false, "operator": false, "llama.engine-a": false, "penalty.llama.e": false} {
		if got := streams.IsOperatorKey(key); got != want {
			t.Errorf("IsOperatorKey(%q) = %v, want %v", key, got, want)
		}
	}
}

func TestProvisionIdempotentAndApplyChanges(t *testing.T) {
	env := testenv.StartNATS(t) // provisions once
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := streams.Provision(ctx, env.JS, env.Names, streams.ProvisionOptions{}); err != nil {
		t.Fatalf("second provision: %v", err)
	}
	if err := streams.Provision(ctx, env.JS, env.Names, streams.ProvisionOptions{SignalMaxAge: 10 * time.Minute}); err != nil {
		t.Fatalf("provision with changed settings: %v", err)
	}
	s, err := env.JS.Stream(ctx, env.Names.SignalStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxAge != 10*time.Minute {
		t.Fatalf("MaxAge = %s, want the changed 10m", info.Config.MaxAge)
	}
	for _, b := range []string{env.Names.EnginesBucket, env.Names.DemandBucket, env.Names.WeightsBucket, env.Names.LeasesBucket} {
		if _, err := env.JS.KeyValue(ctx, b); err != nil {
			t.Errorf("bucket %s: %v", b, err)
		}
	}
	// Dedup: the same Nats-Msg-Id is stored once.
	for i := 0; i < 2; i++ {
		if _, err := env.JS.Publish(ctx, "sy.signal.llama.engine-a", []byte("x"), jetstream.WithMsgID("engine-a-1")); err != nil {
			t.Fatal(err)
		}
	}
	info, _ = s.Info(ctx)
	if info.State.Msgs != 1 {
		t.Fatalf("stream holds %d messages after a duplicate publish, want 1", info.State.Msgs)
	}
}

func TestConnectFailsFastWithoutServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := streams.Connect(ctx, streams.ConnectOptions{URLs: []string{"nats://127.0.0.1:1"}}); err == nil {
		t.Fatal("connect to a closed port succeeded")
	}
	if _, err := streams.Connect(ctx, streams.ConnectOptions{}); !errors.Is(err, streams.ErrNoURL) {
		t.Fatalf("got %v, want ErrNoURL", err)
	}
}
