package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/switchyard-dev/switchyard/kvindex"
	"github.com/switchyard-dev/switchyard/kvindex/kvfeed"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/testenv"
)

// fakeVLLM publishes KV event batches as vLLM's ZmqEventPublisher does: a
// PUB socket sending [topic, seq, payload] and a ROUTER replay socket
// answering [delimiter, start seq] with the buffered batches and an end
// marker. Real sockets on 127.0.0.1.
type fakeVLLM struct {
	t      *testing.T
	pub    zmq4.Socket
	replay zmq4.Socket
	topic  string
	mu     sync.Mutex
	buf    map[uint64][]byte
}

func startFakeVLLM(t *testing.T, ctx context.Context, topic string) *fakeVLLM {
	f := &fakeVLLM{t: t, topic: topic, buf: map[uint64][]byte{},
		pub: zmq4.NewPub(ctx), replay: zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("replay")))}
	for _, s := range []zmq4.Socket{f.pub, f.replay} {
		if err := s.Listen("tcp://127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
	}
	go f.serveReplay()
	return f
}

func (f *fakeVLLM) endpoint(s zmq4.Socket) string { return "tcp://" + s.Addr().(*net.TCPAddr).String() }

func (f *fakeVLLM) serveReplay() {
	for {
		req, err := f.replay.Recv()
		if err != nil {
			return
		}
		if len(req.Frames) != 3 || len(req.Frames[2]) != 8 {
			continue
		}
		id, start := req.Frames[0], binary.BigEndian.Uint64(req.Frames[2])
		f.mu.Lock()
		for s := start; ; s++ {
			p, ok := f.buf[s]
			if !ok {
				break
			}
			var sb [8]byte
			binary.BigEndian.PutUint64(sb[:], s)
			_ = f.replay.SendMulti(zmq4.NewMsgFrom(id, nil, sb[:], p))
		}
		f.mu.Unlock()
		end := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
		_ = f.replay.SendMulti(zmq4.NewMsgFrom(id, nil, end, nil))
	}
}

// send buffers batch b under seq and, unless lost, publishes it.
func (f *fakeVLLM) send(seq uint64, b messages.VLLMBatch, asMap, lost bool) {
	data, err := messages.EncodeVLLMBatch(b, asMap)
	if err != nil {
		f.t.Fatal(err)
	}
	f.mu.Lock()
	f.buf[seq] = data
	f.mu.Unlock()
	if lost {
		return
	}
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], seq)
	if err := f.pub.SendMulti(zmq4.NewMsgFrom([]byte(f.topic), sb[:], data)); err != nil {
		f.t.Fatal(err)
	}
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
	vllm := startFakeVLLM(t, ctx, "kv")
	relayOpts := KVRelayOptions{Conn: n.Conn, Names: n.Names, Model: "llama", Engine: "v1",
		Endpoint: vllm.endpoint(vllm.pub), Topic: "kv", Replay: vllm.endpoint(vllm.replay), Retry: 50 * time.Millisecond}
	relay, err := NewKVRelay(relayOpts)
	if err != nil {
		t.Fatal(err)
	}
	feed, err := kvfeed.New(kvfeed.Options{JS: n.JS, Names: n.Names})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(2)
	go func() { defer wg.Done(); _ = relay.Run(ctx) }()
	go func() { defer wg.Done(); _ = feed.Run(ctx) }()

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
	var seq uint64
	testenv.WaitFor(t, 10*time.Second, "the relay's subscription", func() bool {
		seq++
		vllm.send(seq, probe, false, false)
		return relay.Stats().Batches > 0
	})
	testenv.WaitFor(t, 10*time.Second, "the last probe", func() bool { return relay.Stats().LastSeq == seq })

	batch := func(events ...messages.VLLMEvent) messages.VLLMBatch {
		return messages.VLLMBatch{TS: 2, DPRank: -1, Events: events}
	}
	for _, step := range []struct {
		name     string
		seq      uint64 // 0: the next
		batch    messages.VLLMBatch
		asMap    bool
		lost     bool // buffered for replay, not published
		want     int
		noReplay bool
	}{
		{name: "two blocks stored", batch: batch(stored(0, false, prompt[:8], 11, 12)), want: 2},
		{name: "two more, chained on the parent hash, map encoding", batch: batch(stored(12, true, prompt[8:], 13, 14)), asMap: true, want: 4},
		{name: "the third removed", batch: batch(messages.VLLMEvent{Type: messages.VLLMBlockRemoved, Hashes: []uint64{13}}), want: 2},
		{name: "a lost batch stores it again", batch: batch(stored(12, true, prompt[8:12], 13)), lost: true, want: 2},
		{name: "the next batch: the gap is replayed", batch: batch(), want: 4},
		{name: "an unknown parent is not relayed", batch: batch(stored(777, true, tokens(1, 4), 15)), want: 4},
		{name: "all blocks cleared", batch: batch(messages.VLLMEvent{Type: messages.VLLMAllBlocksCleared}), want: 0},
		{name: "stored again", batch: batch(stored(0, false, prompt[:4], 21)), want: 1},
		{name: "the engine restarts: the sequence goes back", seq: 1, batch: batch(), want: 0},
		{name: "stored after the restart", batch: batch(stored(0, false, prompt[:8], 31, 32)), want: 2},
	} {
		if step.seq != 0 {
			seq = step.seq
		} else {
			seq++
		}
		before := relay.Stats().Batches
		vllm.send(seq, step.batch, step.asMap, step.lost)
		if !step.lost {
			testenv.WaitFor(t, 10*time.Second, step.name+": batch applied", func() bool { return relay.Stats().Batches > before })
		}
		testenv.WaitFor(t, 10*time.Second, step.name, func() bool { return held() == step.want })
	}
	s := relay.Stats()
	if s.Gaps != 1 || s.Healed != 1 || s.Restarts != 1 || s.Unresolved != 1 || s.Bad != 0 {
		t.Fatalf("relay stats %+v: want 1 gap healed, 1 restart, 1 unresolved block, nothing bad", s)
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

// TestFrameGuard feeds the guard ZMTP byte streams: frames within the
// limits pass, a header claiming more than maxZMQFrame bytes or a message of
// too many frames fails before the ZMQ library could allocate.
func TestFrameGuard(t *testing.T) {
	greeting := make([]byte, 64)
	long := func(size uint64) []byte {
		h := []byte{0x02, 0, 0, 0, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint64(h[1:], size)
		return h
	}
	many := []byte{}
	for range maxZMQFrames + 1 {
		many = append(many, 0x01, 0)
	}
	for _, tc := range []struct {
		name   string
		stream []byte
		ok     bool
	}{
		{"short frames", append(append([]byte{}, greeting...), 0x01, 2, 'a', 'b', 0x00, 1, 'c'), true},
		{"a long frame within the limit", append(append(append([]byte{}, greeting...), long(3)...), 'x', 'y', 'z'), true},
		{"a header claiming 2^62 bytes", append(append([]byte{}, greeting...), long(1<<62)...), false},
		{"a header claiming one byte over the limit", append(append([]byte{}, greeting...), long(maxZMQFrame+1)...), false},
		{"too many frames in one message", append(append([]byte{}, greeting...), many...), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Fed one byte at a time and all at once: headers split across reads too.
			for _, step := range []int{1, len(tc.stream)} {
				c, peer := net.Pipe()
				defer c.Close()
				defer peer.Close()
				g := newFrameGuard(c)
				var err error
				for i := 0; i < len(tc.stream) && err == nil; i += step {
					err = g.check(tc.stream[i:min(i+step, len(tc.stream))])
				}
				if (err == nil) != tc.ok {
					t.Fatalf("step %d: check = %v, want ok %v", step, err, tc.ok)
				}
			}
		})
	}
}
