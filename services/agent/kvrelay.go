package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/switchyard-dev/switchyard/internal/zmtp"
	"github.com/switchyard-dev/switchyard/kvindex"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/streams"
)

// Defaults of a KVRelay.
const (
	// DefaultKVRetry is the wait before re-dialling an engine's KV event
	// endpoint; vLLM binds it at start, so an engine that is starting up
	// answers within a few of these.
	DefaultKVRetry = time.Second
	// DefaultReplayTimeout bounds a replay request: vLLM answers from memory,
	// so a second is ample, and a gap not healed by then is cleared instead.
	DefaultReplayTimeout = time.Second
)

// KVRelayOptions configures a KVRelay: one engine's vLLM KV event endpoint.
type KVRelayOptions struct {
	// Conn is the NATS connection events are published on. Required.
	Conn *nats.Conn
	// Names is the NATS layout; the zero value means streams.DefaultNames().
	Names streams.Names
	// Model and Engine name the engine (NATS tokens). Required.
	Model, Engine string
	// Endpoint is vLLM's ZMQ PUB endpoint, tcp://host:port (its
	// --kv-events-config endpoint as seen from the agent). Required.
	Endpoint string
	// Topic is the subscription prefix (vLLM's topic; empty takes every message).
	Topic string
	// Replay, when set, is vLLM's ZMQ ROUTER replay endpoint, asked for the
	// batches of a sequence gap before the engine's blocks are cleared.
	Replay string
	// MaxBlocks caps the engine hashes the relay translates; zero means
	// kvindex.DefaultMaxBlocksPerEngine. Blocks past it are not relayed.
	MaxBlocks int
	// Retry and ReplayTimeout: see the defaults.
	Retry, ReplayTimeout time.Duration
	// Logger receives the relay's log.
	Logger zerolog.Logger
}

func (o KVRelayOptions) withDefaults() KVRelayOptions {
	if o.Names == (streams.Names{}) {
		o.Names = streams.DefaultNames()
	}
	if o.MaxBlocks == 0 {
		o.MaxBlocks = kvindex.DefaultMaxBlocksPerEngine
	}
	if o.Retry == 0 {
		o.Retry = DefaultKVRetry
	}
	if o.ReplayTimeout == 0 {
		o.ReplayTimeout = DefaultReplayTimeout
	}
	return o
}

// Validate names the first field of o (after defaults) that is not usable.
func (o KVRelayOptions) Validate() error {
	o = o.withDefaults()
	if err := messages.CheckName("KVRelayOptions.Engine", o.Engine); err != nil {
		return fmt.Errorf("%w: %v", ErrOptions, err)
	}
	if err := messages.CheckModelName(o.Model); err != nil {
		return fmt.Errorf("%w: KVRelayOptions.Model: %v", ErrOptions, err)
	}
	if _, err := zmtp.TCPAddr(o.Endpoint); err != nil {
		return fmt.Errorf("%w: KVRelayOptions.Endpoint: %v", ErrOptions, err)
	}
	if o.Replay != "" {
		if _, err := zmtp.TCPAddr(o.Replay); err != nil {
			return fmt.Errorf("%w: KVRelayOptions.Replay: %v", ErrOptions, err)
		}
	}
	switch {
	case o.MaxBlocks < 1 || o.MaxBlocks > 1<<26:
		return fmt.Errorf("%w: KVRelayOptions.MaxBlocks is %d, want 1..%d", ErrOptions, o.MaxBlocks, 1<<26)
	case o.Retry <= 0 || o.ReplayTimeout <= 0:
		return fmt.Errorf("%w: KVRelayOptions.Retry (%s) and ReplayTimeout (%s) must be > 0", ErrOptions, o.Retry, o.ReplayTimeout)
	case o.Conn == nil:
		return fmt.Errorf("%w: KVRelayOptions.Conn is nil, want a NATS connection", ErrOptions)
	}
	return nil
}

// KVStats counts what a KVRelay did.
type KVStats struct {
	// Batches counts vLLM batches applied (replayed ones included); Bad those
	// that did not decode or had the wrong frames.
	Batches, Bad uint64
	// Gaps counts sequence gaps; Healed those the replay filled; Restarts
	// sequence resets (an engine restart); Reconnects connections lost after
	// batches came (each starts the engine's blocks over).
	Gaps, Healed, Restarts, Reconnects uint64
	// Published counts KVEvents messages sent; PublishFailures those not stored.
	Published, PublishFailures uint64
	// Unresolved counts stored blocks whose parent the relay did not know,
	// and Dropped those past MaxBlocks: neither is relayed.
	Unresolved, Dropped uint64
	// Blocks is how many engine blocks the relay translates now.
	Blocks int
	// LastSeq is the vLLM sequence number last applied.
	LastSeq uint64
}

// KVRelay subscribes to one engine's vLLM KV events over ZMQ, translates
// its block hashes into Switchyard content keys (kvindex.ChainKey over the
// token ids vLLM sends), and publishes messages.KVEvents on
// <prefix>.kv.<model>.<engine>. A sequence gap is healed from vLLM's replay
// endpoint when one is configured and still holds the missing batches;
// otherwise, and when the sequence goes back (the engine restarted), the
// relay publishes Cleared and starts the engine's blocks over.
type KVRelay struct {
	opts    KVRelayOptions
	log     zerolog.Logger
	js      jetstream.JetStream
	subject string
	epoch   int64

	// Owned by Run's goroutine.
	seq      uint64 // KVEvents sequence of this epoch
	last     uint64 // vLLM sequence last applied
	started  bool   // a vLLM batch was applied
	trans    map[uint64]uint64
	refs     map[uint64]int32
	cur      messages.KVEvents
	curStore map[uint64]bool

	stats struct {
		batches, bad, gaps, healed, restarts, published, pubFailures, unresolved, dropped, blocks, last, reconnects atomic.Uint64
	}
}

// NewKVRelay validates opts and returns a relay that does nothing until Run.
func NewKVRelay(opts KVRelayOptions) (*KVRelay, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	js, err := jetstream.New(opts.Conn)
	if err != nil {
		return nil, fmt.Errorf("agent: KV relay of %s: %w", opts.Engine, err)
	}
	subject, err := opts.Names.KVSubject(opts.Model, opts.Engine)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrOptions, err)
	}
	r := &KVRelay{opts: opts, js: js, subject: subject, epoch: time.Now().UnixMilli(),
		trans: map[uint64]uint64{}, refs: map[uint64]int32{}, curStore: map[uint64]bool{},
		log: opts.Logger.With().Str("component", "agent").Str("model", opts.Model).
			Str("engine", opts.Engine).Str("kv_events", opts.Endpoint).Logger()}
	return r, nil
}

// Stats returns the relay's counters.
func (r *KVRelay) Stats() KVStats {
	s := &r.stats
	return KVStats{Batches: s.batches.Load(), Bad: s.bad.Load(), Gaps: s.gaps.Load(), Healed: s.healed.Load(),
		Restarts: s.restarts.Load(), Reconnects: s.reconnects.Load(), Published: s.published.Load(), PublishFailures: s.pubFailures.Load(),
		Unresolved: s.unresolved.Load(), Dropped: s.dropped.Load(), Blocks: int(s.blocks.Load()), LastSeq: s.last.Load()}
}

// Run relays until ctx ends, re-dialling the endpoint after Retry whenever
// the connection fails. Its first message (and the first after any loss it
// cannot heal) says Cleared, so consumers forget what an earlier agent
// reported for the engine.
func (r *KVRelay) Run(ctx context.Context) error {
	r.reset()
	r.flush(ctx)
	for ctx.Err() == nil {
		err := r.session(ctx)
		if ctx.Err() != nil {
			break
		}
		if r.started {
			// A lost connection most often means the engine went away, and a
			// restarted vLLM may have numbered past the last batch seen
			// before the relay is back: a gap would then be "healed" from
			// the new process's buffer over the old one's blocks. So the
			// relay starts over, and catches up from the replay buffer.
			r.stats.reconnects.Add(1)
			r.reset()
			r.flush(ctx)
			r.started = false
		}
		r.log.Warn().Err(err).Dur("retry", r.opts.Retry).Msg("KV event connection lost; re-dialling")
		t := time.NewTimer(r.opts.Retry)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
	return nil
}

// session dials the endpoint once and applies batches until it fails.
func (r *KVRelay) session(ctx context.Context) error {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	zc, raw, err := zmtp.Dial(dctx, r.opts.Endpoint, zmq4.Sub)
	cancel()
	if err != nil {
		return err
	}
	defer raw.Close()
	stop := context.AfterFunc(ctx, func() { _ = raw.Close() })
	defer stop()
	if err := zc.SendMsg(zmq4.NewMsg(append([]byte{1}, r.opts.Topic...))); err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	r.log.Info().Msg("subscribed to KV events")
	for {
		msg, err := zc.RecvMsg()
		if err != nil {
			return err
		}
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			r.stats.bad.Add(1)
			continue
		}
		r.receive(ctx, binary.BigEndian.Uint64(msg.Frames[1]), msg.Frames[2])
	}
}

// receive applies the batch of vLLM sequence seq, healing a gap before it.
func (r *KVRelay) receive(ctx context.Context, seq uint64, payload []byte) {
	switch {
	case !r.started:
		// What the engine stored before this relay listened is in vLLM's
		// replay buffer while the engine is young (10,000 batches): take it
		// from the start when it is there, else begin here.
		if seq > 0 && !r.heal(ctx, 0, seq) && r.started {
			r.reset() // a part of the history: worse than none
		}
	case seq == r.last+1:
	case seq <= r.last:
		r.stats.restarts.Add(1)
		r.log.Info().Uint64("seq", seq).Uint64("last", r.last).Msg("KV event sequence went back: the engine restarted; clearing its blocks")
		r.reset()
	default:
		r.stats.gaps.Add(1)
		if r.heal(ctx, r.last+1, seq) {
			r.stats.healed.Add(1)
		} else {
			r.log.Warn().Uint64("seq", seq).Uint64("last", r.last).Msg("KV events lost and not replayed; clearing the engine's blocks")
			r.reset()
		}
	}
	r.apply(ctx, seq, payload)
}

// apply decodes and applies one batch and publishes what it changed.
func (r *KVRelay) apply(ctx context.Context, seq uint64, payload []byte) {
	b, err := messages.DecodeVLLMBatch(payload)
	r.started, r.last = true, seq
	r.stats.last.Store(seq)
	if err != nil {
		r.stats.bad.Add(1)
		r.log.Warn().Err(err).Uint64("seq", seq).Msg("undecodable KV event batch; clearing the engine's blocks")
		r.reset()
		r.flush(ctx)
		return
	}
	r.stats.batches.Add(1)
	for _, e := range b.Events {
		switch e.Type {
		case messages.VLLMAllBlocksCleared:
			r.reset()
		case messages.VLLMBlockRemoved:
			r.removed(ctx, e.Hashes)
		case messages.VLLMBlockStored:
			r.stored(ctx, e)
		}
	}
	r.flush(ctx)
}

// reset forgets every translation and makes the next message say Cleared.
func (r *KVRelay) reset() {
	clear(r.trans)
	clear(r.refs)
	clear(r.curStore)
	r.cur.Removed, r.cur.Stored, r.cur.BlockSize = r.cur.Removed[:0], r.cur.Stored[:0], 0
	r.cur.Cleared = true
	r.stats.blocks.Store(0)
}

func (r *KVRelay) room(ctx context.Context) {
	if len(r.cur.Stored)+len(r.cur.Removed) >= messages.MaxKVKeys {
		r.flush(ctx)
	}
}

func (r *KVRelay) removed(ctx context.Context, hashes []uint64) {
	for _, h := range hashes {
		key, ok := r.trans[h]
		if !ok {
			continue
		}
		delete(r.trans, h)
		if r.refs[key]--; r.refs[key] > 0 {
			continue
		}
		delete(r.refs, key)
		if r.curStore[key] {
			// Stored earlier in this message: a consumer applies removals
			// first, so the removal goes in the next message.
			r.flush(ctx)
		}
		r.room(ctx)
		r.cur.Removed = append(r.cur.Removed, key)
	}
	r.stats.blocks.Store(uint64(len(r.trans)))
}

func (r *KVRelay) stored(ctx context.Context, e messages.VLLMEvent) {
	if len(e.Tokens) != e.BlockSize*len(e.Hashes) {
		r.stats.unresolved.Add(uint64(len(e.Hashes)))
		return
	}
	parent := kvindex.RootKey
	if e.HasParent {
		p, ok := r.trans[e.Parent]
		if !ok {
			r.stats.unresolved.Add(uint64(len(e.Hashes)))
			return
		}
		parent = p
	}
	if r.cur.BlockSize != 0 && r.cur.BlockSize != e.BlockSize {
		r.flush(ctx)
	}
	r.cur.BlockSize = e.BlockSize
	for i, h := range e.Hashes {
		key := kvindex.ChainKey(parent, uint64(e.LoraID), e.Tokens[i*e.BlockSize:(i+1)*e.BlockSize])
		parent = key
		if old, ok := r.trans[h]; ok {
			if old == key {
				continue
			}
			r.removed(ctx, []uint64{h})
		}
		if len(r.trans) >= r.opts.MaxBlocks {
			r.stats.dropped.Add(uint64(len(e.Hashes) - i))
			break
		}
		r.trans[h] = key
		if r.refs[key]++; r.refs[key] == 1 {
			r.room(ctx)
			r.cur.Stored = append(r.cur.Stored, key)
			r.curStore[key] = true
		}
	}
	r.stats.blocks.Store(uint64(len(r.trans)))
}

// flush publishes the message being built, if it says anything.
func (r *KVRelay) flush(ctx context.Context) {
	m := &r.cur
	if !m.Cleared && len(m.Stored) == 0 && len(m.Removed) == 0 {
		return
	}
	r.seq++
	m.Model, m.Engine, m.Epoch, m.Seq, m.Time = r.opts.Model, r.opts.Engine, r.epoch, r.seq, time.Now().UnixMilli()
	data, err := messages.Encode(m)
	if err == nil {
		msg := nats.NewMsg(r.subject)
		msg.Data = data
		msg.Header.Set(nats.MsgIdHdr, r.opts.Engine+"-"+strconv.FormatInt(r.epoch, 10)+"-"+strconv.FormatUint(r.seq, 10))
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = r.js.PublishMsg(pctx, msg)
		cancel()
	}
	if err != nil {
		// The sequence has moved on: consumers see the gap and clear the engine.
		r.stats.pubFailures.Add(1)
		r.log.Warn().Err(err).Uint64("seq", r.seq).Msg("publish KV events")
	} else {
		r.stats.published.Add(1)
	}
	m.Cleared, m.BlockSize = false, 0
	m.Stored, m.Removed = m.Stored[:0], m.Removed[:0]
	clear(r.curStore)
}

// heal asks the replay endpoint for the batches from up to before seq and
// applies them in order; it reports whether all of them were applied.
func (r *KVRelay) heal(ctx context.Context, from, seq uint64) bool {
	if r.opts.Replay == "" {
		return false
	}
	rctx, cancel := context.WithTimeout(ctx, r.opts.ReplayTimeout)
	defer cancel()
	zc, raw, err := zmtp.Dial(rctx, r.opts.Replay, zmq4.Dealer)
	if err != nil {
		r.log.Warn().Err(err).Msg("KV event replay: dial")
		return false
	}
	defer raw.Close()
	stop := context.AfterFunc(rctx, func() { _ = raw.Close() })
	defer stop()
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], from)
	// A DEALER speaks to vLLM's ROUTER as a REQ would: an empty delimiter
	// frame, then the request; replies come back the same way.
	if err := zc.SendMsg(zmq4.NewMsgFrom(nil, start[:])); err != nil {
		return false
	}
	for {
		msg, err := zc.RecvMsg()
		if err != nil {
			var ne net.Error
			if !errors.As(err, &ne) {
				r.log.Warn().Err(err).Msg("KV event replay")
			}
			return false
		}
		f := msg.Frames
		if len(f) > 0 && len(f[0]) == 0 {
			f = f[1:] // the delimiter
		}
		if len(f) != 2 || len(f[0]) != 8 || len(f[1]) == 0 {
			return from == seq // the end marker, or something else: done
		}
		s := binary.BigEndian.Uint64(f[0])
		switch {
		case s < from:
			continue // already applied
		case s >= seq:
			continue // the live stream brings these
		case s != from:
			return false // the replay buffer no longer holds the gap's start
		}
		r.apply(ctx, s, f[1])
		if from = s + 1; from == seq {
			return true
		}
	}
}

// kvCollector exports the relays' counters as switchyard_agent_kv_* metrics.
type kvCollector struct {
	relays []*KVRelay
	descs  map[string]*prometheus.Desc
}

func newKVCollector(relays []*KVRelay) *kvCollector {
	c := &kvCollector{relays: relays, descs: map[string]*prometheus.Desc{}}
	for _, d := range []struct{ name, help, label string }{
		{"switchyard_agent_kv_batches_total", "vLLM KV event batches by result (applied, bad: undecodable or malformed frames).", "result"},
		{"switchyard_agent_kv_gaps_total", "Sequence gaps in an engine's KV events by outcome (healed by replay, cleared).", "outcome"},
		{"switchyard_agent_kv_restarts_total", "Engine restarts seen as the KV event sequence going back.", ""},
		{"switchyard_agent_kv_reconnects_total", "KV event connections lost after batches came; each starts the engine's blocks over.", ""},
		{"switchyard_agent_kv_messages_total", "KVEvents messages to SY_KV by result (published, failed).", "result"},
		{"switchyard_agent_kv_blocks_skipped_total", "Stored blocks not relayed by reason (unresolved: unknown parent or tokens; over_cap: past MaxBlocks).", "reason"},
		{"switchyard_agent_kv_blocks", "Engine blocks the relay translates now.", ""},
	} {
		labels := []string{"model", "engine"}
		if d.label != "" {
			labels = append(labels, d.label)
		}
		c.descs[d.name] = prometheus.NewDesc(d.name, d.help, labels, nil)
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *kvCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *kvCollector) Collect(ch chan<- prometheus.Metric) {
	for _, r := range c.relays {
		s := r.Stats()
		m, e := r.opts.Model, r.opts.Engine
		counter := func(name string, v uint64, label ...string) {
			ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.CounterValue, float64(v), append([]string{m, e}, label...)...)
		}
		counter("switchyard_agent_kv_batches_total", s.Batches, "applied")
		counter("switchyard_agent_kv_batches_total", s.Bad, "bad")
		counter("switchyard_agent_kv_gaps_total", s.Healed, "healed")
		counter("switchyard_agent_kv_gaps_total", s.Gaps-min(s.Healed, s.Gaps), "cleared")
		counter("switchyard_agent_kv_restarts_total", s.Restarts)
		counter("switchyard_agent_kv_reconnects_total", s.Reconnects)
		counter("switchyard_agent_kv_messages_total", s.Published, "published")
		counter("switchyard_agent_kv_messages_total", s.PublishFailures, "failed")
		counter("switchyard_agent_kv_blocks_skipped_total", s.Unresolved, "unresolved")
		counter("switchyard_agent_kv_blocks_skipped_total", s.Dropped, "over_cap")
		ch <- prometheus.MustNewConstMetric(c.descs["switchyard_agent_kv_blocks"], prometheus.GaugeValue, float64(s.Blocks), m, e)
	}
}
