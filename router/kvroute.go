package router

import (
	"sync"

	"github.com/switchyard-dev/switchyard/kvindex"
	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/selection"
)

// KVIndexes gives each model's engine-exact prefix index: which engine
// holds which blocks by the engines' own KV events (kvfeed.Feed, kept
// current from SY_KV, implements it). Index returns nil for a model no
// engine reported on yet, and then the same index for the model for good
// (the router keeps the first it gets, so that its request path takes no
// lock of the feed's); it must be safe for concurrent use.
type KVIndexes interface {
	Index(model string) *kvindex.Index
}

// tokenPool holds the token buffers of Options.Tokenizer's calls: a
// prompt's first protocol.MaxPrefixTokens ids, 16 KiB, too much for the
// request path's stack.
type tokenPool struct{ p sync.Pool }

func (tp *tokenPool) get() *[]uint32 {
	if v, ok := tp.p.Get().(*[]uint32); ok {
		return v
	}
	b := make([]uint32, 0, protocol.MaxPrefixTokens)
	return &b
}

func (tp *tokenPool) put(b *[]uint32) {
	if cap(*b) > 4*protocol.MaxPrefixTokens { // a tokenizer that grew it far: let it go
		return
	}
	*b = (*b)[:0]
	tp.p.Put(b)
}

// prefixKeys appends to dst the block keys the router places req by and
// whether they are token keys (the engine-exact index's): a token-id
// prompt's, else those of the tokens Options.Tokenizer gives, else
// protocol.PrefixKeys' text keys.
func (h *Handler) prefixKeys(dst []uint64, model string, req *protocol.Request) ([]uint64, bool) {
	if keys, tokens := protocol.PrefixKeys(dst, req); tokens || h.opts.Tokenizer == nil {
		return keys, tokens
	}
	bp := h.tokens.get()
	defer h.tokens.put(bp)
	toks, ok := h.opts.Tokenizer.Tokens((*bp)[:0], model, req)
	*bp = toks
	if !ok {
		return protocol.PrefixKeys(dst, req)
	}
	return protocol.TokenKeys(dst, toks), true
}

// pickPrefix picks the engine for a request with prefix keys: by the
// engines' KV events first when keys are token keys and Options.KV knows
// the model, by what this router routed otherwise (prefix.Index.PickExact).
func (h *Handler) pickPrefix(model string, ms *modelState, t *selection.Table, g selection.LoadGuard, key uint64, keys []uint64, tokens bool) (int, bool) {
	var exact *kvindex.Index
	if tokens && h.opts.KV != nil {
		if exact = ms.kv.Load(); exact == nil {
			if exact = h.opts.KV.Index(model); exact != nil {
				ms.kv.Store(exact)
			}
		}
	}
	if exact == nil {
		return ms.prefix.Pick(t, g, key, keys)
	}
	idx, ok, fromExact := ms.prefix.PickExact(exact, t, g, key, keys)
	if fromExact {
		h.metrics.prefixFromKV.Inc()
	} else {
		h.metrics.prefixFromRouted.Inc()
	}
	return idx, ok
}
