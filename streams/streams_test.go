package streams_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
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
	// A model named by a word that prefixes the buckets' other records has
	// that word escaped, so EngineKey("operator", e) is not OperatorKey(e).
	for _, reserved := range []string{"operator", "penalty", "rtt"} {
		k, err := streams.EngineKey(reserved, "engine-a")
		if err != nil || k == reserved+".engine-a" || streams.IsOperatorKey(k) {
			t.Errorf("EngineKey(%q, engine-a) = %q, %v; want the escaped word", reserved, k, err)
		}
		if m, e, ok := streams.SplitKey(k); !ok || m != reserved || e != "engine-a" {
			t.Errorf("SplitKey(%q) = %q %q %v", k, m, e, ok)
		}
	}
	// A model id as OpenAI clients and vLLM give it: one token in every
	// subject and key, given back as it is by the parsers.
	const hf = "meta-llama/Llama-3.1-8B-Instruct"
	const tok = "meta-llama/Llama-3=2E1-8B-Instruct"
	for _, c := range []struct {
		got  func() (string, error)
		want string
	}{
		{func() (string, error) { return n.SignalSubject(hf, "engine-a") }, "sy.signal." + tok + ".engine-a"},
		{func() (string, error) { return n.KVSubject(hf, "engine-a") }, "sy.kv." + tok + ".engine-a"},
		{func() (string, error) { return n.ReportSubject(hf, "A", "r1") }, "sy.report." + tok + ".A.r1"},
		{func() (string, error) { return n.RequestSubject("A", hf) }, "sy.req.A." + tok},
		{func() (string, error) { return n.InferSubject(hf, "engine-a") }, "sy.infer." + tok + ".engine-a"},
		{func() (string, error) { return streams.EngineKey(hf, "engine-a") }, tok + ".engine-a"},
		{func() (string, error) { return streams.DemandKey(hf, "A") }, tok + ".A"},
		{func() (string, error) { return streams.WeightsKey(hf, "A") }, tok + ".A"},
		{func() (string, error) { return streams.PenaltyKey(hf, "engine-a") }, "penalty." + tok + ".engine-a"},
	} {
		if got, err := c.got(); err != nil || got != c.want {
			t.Errorf("got %q, %v; want %q", got, err, c.want)
		}
	}
	if toks, ok := n.ParseSubject("sy.signal."+tok+".engine-a", "signal", 2); !ok || toks[0] != hf || toks[1] != "engine-a" {
		t.Errorf("ParseSubject(signal) = %q %v", toks, ok)
	}
	if toks, ok := n.ParseSubject("sy.req.A."+tok, "req", 2); !ok || toks[0] != "A" || toks[1] != hf {
		t.Errorf("ParseSubject(req) = %q %v", toks, ok)
	}
	if m, c, ok := streams.SplitKey(tok + ".A"); !ok || m != hf || c != "A" {
		t.Errorf("SplitKey = %q %q %v", m, c, ok)
	}
	for _, bad := range []string{"sy.signal.a=2.e", "sy.signal.=61.e", "sy.signal.a/b=.e"} {
		if toks, ok := n.ParseSubject(bad, "signal", 2); ok {
			t.Errorf("ParseSubject(%q) = %q, want refused (not a model token)", bad, toks)
		}
	}
	if _, err := n.SignalSubject("llama 3", "engine-a"); !errors.Is(err, messages.ErrInvalid) {
		t.Errorf("SignalSubject of a model id with a space = %v, want ErrInvalid", err)
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
		"DemandKey(llama, a.b)": func() (string, error) { return streams.DemandKey("llama", "a.b") },
		"WeightsKey(a b, A)":    func() (string, error) { return streams.WeightsKey("a b", "A") },
		"RTTKey(A, >)":          func() (string, error) { return streams.RTTKey("A", ">") },
		"RTTKey(, e)":           func() (string, error) { return streams.RTTKey("", "e") },
		"OperatorKey(a.b)":      func() (string, error) { return streams.OperatorKey("a.b") },
		"PenaltyKey(a\\x01, e)": func() (string, error) { return streams.PenaltyKey("a\x01", "e") },
		"PenaltyKey(llama, *)":  func() (string, error) { return streams.PenaltyKey("llama", "*") },
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
			if c, e, split := streams.SplitNames(rest); !split || streams.JoinRTTKey(c, e) != key {
				t.Errorf("CutRTTKey(%q) then SplitNames = %q %q %v; does not rebuild the key", key, c, e, split)
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

// TestConnectLogsTheServersURL: an in-process connection's log names the
// server it reached (its client URL on a random port), not nats.go's
// default URL, nats://127.0.0.1:4222, which it never dialled.
func TestConnectLogsTheServersURL(t *testing.T) {
	env := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var buf testenv.Buffer
	nc, err := streams.Connect(ctx, streams.ConnectOptions{InProcess: env.Server.Server(), Name: "in-process-test", Logger: zerolog.New(&buf)})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	testenv.WaitFor(t, 5*time.Second, "the connection logged", func() bool { return strings.Contains(buf.String(), "nats connected") })
	line := buf.String()
	if want := "in-process " + env.Server.ClientURL(); !strings.Contains(line, want) || strings.Contains(line, ":4222") {
		t.Errorf("the connection logged %q, want the url %q and no :4222", line, want)
	}
}
