package enginesim

import (
	"container/list"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"hash/maphash"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/rs/zerolog"
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
// it as [delimiter, sequence, batch], then [delimiter, -1, empty].
type KVPublisher struct {
	opts   KVPublisherOptions
	log    zerolog.Logger
	pub    zmq4.Socket
	replay zmq4.Socket
	queue  chan [2][]byte
	wg     sync.WaitGroup
	cancel context.CancelFunc

	mu   sync.Mutex
	next uint64
	buf  [][2][]byte // ring of [seq bytes, payload], seq next-len(buf) .. next-1
	head int
}

// NewKVPublisher binds the sockets and starts publishing.
func NewKVPublisher(opts KVPublisherOptions) (*KVPublisher, error) {
	if opts.Buffer == 0 {
		opts.Buffer = DefaultKVReplayBuffer
	}
	if opts.Buffer < 1 || opts.Buffer > 1<<20 {
		return nil, fmt.Errorf("enginesim: KVPublisherOptions.Buffer is %d, want 1..%d", opts.Buffer, 1<<20)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &KVPublisher{opts: opts, cancel: cancel, queue: make(chan [2][]byte, kvQueue),
		log: opts.Logger.With().Str("component", "enginesim").Str("kv_events", opts.Endpoint).Logger()}
	p.pub = zmq4.NewPub(ctx)
	if err := p.pub.Listen(opts.Endpoint); err != nil {
		cancel()
		return nil, fmt.Errorf("enginesim: KV events: listen on %q: %w", opts.Endpoint, err)
	}
	if opts.Replay != "" {
		p.replay = zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("replay")))
		if err := p.replay.Listen(opts.Replay); err != nil {
			_ = p.pub.Close()
			cancel()
			return nil, fmt.Errorf("enginesim: KV events: replay listen on %q: %w", opts.Replay, err)
		}
		p.wg.Add(1)
		go p.serveReplay()
	}
	p.wg.Add(1)
	go p.send()
	return p, nil
}

// Endpoint returns the PUB socket's bound endpoint (with the port picked).
func (p *KVPublisher) Endpoint() string { return tcpEndpoint(p.pub) }

// ReplayEndpoint returns the replay socket's bound endpoint, empty without one.
func (p *KVPublisher) ReplayEndpoint() string {
	if p.replay == nil {
		return ""
	}
	return tcpEndpoint(p.replay)
}

func tcpEndpoint(s zmq4.Socket) string {
	if a, ok := s.Addr().(*net.TCPAddr); ok {
		return "tcp://" + a.String()
	}
	return ""
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

func (p *KVPublisher) send() {
	defer p.wg.Done()
	for item := range p.queue {
		if err := p.pub.SendMulti(zmq4.NewMsgFrom([]byte(p.opts.Topic), item[0], item[1])); err != nil {
			p.log.Debug().Err(err).Msg("KV events: send")
		}
	}
}

// replayEnd is the sequence frame of the replay's end marker: -1 as 8 bytes.
var replayEnd = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

func (p *KVPublisher) serveReplay() {
	defer p.wg.Done()
	for {
		req, err := p.replay.Recv()
		if err != nil {
			return
		}
		// [identity, delimiter, start] from a REQ or DEALER; [identity, start] without a delimiter.
		f := req.Frames
		if len(f) < 2 || len(f[len(f)-1]) != 8 {
			continue
		}
		start := binary.BigEndian.Uint64(f[len(f)-1])
		var items [][2][]byte
		p.mu.Lock()
		for i := range p.buf {
			it := p.buf[(p.head+i)%len(p.buf)]
			if binary.BigEndian.Uint64(it[0]) >= start {
				items = append(items, it)
			}
		}
		p.mu.Unlock()
		for _, it := range items {
			_ = p.replay.SendMulti(zmq4.NewMsgFrom(f[0], nil, it[0], it[1]))
		}
		_ = p.replay.SendMulti(zmq4.NewMsgFrom(f[0], nil, replayEnd, nil))
	}
}

// Close stops publishing and closes the sockets.
func (p *KVPublisher) Close() error {
	close(p.queue)
	p.cancel()
	err := p.pub.Close()
	if p.replay != nil {
		_ = p.replay.Close()
	}
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
	if ep == completionEndpoint {
		b.WriteString(rawText(req.Prompt))
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
