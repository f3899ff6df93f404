package messages

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Limits of a vLLM KV event batch, checked before and while decoding.
const (
	// MaxVLLMBatchSize bounds one batch's encoding. A batch holds the events
	// of one scheduler step; a 128k-token prefill stores 8,192 blocks whose
	// token ids take under 700 KB, so 8 MiB is far above any honest batch.
	MaxVLLMBatchSize = 8 << 20
	// MaxVLLMContainerLen bounds the entries of one array or map of a
	// batch: a BlockStored event lists every token id of the blocks it
	// stores, a million for a million-token prompt.
	MaxVLLMContainerLen = 1 << 20
)

// VLLMEventType tells the events of a vLLM KV event batch apart.
type VLLMEventType uint8

// The event types of vllm.distributed.kv_events.
const (
	VLLMBlockStored VLLMEventType = iota + 1
	VLLMBlockRemoved
	VLLMAllBlocksCleared
)

// The tags msgspec writes for the event types (its default tag is the
// class name).
var vllmTags = [...]string{VLLMBlockStored: "BlockStored", VLLMBlockRemoved: "BlockRemoved", VLLMAllBlocksCleared: "AllBlocksCleared"}

// String returns the event type's vLLM class name.
func (t VLLMEventType) String() string {
	if int(t) < len(vllmTags) && t > 0 {
		return vllmTags[t]
	}
	return fmt.Sprintf("VLLMEventType(%d)", uint8(t))
}

// VLLMEvent is one event of a vLLM KV event batch. Block hashes are carried
// as vLLM's "int" form: a hash given as bytes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES
// off) becomes its low 64 bits read big-endian, which is what vLLM itself
// publishes in the int form (maybe_convert_block_hash), and an older vLLM's
// negative Python hash() its two's-complement bits.
type VLLMEvent struct {
	// Type is the event's class.
	Type VLLMEventType
	// Hashes are the blocks stored or removed, in chain order for BlockStored.
	Hashes []uint64
	// Parent is the hash of the block before Hashes[0].
	Parent uint64
	// HasParent is false for a sequence's first block (vLLM sends nil).
	HasParent bool
	// Tokens are the token ids of every block of Hashes, BlockSize each (BlockStored).
	Tokens []uint32
	// BlockSize is the tokens per block (BlockStored).
	BlockSize int
	// LoraID is the adapter the blocks were computed under; 0 means none
	// (vLLM sends nil).
	LoraID int64
	// Medium is the storage tier ("GPU", "CPU", ...); empty when vLLM sent none.
	Medium string
}

// VLLMBatch is one vLLM KV event batch (KVEventBatch), the payload of the
// third frame of each ZMQ message: [topic, sequence, payload].
type VLLMBatch struct {
	// TS is the batch's time in Unix seconds.
	TS float64
	// Events are the batch's events, in order.
	Events []VLLMEvent
	// DPRank is the data-parallel rank; -1 when the batch names none.
	DPRank int
	// Unknown counts events of a type this package does not know (skipped).
	Unknown int
}

// DecodeVLLMBatch decodes a vLLM KV event batch in either of msgspec's
// encodings: positional arrays (vLLM's array_like=True, what it sends) or
// maps keyed by field name (with the event type under "type"). The bytes
// are pre-scanned as every Switchyard message is, so no length a header
// claims can make the decoder allocate more than the input justifies.
func DecodeVLLMBatch(data []byte) (b VLLMBatch, err error) {
	if len(data) > MaxVLLMBatchSize {
		return b, fmt.Errorf("%w: vLLM KV event batch of %d bytes (limit %d)", ErrTooLarge, len(data), MaxVLLMBatchSize)
	}
	if err := scanMsgpackLimit(data, MaxVLLMContainerLen); err != nil {
		return b, err
	}
	d := vllmDecoder{dec: msgpack.NewDecoder(bytes.NewReader(data))}
	b, err = d.batch()
	if err != nil {
		return VLLMBatch{}, fmt.Errorf("%w: vLLM KV event batch: %v", ErrDecode, err)
	}
	return b, nil
}

type vllmDecoder struct {
	dec *msgpack.Decoder
}

// container reads an array or map header: n entries and whether it is a map.
func (d vllmDecoder) container() (n int, isMap bool, err error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, false, err
	}
	if msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32 {
		n, err = d.dec.DecodeMapLen()
		return n, true, err
	}
	n, err = d.dec.DecodeArrayLen()
	if err == nil && n < 0 {
		return 0, false, fmt.Errorf("nil where an array or map was expected")
	}
	return n, false, err
}

func (d vllmDecoder) batch() (VLLMBatch, error) {
	b := VLLMBatch{DPRank: -1}
	n, isMap, err := d.container()
	if err != nil {
		return b, err
	}
	for i := range n {
		field := i
		if isMap {
			name, err := d.dec.DecodeString()
			if err != nil {
				return b, err
			}
			switch name {
			case "ts":
				field = 0
			case "events":
				field = 1
			case "data_parallel_rank", "attn_dp_rank":
				field = 2
			default:
				field = -1
			}
		}
		switch field {
		case 0:
			if b.TS, err = d.dec.DecodeFloat64(); err != nil {
				return b, fmt.Errorf("ts: %v", err)
			}
			if math.IsNaN(b.TS) || math.IsInf(b.TS, 0) {
				return b, fmt.Errorf("ts is %v", b.TS)
			}
		case 1:
			if err := d.events(&b); err != nil {
				return b, err
			}
		case 2:
			r, null, err := d.optInt()
			if err != nil {
				return b, fmt.Errorf("data_parallel_rank: %v", err)
			}
			if !null {
				if r < 0 || r > 1<<16 {
					return b, fmt.Errorf("data_parallel_rank is %d", r)
				}
				b.DPRank = int(r)
			}
		default:
			if err := d.dec.Skip(); err != nil {
				return b, err
			}
		}
	}
	return b, nil
}

func (d vllmDecoder) events(b *VLLMBatch) error {
	n, err := d.dec.DecodeArrayLen()
	if err != nil || n < 0 {
		return fmt.Errorf("events: not a list (%v)", err)
	}
	b.Events = make([]VLLMEvent, 0, n)
	for i := range n {
		e, err := d.event()
		if err != nil {
			return fmt.Errorf("event %d: %v", i, err)
		}
		if e.Type == 0 {
			b.Unknown++
			continue
		}
		b.Events = append(b.Events, e)
	}
	return nil
}

// vllmFields are the fields of each event type in msgspec's positional order.
var vllmFields = map[VLLMEventType][]string{
	VLLMBlockStored:      {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"},
	VLLMBlockRemoved:     {"block_hashes", "medium"},
	VLLMAllBlocksCleared: {},
}

func (d vllmDecoder) event() (VLLMEvent, error) {
	var e VLLMEvent
	n, isMap, err := d.container()
	if err != nil {
		return e, err
	}
	if n == 0 {
		return e, fmt.Errorf("an empty event has no type")
	}
	if !isMap {
		// [tag, fields...]
		tag, err := d.dec.DecodeString()
		if err != nil {
			return e, fmt.Errorf("tag: %v", err)
		}
		e.Type = vllmType(tag)
		for i := 1; i < n; i++ {
			name := ""
			if f := vllmFields[e.Type]; i-1 < len(f) {
				name = f[i-1]
			}
			if err := d.field(&e, name); err != nil {
				return e, err
			}
		}
		return e, d.complete(&e)
	}
	// A map: the tag is the "type" entry, which need not come first.
	for range n {
		name, err := d.dec.DecodeString()
		if err != nil {
			return e, err
		}
		if name == "type" {
			tag, err := d.dec.DecodeString()
			if err != nil {
				return e, fmt.Errorf("type: %v", err)
			}
			e.Type = vllmType(tag)
			continue
		}
		if err := d.field(&e, name); err != nil {
			return e, err
		}
	}
	return e, d.complete(&e)
}

func vllmType(tag string) VLLMEventType {
	for t, s := range vllmTags {
		if s == tag && t > 0 {
			return VLLMEventType(t)
		}
	}
	return 0
}

// complete checks what an event of its type needs.
func (d vllmDecoder) complete(e *VLLMEvent) error {
	if e.Type != VLLMBlockStored {
		return nil
	}
	if e.BlockSize < 1 || e.BlockSize > 1<<16 {
		return fmt.Errorf("BlockStored: block_size is %d, want 1..65536", e.BlockSize)
	}
	return nil
}

func (d vllmDecoder) field(e *VLLMEvent, name string) error {
	var err error
	switch name {
	case "block_hashes":
		var n int
		if n, err = d.list(); err != nil {
			break
		}
		e.Hashes = make([]uint64, 0, n)
		for range n {
			h, null, herr := d.hash()
			if herr != nil || null {
				return fmt.Errorf("block_hashes: %v", orNil(herr))
			}
			e.Hashes = append(e.Hashes, h)
		}
	case "parent_block_hash":
		var null bool
		e.Parent, null, err = d.hash()
		e.HasParent = !null
	case "token_ids":
		var n int
		if n, err = d.list(); err != nil {
			break
		}
		e.Tokens = make([]uint32, 0, n)
		for range n {
			t, terr := d.dec.DecodeInt64()
			if terr != nil || t < 0 || t > math.MaxUint32 {
				return fmt.Errorf("token_ids: token %d: %v", t, orNil(terr))
			}
			e.Tokens = append(e.Tokens, uint32(t))
		}
	case "block_size":
		var v int64
		v, err = d.dec.DecodeInt64()
		e.BlockSize = int(max(min(v, 1<<20), -1))
	case "lora_id":
		e.LoraID, _, err = d.optInt()
	case "medium":
		c, perr := d.dec.PeekCode()
		if perr != nil {
			return perr
		}
		if c == msgpcode.Nil {
			return d.dec.DecodeNil()
		}
		e.Medium, err = d.dec.DecodeString()
	default:
		err = d.dec.Skip()
	}
	if err != nil {
		return fmt.Errorf("%s: %v", name, err)
	}
	return nil
}

// list reads an array header; nil is not a list.
func (d vllmDecoder) list() (int, error) {
	n, err := d.dec.DecodeArrayLen()
	if err == nil && n < 0 {
		err = fmt.Errorf("nil where a list was expected")
	}
	return n, err
}

func orNil(err error) error {
	if err == nil {
		return fmt.Errorf("nil hash")
	}
	return err
}

// optInt reads an integer or nil.
func (d vllmDecoder) optInt() (v int64, null bool, err error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, false, err
	}
	if c == msgpcode.Nil {
		return 0, true, d.dec.DecodeNil()
	}
	v, err = d.dec.DecodeInt64()
	return v, false, err
}

// hash reads a block hash: nil, an integer (signed or unsigned, kept as its
// 64 bits), or bytes (their low 64 bits, big-endian).
func (d vllmDecoder) hash() (h uint64, null bool, err error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c == msgpcode.Nil:
		return 0, true, d.dec.DecodeNil()
	case c == msgpcode.Uint64:
		h, err = d.dec.DecodeUint64()
		return h, false, err
	case msgpcode.IsBin(c) || msgpcode.IsString(c):
		raw, err := d.dec.DecodeBytes()
		if err != nil {
			return 0, false, err
		}
		if len(raw) == 0 {
			return 0, false, fmt.Errorf("empty hash")
		}
		var tail [8]byte
		copy(tail[8-min(len(raw), 8):], raw[max(len(raw)-8, 0):])
		return binary.BigEndian.Uint64(tail[:]), false, nil
	}
	v, err := d.dec.DecodeInt64()
	return uint64(v), false, err
}

// EncodeVLLMBatch encodes b as vLLM does (positional arrays), or, with
// asMap, as msgspec encodes the same types without array_like (maps keyed
// by field name, the event type under "type"). The engine simulator and the
// tests use it to speak vLLM's format.
func EncodeVLLMBatch(b VLLMBatch, asMap bool) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	w := vllmEncoder{enc: enc, asMap: asMap}
	fields := 2
	if b.DPRank >= 0 {
		fields = 3
	}
	w.open(fields)
	w.key("ts")
	w.check(enc.EncodeFloat64(b.TS))
	w.key("events")
	w.check(enc.EncodeArrayLen(len(b.Events)))
	for _, e := range b.Events {
		w.event(e)
	}
	if b.DPRank >= 0 {
		w.key("data_parallel_rank")
		w.check(enc.EncodeInt(int64(b.DPRank)))
	}
	return buf.Bytes(), w.err
}

type vllmEncoder struct {
	enc   *msgpack.Encoder
	asMap bool
	err   error
}

func (w *vllmEncoder) check(err error) {
	if w.err == nil {
		w.err = err
	}
}

func (w *vllmEncoder) open(n int) {
	if w.asMap {
		w.check(w.enc.EncodeMapLen(n))
	} else {
		w.check(w.enc.EncodeArrayLen(n))
	}
}

func (w *vllmEncoder) key(name string) {
	if w.asMap {
		w.check(w.enc.EncodeString(name))
	}
}

func (w *vllmEncoder) event(e VLLMEvent) {
	fields := vllmFields[e.Type]
	if fields == nil {
		w.check(fmt.Errorf("messages: vLLM event type %d is unknown", e.Type))
		return
	}
	w.open(1 + len(fields))
	if w.asMap {
		w.key("type")
	}
	w.check(w.enc.EncodeString(e.Type.String()))
	for _, f := range fields {
		w.key(f)
		switch f {
		case "block_hashes":
			w.check(w.enc.EncodeArrayLen(len(e.Hashes)))
			for _, h := range e.Hashes {
				w.check(w.enc.EncodeUint64(h))
			}
		case "parent_block_hash":
			if e.HasParent {
				w.check(w.enc.EncodeUint64(e.Parent))
			} else {
				w.check(w.enc.EncodeNil())
			}
		case "token_ids":
			w.check(w.enc.EncodeArrayLen(len(e.Tokens)))
			for _, t := range e.Tokens {
				w.check(w.enc.EncodeUint32(t))
			}
		case "block_size":
			w.check(w.enc.EncodeInt(int64(e.BlockSize)))
		case "lora_id":
			if e.LoraID != 0 {
				w.check(w.enc.EncodeInt(e.LoraID))
			} else {
				w.check(w.enc.EncodeNil())
			}
		case "medium":
			if e.Medium != "" {
				w.check(w.enc.EncodeString(e.Medium))
			} else {
				w.check(w.enc.EncodeNil())
			}
		}
	}
}
