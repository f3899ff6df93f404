package enginesim

import (
	"bytes"
	"container/list"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"hash/maphash"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/internal/zmtp"
	"github.com/switchyard-dev/switchyard/messages"
)

// Defaults of the KV event publisher, vLLM's (ZmqEventPublisher).
const (
	// DefaultKVReplayBuffer is how many past batches the replay socket can resend.
	DefaultKVReplayBuffer = 10_000
	// kvQueue is how many batches may wait for the PUB socket; past it a
	// batch is not sent live (a subscriber heals the gap by replay).
	kvQueue = 4096
)

// Tokenize is the simulator's tokenizer: one token per four bytes of text
// (as its token counts), each token id a hash of its bytes, so that equal
// texts give equal token ids and a shared leading text a shared prefix. A
// chat request's text is each message's role followed by its content, in
// order; a completion's is its prompt.
func Tokenize(text string) []uint32 {
	out := make([]uint32, 0, estimateTokens(len(text)))
	for i := 0; i < len(text); i += 4 {
		h := fnv.New32a()
		_, _ = h.Write([]byte(text[i:min(i+4, len(text))]))
		out = append(out, h.Sum32()%vocabSize)
	}
	return out
}

// vocabSize is the simulator's vocabulary, the size of Llama 3's rounded down.
const vocabSize = 128_000

// KVPublisherOptions configures a KVPublisher.
type KVPublisherOptions struct {
	// Endpoint is the PUB socket's tcp://host:port to bind ("tcp://127.0.0.1:0" picks a port).
	Endpoint string
	// Replay, when set, is the ROUTER replay socket's tcp://host:port to bind.
	Replay string
	// Topic is the first frame of every message (vLLM's default is empty).
	Topic string
	// Buffer is how many batches the replay socket keeps; zero means DefaultKVReplayBuffer.
	Buffer int
	// Logger receives the publisher's log.
	Logger zerolog.Logger
}

// KVPublisher publishes KV event batches as vLLM's ZmqEventPublisher does:
// on a PUB socket, multipart [topic, 8-byte big-endian sequence from 0,
// msgpack batch], and on an optional ROUTER replay socket, answering a
// request [delimiter, 8-byte start sequence] with every buffered batch from
// it as [delimiter, sequence, batch], then [delimiter, -1, empty]. It
// accepts its subscribers itself, through zmtp's frame guard, so that no
// peer can make it allocate more than a frame's limit.
type KVPublisher struct {
	opts   KVPublisherOptions
	log    zerolog.Logger
	pub    net.Listener
	replay net.Listener
	queue  chan [2][]byte
	wg     sync.WaitGroup
	sent   atomic.Uint64 // live batches taken from queue and written to the subscribers of the time

	mu    sync.Mutex
	subs  map[*kvSubscriber]struct{}
	conns map[net.Conn]struct{} // every accepted connection, closed by Close
	next  uint64
	buf   [][2][]byte // ring of [seq bytes, payload], seq next-len(buf) .. next-1
	head  int
}

// kvSubscriber is one connected SUB socket and the topic prefixes it asked for.
type kvSubscriber struct {
	zc     *zmq4.Conn
	raw    net.Conn
	topics [][]byte // guarded by KVPublisher.mu
}

// kvHandshakeTimeout bounds a peer's ZMTP handshake, and kvWriteTimeout one
// message to one subscriber: a subscriber slower than that is dropped, as
// past a PUB socket's high-water mark.
const (
	kvHandshakeTimeout = 5 * time.Second
	kvWriteTimeout     = time.Second
)

// NewKVPublisher binds the sockets and starts publishing.
func NewKVPublisher(opts KVPublisherOptions) (*KVPublisher, error) {
	if opts.Buffer == 0 {
		opts.Buffer = DefaultKVReplayBuffer
	}
	if opts.Buffer < 1 || opts.Buffer > 1<<20 {
		return nil, fmt.Errorf("enginesim: KVPublisherOptions.Buffer is %d, want 1..%d", opts.Buffer, 1<<20)
	}
	p := &KVPublisher{opts: opts, queue: make(chan [2][]byte, kvQueue), subs: map[*kvSubscriber]struct{}{},
		conns: map[net.Conn]struct{}{},
		log:   opts.Logger.With().Str("component", "enginesim").Str("kv_events", opts.Endpoint).Logger()}
	var err error
	if p.pub, err = zmtp.Listen(opts.Endpoint); err != nil {
		return nil, fmt.Errorf("enginesim: KV events: listen on %q: %w", opts.Endpoint, err)
	}
	if opts.Replay != "" {
		if p.replay, err = zmtp.Listen(opts.Replay); err != nil {
			_ = p.pub.Close()
			return nil, fmt.Errorf("enginesim: KV events: replay listen on %q: %w", opts.Replay, err)
		}
		p.wg.Add(1)
		go p.accept(p.replay, zmq4.Router, p.serveReplay)
	}
	p.wg.Add(2)
	go p.accept(p.pub, zmq4.Pub, p.serveSubscriber)
	go p.send()
	return p, nil
}

// Endpoint returns the PUB socket's bound endpoint (with the port picked).
func (p *KVPublisher) Endpoint() string { return "tcp://" + p.pub.Addr().String() }

// ReplayEndpoint returns the replay socket's bound endpoint, empty without one.
func (p *KVPublisher) ReplayEndpoint() string {
	if p.replay == nil {
		return ""
	}
	return "tcp://" + p.replay.Addr().String()
}

// accept serves each connection of l with serve until l is closed.
func (p *KVPublisher) accept(l net.Listener, typ zmq4.SocketType, serve func(*zmq4.Conn, net.Conn)) {
	defer p.wg.Done()
	for {
		zc, raw, err := zmtp.Accept(l, typ, kvHandshakeTimeout)
		if raw == nil {
			return // the listener is closed
		}
		if err != nil {
			p.log.Debug().Err(err).Msg("KV events: handshake")
			continue
		}
		p.mu.Lock()
		p.conns[raw] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() {
				_ = raw.Close()
				p.mu.Lock()
				delete(p.conns, raw)
				p.mu.Unlock()
			}()
			serve(zc, raw)
		}()
	}
}

// serveSubscriber reads a subscriber's subscriptions (a message whose first
// byte is 1 subscribes to the prefix after it, 0 unsubscribes) until it goes.
func (p *KVPublisher) serveSubscriber(zc *zmq4.Conn, raw net.Conn) {
	s := &kvSubscriber{zc: zc, raw: raw}
	p.mu.Lock()
	p.subs[s] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.subs, s)
		p.mu.Unlock()
	}()
	for {
		msg, err := zc.RecvMsg()
		if err != nil {
			return
		}
		if msg.Type == zmq4.CmdMsg || len(msg.Frames) != 1 || len(msg.Frames[0]) == 0 {
			continue
		}
		f := msg.Frames[0]
		topic := append([]byte(nil), f[1:]...)
		p.mu.Lock()
		switch f[0] {
		case 1:
			if len(s.topics) < 64 {
				s.topics = append(s.topics, topic)
			}
		case 0:
			s.topics = slices.DeleteFunc(s.topics, func(t []byte) bool { return bytes.Equal(t, topic) })
		}
		p.mu.Unlock()
	}
}

// Publish encodes b (vLLM's positional form, or maps with asMap), gives it
// the next sequence number, buffers it for replay and queues it for the
// PUB socket. It returns the sequence number.
func (p *KVPublisher) Publish(b messages.VLLMBatch, asMap bool) (uint64, error) {
	return p.publish(b, asMap, true)
}

// Lose is Publish for a batch lost in transit: numbered and buffered for
// replay, never sent live (failure injection for subscribers' gap healing).
func (p *KVPublisher) Lose(b messages.VLLMBatch, asMap bool) (uint64, error) {
	return p.publish(b, asMap, false)
}

func (p *KVPublisher) publish(b messages.VLLMBatch, asMap, live bool) (uint64, error) {
	data, err := messages.EncodeVLLMBatch(b, asMap)
	if err != nil {
		return 0, err
	}
	p.mu.Lock()
	seq := p.next
	p.next++
	item := [2][]byte{binary.BigEndian.AppendUint64(nil, seq), data}
	if len(p.buf) < p.opts.Buffer {
		p.buf = append(p.buf, item)
	} else {
		p.buf[p.head] = item
		p.head = (p.head + 1) % len(p.buf)
	}
	p.mu.Unlock()
	if live {
		select {
		case p.queue <- item:
		default: // the replay buffer has it
		}
	}
	return seq, nil
}

// send writes each queued batch to every subscriber whose topics match.
func (p *KVPublisher) send() {
	defer p.wg.Done()
	topic := []byte(p.opts.Topic)
	var to []*kvSubscriber
	for item := range p.queue {
		to = to[:0]
		p.mu.Lock()
		for s := range p.subs {
			if slices.ContainsFunc(s.topics, func(t []byte) bool { return bytes.HasPrefix(topic, t) }) {
				to = append(to, s)
			}
		}
		p.mu.Unlock()
		for _, s := range to {
			_ = s.raw.SetWriteDeadline(time.Now().Add(kvWriteTimeout))
			if err := s.zc.SendMsg(zmq4.NewMsgFrom(topic, item[0], item[1])); err != nil {
				p.log.Debug().Err(err).Msg("KV events: subscriber dropped")
				_ = s.raw.Close()
			}
		}
		p.sent.Add(1)
	}
}

// Sent returns how many live batches the PUB socket has sent so far, each
// to the subscribers connected when it was sent (none, for a batch
// published before any subscribed: as on a ZMQ PUB socket, it is lost to
// later ones but for the replay buffer). Publish only queues a batch.
func (p *KVPublisher) Sent() uint64 { return p.sent.Load() }

// replayEnd is the sequence frame of the replay's end marker: -1 as 8 bytes.
var replayEnd = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// serveReplay answers one replay connection's requests until it goes: a
// request is [delimiter, start] (from a REQ or DEALER) or [start].
func (p *KVPublisher) serveReplay(zc *zmq4.Conn, raw net.Conn) {
	for {
		req, err := zc.RecvMsg()
		if err != nil {
			return
		}
		f := req.Frames
		if req.Type == zmq4.CmdMsg || len(f) == 0 || len(f) > 2 || len(f[len(f)-1]) != 8 {
			continue
		}
		start := binary.BigEndian.Uint64(f[len(f)-1])
		var items [][2][]byte
		p.mu.Lock()
		for i := range p.buf {
			if it := p.buf[(p.head+i)%len(p.buf)]; binary.BigEndian.Uint64(it[0]) >= start {
				items = append(items, it)
			}
		}
		p.mu.Unlock()
		_ = raw.SetWriteDeadline(time.Now().Add(kvWriteTimeout * time.Duration(1+len(items)/1000)))
		for _, it := range append(items, [2][]byte{replayEnd, nil}) {
			if err := zc.SendMsg(zmq4.NewMsgFrom(nil, it[0], it[1])); err != nil {
				return
			}
		}
	}
}

// Close stops publishing, closes the sockets and every connection, and
// waits for its goroutines.
func (p *KVPublisher) Close() error {
	close(p.queue)
	err := p.pub.Close()
	if p.replay != nil {
		_ = p.replay.Close()
	}
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// prefixCache is the simulator's prefix cache: full blocks of a prompt's
// tokens, keyed by chained block hashes seeded per process (as vLLM's
// NONE_HASH is random unless PYTHONHASHSEED is set), least recently used
// evicted first, every change published as vLLM's KV events.
type prefixCache struct {
	seed      maphash.Seed
	blockSize int
	capacity  int
	pub       *KVPublisher

	mu     sync.Mutex
	blocks map[uint64]*list.Element
	lru    *list.List // of uint64 hashes, most recent first
}

func newPrefixCache(blockSize, capacity int, pub *KVPublisher) *prefixCache {
	return &prefixCache{seed: maphash.MakeSeed(), blockSize: blockSize, capacity: max(1, capacity), pub: pub,
		blocks: map[uint64]*list.Element{}, lru: list.New()}
}

func (c *prefixCache) hash(parent uint64, block []uint32) uint64 {
	var h maphash.Hash
	h.SetSeed(c.seed)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], parent)
	_, _ = h.Write(b[:])
	for _, t := range block {
		binary.LittleEndian.PutUint32(b[:4], t)
		_, _ = h.Write(b[:4])
	}
	return h.Sum64()
}

// observe runs a prompt's tokens through the cache: its leading cached
// blocks are hits (returned, in tokens), the rest are stored, evicting the
// least recently used blocks, and the events are published as one batch.
func (c *prefixCache) observe(tokens []uint32) (hitTokens int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var events []messages.VLLMEvent
	var parent uint64
	hasParent, hitting := false, true
	for i := 0; i+c.blockSize <= len(tokens); i += c.blockSize {
		block := tokens[i : i+c.blockSize]
		h := c.hash(parent, block)
		if el, ok := c.blocks[h]; ok {
			c.lru.MoveToFront(el)
			if hitting {
				hitTokens += c.blockSize
			}
		} else {
			hitting = false
			for len(c.blocks) >= c.capacity {
				old := c.lru.Remove(c.lru.Back()).(uint64)
				delete(c.blocks, old)
				events = append(events, messages.VLLMEvent{Type: messages.VLLMBlockRemoved, Hashes: []uint64{old}, Medium: "GPU"})
			}
			c.blocks[h] = c.lru.PushFront(h)
			if n := len(events); hasParent && n > 0 && events[n-1].Type == messages.VLLMBlockStored &&
				events[n-1].Hashes[len(events[n-1].Hashes)-1] == parent {
				events[n-1].Hashes = append(events[n-1].Hashes, h)
				events[n-1].Tokens = append(events[n-1].Tokens, block...)
			} else {
				events = append(events, messages.VLLMEvent{Type: messages.VLLMBlockStored, Hashes: []uint64{h},
					Parent: parent, HasParent: hasParent, Tokens: append([]uint32(nil), block...),
					BlockSize: c.blockSize, Medium: "GPU"})
			}
		}
		parent, hasParent = h, true
	}
	if len(events) > 0 {
		b := messages.VLLMBatch{TS: float64(time.Now().UnixMicro()) / 1e6, Events: events, DPRank: -1}
		if _, err := c.pub.Publish(b, false); err != nil {
			c.pub.log.Warn().Err(err).Msg("KV events: encode")
		}
	}
	return hitTokens
}

// promptText is the text Tokenize reads for a request (see Tokenize).
func promptText(req *apiRequest, ep endpoint) string {
	var b strings.Builder
	switch ep {
	case completionEndpoint:
		b.WriteString(rawText(req.Prompt))
		return b.String()
	case responsesEndpoint, embeddingsEndpoint:
		b.WriteString(req.Instructions)
		b.WriteString(rawText(req.Input))
		return b.String()
	}
	for _, m := range req.Messages {
		b.WriteString(m.Role)
		b.WriteString(rawText(m.Content))
	}
	return b.String()
}

// rawText is a JSON string's value, or the raw JSON of anything else (as rawLen counts it).
func rawText(raw []byte) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}
