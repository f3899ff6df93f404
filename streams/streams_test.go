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
