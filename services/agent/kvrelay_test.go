package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/kvindex"
	"github.com/switchyard-dev/switchyard/kvindex/kvfeed"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/enginesim"
	"github.com/switchyard-dev/switchyard/testenv"
)

// startVLLMPublisher binds the simulator's vLLM-format KV event publisher
// (PUB and replay sockets) on 127.0.0.1, on the given endpoints or fresh ports.
func startVLLMPublisher(t *testing.T, endpoint, replay string) *enginesim.KVPublisher {
	t.Helper()
	p, err := enginesim.NewKVPublisher(enginesim.KVPublisherOptions{Endpoint: endpoint, Replay: replay, Topic: "kv"})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// runWithFeed runs publisher (a relay or an agent) and a feed of the
// index from SY_KV until the test ends, and returns the feed.
func runWithFeed(t *testing.T, ctx context.Context, cancel context.CancelFunc, n *testenv.NATS, publisher func(context.Context) error) *kvfeed.Feed {
	t.Helper()
	feed, err := kvfeed.New(kvfeed.Options{JS: n.JS, Names: n.Names})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	t.Cleanup(cancel)
	wg.Add(2)
	go func() { defer wg.Done(); _ = publisher(ctx) }()
	go func() { defer wg.Done(); _ = feed.Run(ctx) }()
	return feed
}

func tokens(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func stored(parent uint64, hasParent bool, toks []uint32, hashes ...uint64) messages.VLLMEvent {
	return messages.VLLMEvent{Type: messages.VLLMBlockStored, Hashes: hashes, Parent: parent, HasParent: hasParent,
		Tokens: toks, BlockSize: 4}
}

// TestKVRelayEndToEnd runs vLLM-format events over real ZMQ sockets through
// the agent's relay, JetStream (an embedded server) and the feed into the
// index, and checks the index's answer after each step: stores, removals,
// a gap healed by replay, a gap that cannot be healed, an engine restart,
// both encodings.
func TestKVRelayEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n := testenv.StartNATS(t)
	vllm := startVLLMPublisher(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
	defer func() { _ = vllm.Close() }()
	relayOpts := KVRelayOptions{Conn: n.Conn, Names: n.Names, Model: "llama", Engine: "v1",
		Endpoint: vllm.Endpoint(), Topic: "kv", Replay: vllm.ReplayEndpoint(), Retry: 50 * time.Millisecond}
	relay, err := NewKVRelay(relayOpts)
	if err != nil {
		t.Fatal(err)
	}
	feed := runWithFeed(t, ctx, cancel, n, relay.Run)

	prompt := tokens(100, 16) // four blocks of four tokens
	keys := kvindex.BlockKeys(nil, 0, prompt, 4)
	held := func() int {
		x := feed.Index("llama")
		if x == nil {
			return -1
		}
		for _, m := range x.Longest(nil, keys) {
			if m.Engine == "v1" {
				return m.Blocks
			}
		}
		return 0
	}
	// The SUB connection is up when a probe batch arrives; vLLM's PUB drops
	// what it sends before a subscriber joins, as this one does.
	probe := messages.VLLMBatch{TS: 1, DPRank: -1, Events: []messages.VLLMEvent{stored(0, false, tokens(9000, 4), 900)}}
	subscribed := func(p *enginesim.KVPublisher, before uint64) {
		var seq uint64
		testenv.WaitFor(t, 10*time.Second, "the relay's subscription", func() bool {
			var err error
			if seq, err = p.Publish(probe, false); err != nil {
				t.Fatal(err)
			}
			return relay.Stats().Batches > before
		})
		testenv.WaitFor(t, 10*time.Second, "the last probe", func() bool { return relay.Stats().LastSeq == seq })
	}
	subscribed(vllm, 0)

	batch := func(events ...messages.VLLMEvent) messages.VLLMBatch {
		return messages.VLLMBatch{TS: 2, DPRank: -1, Events: events}
	}
	for _, step := range []struct {
		name    string
		restart bool // the engine restarts first: a new publisher on the same ports
		batch   messages.VLLMBatch
		asMap   bool
		lost    bool // buffered for replay, not published
		want    int
	}{
		{name: "two blocks stored", batch: batch(stored(0, false, prompt[:8], 11, 12)), want: 2},
		{name: "two more, chained on the parent hash, map encoding", batch: batch(stored(12, true, prompt[8:], 13, 14)), asMap: true, want: 4},
		{name: "the third removed", batch: batch(messages.VLLMEvent{Type: messages.VLLMBlockRemoved, Hashes: []uint64{13}}), want: 2},
		{name: "a lost batch stores it again", batch: batch(stored(12, true, prompt[8:12], 13)), lost: true, want: 2},
		{name: "the next batch: the gap is replayed", batch: batch(), want: 4},
		{name: "an unknown parent is not relayed", batch: batch(stored(777, true, tokens(1, 4), 15)), want: 4},
		{name: "all blocks cleared", batch: batch(messages.VLLMEvent{Type: messages.VLLMAllBlocksCleared}), want: 0},
		{name: "stored again", batch: batch(stored(0, false, prompt[:4], 21)), want: 1},
		{name: "stored after the engine restarted", restart: true, batch: batch(stored(0, false, prompt[:8], 31, 32)), want: 2},
	} {
		if step.restart {
			pub, replay := vllm.Endpoint(), vllm.ReplayEndpoint()
			if err := vllm.Close(); err != nil {
				t.Fatal(err)
			}
			vllm = startVLLMPublisher(t, pub, replay)
			subscribed(vllm, relay.Stats().Batches)
			testenv.WaitFor(t, 10*time.Second, "the restart clears the engine", func() bool { return held() == 0 })
		}
		before := relay.Stats().Batches
		var err error
		if step.lost {
			_, err = vllm.Lose(step.batch, step.asMap)
		} else {
			_, err = vllm.Publish(step.batch, step.asMap)
		}
		if err != nil {
			t.Fatal(err)
		}
		if !step.lost {
			testenv.WaitFor(t, 10*time.Second, step.name+": batch applied", func() bool { return relay.Stats().Batches > before })
		}
		testenv.WaitFor(t, 10*time.Second, step.name, func() bool { return held() == step.want })
	}
	s := relay.Stats()
	if s.Gaps != 1 || s.Healed != 1 || s.Reconnects != 1 || s.Unresolved != 1 || s.Bad != 0 {
		t.Fatalf("relay stats %+v: want 1 gap healed, 1 reconnect, 1 unresolved block, nothing bad", s)
	}
	if fs := feed.Stats(); fs.Bad != 0 || fs.Gaps != 0 {
		t.Fatalf("feed stats %+v: want nothing bad and no gap", fs)
	}
}

func TestEngineSpecKVEvents(t *testing.T) {
	for _, tc := range []struct {
		spec    string
		valid   bool
		kv, top string
	}{
		{"name=v1,url=http://127.0.0.1:1,metrics=vllm,kv_events=tcp://127.0.0.1:5557,kv_topic=kv", true, "tcp://127.0.0.1:5557", "kv"},
		{"name=v1,url=http://127.0.0.1:1,metrics=vllm,kv-events=tcp://127.0.0.1:5557,kv_replay=tcp://127.0.0.1:5558", true, "tcp://127.0.0.1:5557", ""},
		{"name=v1,url=http://127.0.0.1:1,metrics=vllm,kv_events=ipc:///x", false, "ipc:///x", ""},
		{"name=v1,url=http://127.0.0.1:1,metrics=vllm,kv_events=tcp://nohost", false, "tcp://nohost", ""},
	} {
		e, err := ParseEngineSpec(tc.spec, "llama", "")
		if err != nil {
			t.Fatalf("%s: %v", tc.spec, err)
		}
		if e.KVEvents != tc.kv || e.KVTopic != tc.top {
			t.Errorf("%s: KVEvents %q, KVTopic %q", tc.spec, e.KVEvents, e.KVTopic)
		}
		if err := (Options{Engines: []EngineConfig{e}}).Validate(); (err == nil || errors.Is(err, ErrNoConn)) != tc.valid {
			t.Errorf("%s: Validate = %v, valid %v", tc.spec, err, tc.valid)
		}
	}
}

// TestKVEventsThroughSimulator runs the whole path with no GPU: two
// simulated engines in vLLM mode keep prefix caches and publish vLLM's KV
// events over ZMQ; one agent serves both (signals and KV events, as
// `switchyard agent --engine ...,kv_events=...` does); the feed builds the
// index from SY_KV. A conversation sent to one engine is found on that
// engine only, to the depth of its full blocks; sent to the other too, on
// both; a different system prompt on neither.
func TestKVEventsThroughSimulator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n := testenv.StartNATS(t)
	engines := map[string]*enginesim.Engine{}
	var specs []EngineConfig
	for _, name := range []string{"v1", "v2"} {
		e, err := enginesim.New(enginesim.Options{
			Name: name, Model: "llama", MaxBatch: 4, PrefillMsPerToken: 0.01, BaseTBTMs: 1, TBTGrowthMs: 0.1,
			OutputTokens: 4, PromptTokens: 100, KVTokens: 64 * 1024, Seed: 1, MetricsFormat: enginesim.MetricsVLLM,
			KVEvents: "tcp://127.0.0.1:0", KVReplay: "tcp://127.0.0.1:0",
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		engines[name] = e
		pub, replay := e.KVEndpoint()
		spec, err := ParseEngineSpec("name="+name+",url="+e.URL()+",metrics=vllm,kv_events="+pub+",kv_replay="+replay, "llama", "")
		if err != nil {
			t.Fatal(err)
		}
		specs = append(specs, spec)
	}
	a, err := New(Options{Conn: n.Conn, Names: n.Names, Engines: specs, Interval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	feed := runWithFeed(t, ctx, cancel, n, a.Run)

	system := strings.Repeat("You are a careful assistant who answers in full sentences. ", 40) // ~2.4 KB: several blocks
	chat := func(engine, system, user string) {
		body := `{"model":"llama","max_tokens":2,"messages":[{"role":"system","content":` + strconv.Quote(system) +
			`},{"role":"user","content":` + strconv.Quote(user) + `}]}`
		resp, err := http.Post(engines[engine].URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("chat to %s: status %d", engine, resp.StatusCode)
		}
	}
	// What a router computes for a new turn: the simulator's tokens of the
	// conversation so far, chained into content keys.
	keysOf := func(system, user string) []uint64 {
		return kvindex.BlockKeys(nil, 0, enginesim.Tokenize("system"+system+"user"+user), 16)
	}
	holders := func(keys []uint64) map[string]int {
		out := map[string]int{}
		if x := feed.Index("llama"); x != nil {
			for _, m := range x.Longest(nil, keys) {
				out[m.Engine] = m.Blocks
			}
		}
		return out
	}
	// The relays must be subscribed before the engines' events count:
	// vLLM's PUB socket, like any, drops what it sends before that.
	// Each attempt sends a new prompt: a repeated one would hit the cache and
	// publish nothing.
	attempt := 0
	testenv.WaitFor(t, 10*time.Second, "both relays subscribed", func() bool {
		attempt++
		for _, name := range []string{"v1", "v2"} {
			warm := strings.Repeat("warm-up "+strconv.Itoa(attempt)+" of "+name+". ", 8) // more than one block
			chat(name, warm, "hello")
			if len(holders(keysOf(warm, "hello"))) == 0 {
				return false
			}
		}
		return true
	})
	turn := keysOf(system, "What is a prefix cache?")
	full := len(turn)
	if full < 8 {
		t.Fatalf("the conversation makes %d blocks, want several", full)
	}
	for _, step := range []struct {
		name   string
		engine string
		keys   []uint64
		want   map[string]int
	}{
		{"sent to v1: held by v1 alone", "v1", turn, map[string]int{"v1": full}},
		{"a new turn on v1's prefix: v1 holds the shared blocks", "", keysOf(system, "What is a prefix cache? And a block?"),
			map[string]int{"v1": len(kvindex.BlockKeys(nil, 0, enginesim.Tokenize("system"+system+"userWhat is a prefix cache?"), 16))}},
		{"sent to v2 too: held by both", "v2", turn, map[string]int{"v1": full, "v2": full}},
		{"another system prompt: held by none", "", keysOf(strings.ToUpper(system), "What is a prefix cache?"), map[string]int{}},
	} {
		if step.engine != "" {
			chat(step.engine, system, "What is a prefix cache?")
		}
		testenv.WaitFor(t, 10*time.Second, step.name, func() bool {
			got := holders(step.keys)
			if len(got) != len(step.want) {
				return false
			}
			for e, b := range step.want {
				if got[e] != b {
					return false
				}
			}
			return true
		})
	}
	// The relays' counters are on the agent's registry.
	families, err := a.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	applied := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "switchyard_agent_kv_batches_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["result"] == "applied" {
				applied[labels["engine"]] = m.GetCounter().GetValue()
			}
		}
	}
	if applied["v1"] < 2 || applied["v2"] < 2 {
		t.Fatalf("switchyard_agent_kv_batches_total{result=applied} = %v, want >= 2 for v1 and v2", applied)
	}
}

// TestKVRelayCatchUp starts the relay after the engine stored blocks: the
// relay takes them from the replay buffer when its first live batch comes.
func TestKVRelayCatchUp(t *testing.T) {
	for _, tc := range []struct {
		name   string
		replay bool
		want   int
	}{{"with a replay endpoint", true, 2}, {"without one", false, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			n := testenv.StartNATS(t)
			vllm := startVLLMPublisher(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
			defer func() { _ = vllm.Close() }()
			prompt := tokens(500, 8)
			if _, err := vllm.Publish(messages.VLLMBatch{TS: 1, DPRank: -1, Events: []messages.VLLMEvent{
				stored(0, false, prompt, 41, 42)}}, false); err != nil {
				t.Fatal(err)
			}
			// Publish queues the batch; it is lost to subscribers only once
			// the socket has sent it with none connected.
			testenv.WaitFor(t, 10*time.Second, "the early batch sent before the relay subscribes", func() bool { return vllm.Sent() == 1 })
			opts := KVRelayOptions{Conn: n.Conn, Names: n.Names, Model: "llama", Engine: "v1", Endpoint: vllm.Endpoint(), Topic: "kv"}
			if tc.replay {
				opts.Replay = vllm.ReplayEndpoint()
			}
			relay, err := NewKVRelay(opts)
			if err != nil {
				t.Fatal(err)
			}
			feed := runWithFeed(t, ctx, cancel, n, relay.Run)
			probe := messages.VLLMBatch{TS: 2, DPRank: -1, Events: []messages.VLLMEvent{stored(0, false, tokens(9000, 4), 900)}}
			testenv.WaitFor(t, 10*time.Second, "the relay's subscription", func() bool {
				if _, err := vllm.Publish(probe, false); err != nil {
					t.Fatal(err)
				}
				return relay.Stats().Batches > 0
			})
			keys := kvindex.BlockKeys(nil, 0, prompt, 4)
			testenv.WaitFor(t, 10*time.Second, "the probe indexed", func() bool {
				x := feed.Index("llama")
				return x != nil && x.EngineBlocks("v1") > 0
			})
			got := 0
			for _, m := range feed.Index("llama").Longest(nil, keys) {
				got = m.Blocks
			}
			if got != tc.want {
				t.Fatalf("the index holds %d of the early blocks, want %d", got, tc.want)
			}
		})
	}
}

// TestKVRelaySequence feeds sequence numbers straight to the relay (no
// ZMQ, no replay endpoint): a skip is a gap that clears, a step back a
// restart that clears, and the first batch starts the count.
func TestKVRelaySequence(t *testing.T) {
	n := testenv.StartNATS(t)
	empty, err := messages.EncodeVLLMBatch(messages.VLLMBatch{TS: 1, DPRank: -1}, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name              string
		seqs              []uint64
		gaps, restarts    uint64
		wantCleared, last uint64
	}{
		{"in order from 0", []uint64{0, 1, 2}, 0, 0, 0, 2},
		{"joined late, in order after", []uint64{7, 8}, 0, 0, 0, 8},
		{"a skip", []uint64{0, 1, 3}, 1, 0, 1, 3},
		{"a step back", []uint64{5, 6, 0, 1}, 0, 1, 1, 1},
		{"a repeat is a restart too", []uint64{5, 5}, 0, 1, 1, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := NewKVRelay(KVRelayOptions{Conn: n.Conn, Names: n.Names, Model: "llama", Engine: "v1", Endpoint: "tcp://127.0.0.1:1"})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			r.reset()
			r.flush(ctx)
			for _, s := range tc.seqs {
				r.receive(ctx, s, empty)
			}
			st := r.Stats()
			// Published: the start's Cleared plus one per clear.
			if st.Gaps != tc.gaps || st.Restarts != tc.restarts || st.Published != 1+tc.wantCleared || st.LastSeq != tc.last {
				t.Fatalf("stats %+v: want %d gaps, %d restarts, %d messages, last %d", st, tc.gaps, tc.restarts, 1+tc.wantCleared, tc.last)
			}
		})
	}
}

// TestKVRelayHostileEndpoint points the relay at a ZMQ peer that completes
// the handshake and then claims a frame of 2^40 bytes: the relay drops the
// connection before anything is allocated, and dials again.
func TestKVRelayHostileEndpoint(t *testing.T) {
	n := testenv.StartNATS(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var accepted sync.WaitGroup
	conns := make(chan struct{}, 16)
	accepted.Add(1)
	go func() {
		defer accepted.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			select {
			case conns <- struct{}{}:
			default:
			}
			greeting := make([]byte, 64)
			greeting[0], greeting[9], greeting[10] = 0xff, 0x7f, 3
			copy(greeting[12:], "NULL")
			ready := []byte("\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB")
			hostile := []byte{0x02, 0, 0, 1, 0, 0, 0, 0, 0} // a long frame of 2^40 bytes
			_, _ = c.Write(append(append(append(greeting, 0x04, byte(len(ready))), ready...), hostile...))
			// Hold the connection until the relay drops it.
			_, _ = io.Copy(io.Discard, c)
			_ = c.Close()
		}
	}()
	r, err := NewKVRelay(KVRelayOptions{Conn: n.Conn, Names: n.Names, Model: "llama", Engine: "v1",
		Endpoint: "tcp://" + l.Addr().String(), Retry: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	for i := range 3 {
		select {
		case <-conns:
		case <-ctx.Done():
			t.Fatalf("the relay dialled %d times, want 3: it did not drop the hostile connection", i)
		}
	}
	cancel()
	<-done
	_ = l.Close()
	accepted.Wait()
	if s := r.Stats(); s.Batches != 0 {
		t.Fatalf("stats %+v: a hostile frame was applied", s)
	}
}
