package protocol

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"

	"github.com/switchyard-dev/switchyard/kvindex"
)

// TextBlockBytes is the size of a text block of PrefixKeys: 512 bytes of a
// request's JSON, some 128 tokens of English, so that a 3 KB system prompt
// is six blocks and a short chat turn one.
const TextBlockBytes = 512

// TokenBlockSize is the size of a token block of PrefixKeys when a request
// gives token ids: vLLM's default block size, so that the keys are the
// engine-exact index's (kvindex.BlockKeys) for an engine on that default.
const TokenBlockSize = 16

// MaxPrefixKeys bounds the keys PrefixKeys returns: the index reads no
// more (kvindex.MaxKeys). With text blocks that is 128 KiB of prompt.
const MaxPrefixKeys = kvindex.MaxKeys

// seedText separates text keys from token keys (kvindex.RootKey).
const seedText uint64 = 0x7465_7874_626c_6b73 // "textblks"

// PrefixKeys appends to dst the chained block keys of req's prompt
// content, at most MaxPrefixKeys, and returns the extended slice and
// whether they are token keys:
//
//   - chat and responses (an input array): each message's raw JSON, in
//     order (the responses instructions first), in blocks of
//     TextBlockBytes; a message's last block ends with it, so a
//     conversation's next turn, which repeats its messages and adds some,
//     repeats its keys and adds some;
//   - completions and a string input: the prompt's raw JSON in blocks of
//     TextBlockBytes, the last partial block included;
//   - a token-id prompt: blocks of TokenBlockSize token ids chained as
//     kvindex.BlockKeys chains them (full blocks only, as an engine
//     caches), which an engine's KV events can match exactly.
//
// Text keys hash the request's JSON bytes, not its tokens: two requests
// share a key only when their messages were encoded alike (one client's
// conversation is), and they never equal an engine's token keys. Each key
// hashes its parent's key, so a key stands for its whole prefix.
// Embeddings have no keys. It does not allocate beyond dst.
func PrefixKeys(dst []uint64, req *Request) ([]uint64, bool) {
	if req == nil || req.Endpoint == EndpointEmbeddings {
		return dst, false
	}
	if len(req.PromptTokens) > 0 && req.Endpoint == EndpointCompletions {
		return tokenKeys(dst, req.PromptTokens), true
	}
	c := chain{keys: dst, limit: len(dst) + MaxPrefixKeys, parent: seedText}
	c.begin()
	if len(req.Instructions) > 0 {
		c.write(req.Instructions)
		c.end()
	}
	raw := req.Context
	if len(raw) > 0 && raw[0] == '[' && req.Endpoint != EndpointCompletions {
		items := elements{b: raw}
		for !c.full() {
			item, ok := items.next()
			if !ok {
				break
			}
			c.write(item)
			c.end()
		}
	} else if len(raw) > 0 {
		if raw[0] == '[' { // completions: the first prompt of an array
			items := elements{b: raw}
			raw, _ = items.next()
		}
		c.write(raw)
		c.end()
	}
	return c.keys, false
}

// chain hashes bytes into chained blocks of TextBlockBytes.
type chain struct {
	d      xxhash.Digest
	parent uint64
	n      int // bytes in the current block
	keys   []uint64
	limit  int
}

func (c *chain) full() bool { return len(c.keys) >= c.limit }

func (c *chain) begin() {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], c.parent)
	c.d.Reset()
	_, _ = c.d.Write(b[:])
	c.n = 0
}

// write hashes p, closing a block at every TextBlockBytes.
func (c *chain) write(p []byte) {
	for len(p) > 0 && !c.full() {
		k := min(len(p), TextBlockBytes-c.n)
		_, _ = c.d.Write(p[:k])
		c.n += k
		p = p[k:]
		if c.n == TextBlockBytes {
			c.end()
		}
	}
}

// end closes the current block, if it holds anything.
func (c *chain) end() {
	if c.n == 0 || c.full() {
		return
	}
	c.parent = c.d.Sum64()
	c.keys = append(c.keys, c.parent)
	c.begin()
}

// tokenKeys appends the token-block keys of raw, a JSON array of integers
// (validated by the parser), as kvindex.BlockKeys would compute them.
func tokenKeys(dst []uint64, raw []byte) []uint64 {
	var block [TokenBlockSize]uint32
	n, parent := 0, kvindex.RootKey
	limit := len(dst) + MaxPrefixKeys
	var v uint32
	digits := false
	for _, b := range raw {
		if b >= '0' && b <= '9' {
			v = v*10 + uint32(b-'0')
			digits = true
			continue
		}
		if !digits {
			continue
		}
		block[n], v, digits = v, 0, false
		if n++; n == TokenBlockSize {
			parent = kvindex.ChainKey(parent, 0, block[:])
			dst = append(dst, parent)
			n = 0
			if len(dst) >= limit {
				break
			}
		}
	}
	return dst
}
