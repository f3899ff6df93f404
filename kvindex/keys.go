// Package kvindex is the engine-exact prefix index: per model, which engine
// holds which KV-cache block, fed by engines' KV events (vLLM's BlockStored,
// BlockRemoved and AllBlocksCleared, carried by the agent), and asked, for a
// new request's chained block keys, how long a prefix each engine holds.
//
// It is a pure data structure: no I/O, no NATS. Keys are Switchyard content
// keys (ChainKey), computed from token ids, not the engine's own block hashes,
// so that a router can compute them for a request without knowing the
// engine's hash function, its seed (vLLM's NONE_HASH, PYTHONHASHSEED) or its
// version; the agent translates the engine's hashes into them (see
// docs/kv-events.md for the choice and its limits).
package kvindex

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// RootKey is the parent key of a sequence's first block. Its value is
// arbitrary but fixed: every agent and router must derive the same keys.
const RootKey uint64 = 0x5377_7974_6368_7964 // "Swytchyd"

// ChainKey is the content key of one block: a hash of its parent's key, the
// adapter it was computed under (extra: vLLM's lora_id, 0 for none) and its
// token ids. Two blocks have the same key exactly when their whole prefixes
// (up to hash collisions, 2^-64 per pair) and adapters agree.
func ChainKey(parent, extra uint64, tokens []uint32) uint64 {
	var buf [256]byte
	var d xxhash.Digest
	d.Reset()
	binary.LittleEndian.PutUint64(buf[0:], parent)
	binary.LittleEndian.PutUint64(buf[8:], extra)
	n := 16
	for _, t := range tokens {
		if n == len(buf) {
			_, _ = d.Write(buf[:n])
			n = 0
		}
		binary.LittleEndian.PutUint32(buf[n:], t)
		n += 4
	}
	_, _ = d.Write(buf[:n])
	return d.Sum64()
}

// BlockKeys appends to dst the chained content keys of the full blocks of
// tokens (blockSize tokens each; a trailing partial block has no key, as in
// vLLM, which caches only full blocks) and returns the extended slice.
func BlockKeys(dst []uint64, extra uint64, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	parent := RootKey
	for i := 0; i+blockSize <= len(tokens); i += blockSize {
		parent = ChainKey(parent, extra, tokens[i:i+blockSize])
		dst = append(dst, parent)
	}
	return dst
}
