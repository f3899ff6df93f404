package protocol

import "github.com/switchyard-dev/switchyard/kvindex"

// MaxPrefixTokens is the most leading token ids of a prompt that its block
// keys read: MaxPrefixKeys blocks of TokenBlockSize. A Tokenizer may stop
// there.
const MaxPrefixTokens = MaxPrefixKeys * TokenBlockSize

// Tokenizer turns a request into the token ids its engine computes for the
// prompt (the model's tokenizer and, for chat and responses, its chat
// template), so that the router can match the request against the blocks
// the engines report in their KV events (kvindex keys over token ids).
// Implementations must be safe for concurrent use and should not block:
// the router calls Tokens on its request path.
type Tokenizer interface {
	// Tokens appends to dst the token ids of req's prompt as the engines
	// of model tokenize it, at least its first MaxPrefixTokens when it has
	// that many, and returns the extended slice and true; false when it
	// cannot (no tokenizer for model, an endpoint or content it does not
	// read), and the router then keys the request without tokens. model is
	// the model id the request is routed under (an alias resolved).
	Tokens(dst []uint32, model string, req *Request) ([]uint32, bool)
}

// TokenKeys appends to dst the block keys of tokens as PrefixKeys gives
// them for a token-id prompt (kvindex.BlockKeys over TokenBlockSize
// blocks, at most MaxPrefixKeys) and returns the extended slice: the keys
// of a prompt a Tokenizer tokenized.
func TokenKeys(dst []uint64, tokens []uint32) []uint64 {
	return kvindex.BlockKeys(dst, 0, tokens[:min(len(tokens), MaxPrefixTokens)], TokenBlockSize)
}
