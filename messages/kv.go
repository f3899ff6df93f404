package messages

import "time"

// KindKVEvents is the kind of KVEvents.
const KindKVEvents Kind = "kv_events"

// MaxKVKeys is the most block keys (stored and removed together) one
// KVEvents message carries: 4,096 keys of at most 9 bytes stay well inside
// MaxMessageSize. A publisher splits larger batches.
const MaxKVKeys = 4096

// KVEvents is a compact batch of one engine's KV-cache events, published by
// the engine's agent on <prefix>.kv.<model>.<engine> (stream SY_KV). Keys are
// Switchyard content keys (kvindex.ChainKey over token ids), not the engine's
// own block hashes. A consumer applies Cleared first, then Removed, then
// Stored; a publisher splits a batch where that order would differ from the
// engine's.
type KVEvents struct {
	Version int    `msgpack:"v" json:"v"`
	Kind    Kind   `msgpack:"k" json:"k"`
	Model   string `msgpack:"m" json:"model"`
	Engine  string `msgpack:"e" json:"engine"`
	// Time is when the publisher sent the batch, in Unix milliseconds.
	Time int64 `msgpack:"t" json:"time_ms"`
	// Epoch identifies the publisher's run (its start, in Unix ms): Seq
	// restarts at 1 with every new epoch.
	Epoch int64 `msgpack:"ep" json:"epoch"`
	// Seq rises by one per message of an epoch; a consumer that sees it skip
	// lost events and must treat the engine's blocks as unknown.
	Seq uint64 `msgpack:"n" json:"seq"`
	// Cleared says the engine's blocks were all dropped (its cache was reset,
	// it restarted, or its publisher lost events and starts over).
	Cleared bool `msgpack:"clr,omitempty" json:"cleared,omitempty"`
	// BlockSize is the engine's tokens per block (0 when the batch stores nothing).
	BlockSize int `msgpack:"bs,omitempty" json:"block_size,omitempty"`
	// Removed are the block keys the engine dropped.
	Removed []uint64 `msgpack:"rm,omitempty" json:"removed,omitempty"`
	// Stored are the block keys the engine stored, in chain order.
	Stored []uint64 `msgpack:"st,omitempty" json:"stored,omitempty"`
}

// MessageKind returns KindKVEvents.
func (*KVEvents) MessageKind() Kind { return KindKVEvents }

func (m *KVEvents) stamp()              { m.Version, m.Kind = SchemaVersion, KindKVEvents }
func (m *KVEvents) header() (int, Kind) { return m.Version, m.Kind }

// Validate checks every field. Unlike a signal's, its time may be old: a
// consumer that starts late rebuilds its index from the stream's window.
func (m *KVEvents) Validate(now time.Time) error {
	c := checker{kind: KindKVEvents}
	c.model(m.Model, false)
	c.name("engine", m.Engine, false)
	c.time("time_ms", m.Time, now)
	c.time("epoch", m.Epoch, now)
	if m.Seq == 0 {
		c.fail("seq", "is 0, want >= 1")
	}
	if m.BlockSize < 0 || m.BlockSize > 1<<16 {
		c.fail("block_size", "is %d, want 0..65536", m.BlockSize)
	}
	if n := len(m.Removed) + len(m.Stored); n > MaxKVKeys {
		c.fail("stored", "%d stored and removed keys, want at most %d", n, MaxKVKeys)
	}
	return c.err
}
