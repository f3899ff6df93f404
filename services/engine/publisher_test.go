package engine_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/engine"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/testenv"
)

func liveValues() messages.EngineSignal {
	return messages.EngineSignal{
		TTFTMs: 120, TBTMs: 20, Queue: 3, Running: 8, KVUse: 0.4,
		CapacityRPS: 50, LoadRPS: 30, OutputTokens: 128, Replicas: 1, Health: 1,
		Transports: []messages.Transport{{Kind: messages.TransportHTTP, Address: "http://127.0.0.1:1"}},
	}
}

// collector records every signal delivered on the subject through a JetStream consumer.
type collector struct {
	mu   sync.Mutex
	sigs []messages.EngineSignal
	ids  []string
	bad  []error
}

func (c *collector) snapshot() ([]messages.EngineSignal, []string, []error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]messages.EngineSignal(nil), c.sigs...), append([]string(nil), c.ids...), append([]error(nil), c.bad...)
}

func consume(t *testing.T, env *testenv.NATS, subject string) *collector {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := env.JS.OrderedConsumer(ctx, env.Names.SignalStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		t.Fatalf("consumer on %s: %v", subject, err)
	}
	c := &collector{}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		var s messages.EngineSignal
		err := messages.DecodeInto(m.Data(), &s)
		c.mu.Lock()
		defer c.mu.Unlock()
		if err != nil {
			c.bad = append(c.bad, err)
			return
		}
		c.sigs = append(c.sigs, s)
		c.ids = append(c.ids, m.Headers().Get(engine.HeaderMsgID))
	})
	if err != nil {
		t.Fatalf("consume %s: %v", subject, err)
	}
	t.Cleanup(cc.Stop)
	return c
}

func startPublisher(t *testing.T, opts engine.Options) (*engine.Publisher, func()) {
	t.Helper()
	p, err := engine.NewPublisher(opts)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	stop := func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run returned %v", err)
		}
	}
	t.Cleanup(func() {
		cancel()
	})
	return p, stop
}

var msgIDPattern = regexp.MustCompile(`^engine-a-[0-9a-f]{16}-\d+$`)

func TestPublisherSignalsArriveWithRisingSeq(t *testing.T) {
	env := testenv.StartNATS(t)
	subject, _ := env.Names.SignalSubject("llama", "engine-a")
	col := consume(t, env, subject)
	p, stop := startPublisher(t, engine.Options{
		Conn: env.Dial(t, "engine-a"), Names: env.Names, Model: "llama", Engine: "engine-a", Region: "r1",
		Interval: 20 * time.Millisecond, Source: liveValues, Logger: zerolog.Nop(),
	})
	defer stop()
	if p.Subject() != "sy.signal.llama.engine-a" {
		t.Fatalf("Subject() = %q", p.Subject())
	}
	testenv.WaitFor(t, 5*time.Second, "5 signals in SY_SIGNALS", func() bool {
		sigs, _, _ := col.snapshot()
		return len(sigs) >= 5
	})
	sigs, ids, bad := col.snapshot()
	if len(bad) > 0 {
		t.Fatalf("undecodable signals: %v", bad)
	}
	for i, s := range sigs {
		if s.Model != "llama" || s.Engine != "engine-a" || s.Region != "r1" || s.Version != messages.SchemaVersion || s.Kind != messages.KindSignal {
			t.Fatalf("signal %d has header fields %+v", i, s)
		}
		if s.TTFTMs != 120 || s.Queue != 3 || s.CapacityRPS != 50 || len(s.Transports) != 1 {
			t.Fatalf("signal %d lost live values: %+v", i, s)
		}
		if d := time.Since(time.UnixMilli(s.Time)); d < 0 || d > 10*time.Second {
			t.Fatalf("signal %d time %d is %s from now", i, s.Time, d)
		}
		if !msgIDPattern.MatchString(ids[i]) || !strings.HasSuffix(ids[i], "-"+itoa(s.Seq)) || ids[i][:len(ids[i])-len(itoa(s.Seq))] != ids[0][:len(ids[0])-len(itoa(sigs[0].Seq))] {
			t.Fatalf("signal %d Nats-Msg-Id = %q, want engine-a-<the same random hex>-%d", i, ids[i], s.Seq)
		}
		if i > 0 && s.Seq != sigs[i-1].Seq+1 {
			t.Fatalf("seq went %d -> %d, want +1", sigs[i-1].Seq, s.Seq)
		}
	}
	if st := p.Stats(); st.Published < 5 || st.Failed != 0 || st.Invalid != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func itoa(u uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + u%10)
		u /= 10
		if u == 0 {
			return string(b[i:])
		}
	}
}

func TestPublisherDedup(t *testing.T) {
	env := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc := env.Dial(t, "engine-b")
	mk := func() *engine.Publisher {
		p, err := engine.NewPublisher(engine.Options{Conn: nc, Model: "llama", Engine: "engine-b", FirstSeq: 7, Logger: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p1, p2 := mk(), mk()
	if err := p1.PublishNow(ctx); !errors.Is(err, engine.ErrNoSignal) {
		t.Fatalf("PublishNow before Set = %v, want ErrNoSignal", err)
	}
	p1.Set(liveValues())
	p2.Update(func(s *messages.EngineSignal) { *s = liveValues(); s.Queue = 99 })
	for i := 0; i < 3; i++ {
		if err := p1.PublishNow(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// p2 sends seq 7 and 8 again, under its own random id prefix: the
	// stream keeps them, so that no other publisher can pre-send p1's
	// next ids (the same id twice is dropped: streams' dedup test).
	for i := 0; i < 2; i++ {
		if err := p2.PublishNow(ctx); err != nil {
			t.Fatal(err)
		}
	}
	s, err := env.JS.Stream(ctx, env.Names.SignalStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 5 {
		t.Fatalf("stream holds %d signals, want 5 (no id of one publisher collides with another's)", info.State.Msgs)
	}
	if st := p2.Stats(); st.Duplicates != 0 || st.Published != 2 || st.LastSeq != 8 {
		t.Fatalf("second publisher stats %+v, want 2 published, no duplicates, last seq 8", st)
	}
	if st := p1.Stats(); st.Published != 3 || st.LastSeq != 9 {
		t.Fatalf("first publisher stats %+v, want 3 published, last seq 9", st)
	}
	// An invalid value is refused before it reaches the wire.
	p1.Update(func(s *messages.EngineSignal) { s.KVUse = 1.5 })
	if err := p1.PublishNow(ctx); !errors.Is(err, messages.ErrInvalid) || !strings.Contains(err.Error(), "kv_use") {
		t.Fatalf("PublishNow with kv_use 1.5 = %v, want ErrInvalid naming kv_use", err)
	}
}

func TestPublisherDefaultSeqSurvivesRestart(t *testing.T) {
	env := testenv.StartNATS(t)
	nc := env.Dial(t, "engine-c")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var last uint64
	for run := 0; run < 2; run++ {
		p, err := engine.NewPublisher(engine.Options{Conn: nc, Model: "llama", Engine: "engine-c", Source: liveValues})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			if err := p.PublishNow(ctx); err != nil {
				t.Fatal(err)
			}
		}
		st := p.Stats()
		if st.Published != 3 || st.Duplicates != 0 || st.LastSeq <= last {
			t.Fatalf("run %d stats %+v after last seq %d: a restarted engine must not collide with its previous ids", run, st, last)
		}
		last = st.LastSeq
	}
}

func TestPublisherResumesAfterServerRestart(t *testing.T) {
	env := testenv.StartNATS(t)
	subject, _ := env.Names.SignalSubject("llama", "engine-r")
	nc := env.Dial(t, "engine-r")
	var mu sync.Mutex
	queue := 0
	p, stop := startPublisher(t, engine.Options{
		Conn: nc, Names: env.Names, Model: "llama", Engine: "engine-r",
		Interval: 20 * time.Millisecond, PublishTimeout: 200 * time.Millisecond, Logger: zerolog.Nop(),
		Source: func() messages.EngineSignal {
			s := liveValues()
			mu.Lock()
			s.Queue = queue
			mu.Unlock()
			return s
		},
	})
	defer stop()
	testenv.WaitFor(t, 5*time.Second, "first signals", func() bool { return p.Stats().Published >= 3 })

	env.StopServer()
	testenv.WaitFor(t, 5*time.Second, "client notices the server is gone", func() bool { return !nc.IsConnected() })
	before := p.Stats()
	mu.Lock()
	queue = 42 // the values change while NATS is down
	mu.Unlock()
	env.StartServer(t)

	testenv.WaitFor(t, 10*time.Second, "publishing resumes after restart", func() bool {
		return p.Stats().Published >= before.Published+3
	})
	// The newest values made it into the stream, after the old ones.
	check := env.Dial(t, "check")
	js, err := jetstream.New(check)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, env.Names.SignalStream)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	var sig messages.EngineSignal
	if err := messages.DecodeInto(raw.Data, &sig); err != nil {
		t.Fatal(err)
	}
	if sig.Queue != 42 || sig.Seq <= before.LastSeq {
		t.Fatalf("newest signal after restart: queue %d seq %d (seq before the outage %d)", sig.Queue, sig.Seq, before.LastSeq)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs < before.Published+3 {
		t.Fatalf("stream holds %d signals, want at least %d", info.State.Msgs, before.Published+3)
	}
}

func TestPublisherCoreSubscriptionSeesSignals(t *testing.T) {
	env := testenv.StartNATS(t)
	subject, _ := env.Names.SignalSubject("llama", "engine-s")
	sub := env.Dial(t, "router")
	got := make(chan *nats.Msg, 16)
	s, err := sub.ChanSubscribe(subject, got)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Unsubscribe() }()
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	_, stop := startPublisher(t, engine.Options{Conn: env.Dial(t, "engine-s"), Model: "llama", Engine: "engine-s",
		Interval: 20 * time.Millisecond, Source: liveValues})
	defer stop()
	select {
	case m := <-got:
		var sig messages.EngineSignal
		if err := messages.DecodeInto(m.Data, &sig); err != nil {
			t.Fatalf("core subscriber got an undecodable signal: %v", err)
		}
		if m.Header.Get(engine.HeaderMsgID) == "" {
			t.Fatal("core subscriber sees no Nats-Msg-Id header")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no signal on a plain core subscription within 5s")
	}
}

func TestNewPublisherValidates(t *testing.T) {
	env := testenv.StartNATS(t)
	cases := []struct {
		opts engine.Options
		want string
	}{
		{engine.Options{Model: "m", Engine: "e"}, "Conn"},
		{engine.Options{Conn: env.Conn, Model: "m x", Engine: "e"}, "Model"},
		{engine.Options{Conn: env.Conn, Model: "m", Engine: "e*"}, "Engine"},
		{engine.Options{Conn: env.Conn, Model: "m", Engine: "e", Region: "r 1"}, "Region"},
		{engine.Options{Conn: env.Conn, Model: "m", Engine: "e", Interval: -time.Second}, "Interval"},
		{engine.Options{Conn: env.Conn, Model: "m", Engine: "e", Names: streams.Names{Prefix: "a.b"}}, "Names"},
	}
	for _, c := range cases {
		_, err := engine.NewPublisher(c.opts)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewPublisher(%+v) = %v, want an error naming %s", c.opts, err, c.want)
		}
	}
}
