// Package prefix is a router's prefix index and the pick it feeds: which
// engine is believed to hold which chained blocks of prompt content
// (kvindex, learned from what the router routed), and the engine choice
// that weighs the
// longest cached prefix against the plan's weights and live load
// (selection.Table.PickPrefix). The router's request path and the
// simulator's switchyard policy both run it. Pure: no I/O, the caller's
// clock.
package prefix

import (
	"errors"
	"fmt"
	"time"

	"github.com/switchyard-dev/switchyard/kvindex"
	"github.com/switchyard-dev/switchyard/router/selection"
)

// Defaults of Options.
const (
	// DefaultBlocksPerEngine is how many blocks the index remembers per
	// engine when the engine's KV size is not known: 8,192 text blocks of
	// 512 bytes, 4 MiB of prompt (about a million tokens), more than an
	// 80 GB GPU holds for an 8B model's cache (some 500,000 tokens), so
	// that capacity is not what forgets a prefix the engine still holds;
	// the TTL is. At some 50 bytes a block that is 400 KiB per engine.
	DefaultBlocksPerEngine = 8192
	// DefaultTTL forgets a prefix not routed again for 5 minutes: a busy
	// engine evicts an idle conversation's blocks sooner, and a user who
	// comes back after that mostly finds them gone; a conversation that
	// goes on refreshes its blocks with every turn.
	DefaultTTL = 5 * time.Minute
	// MatchLimit is how many engines a pick compares by prefix: the
	// deepest holders of the request's blocks.
	MatchLimit = 4
)

// ErrOptions wraps every Options validation error.
var ErrOptions = errors.New("prefix: invalid options")

// Options configures an Index.
type Options struct {
	// BlocksPerEngine caps the blocks remembered per engine unless
	// SetCapacity gives the engine's own; zero means
	// DefaultBlocksPerEngine.
	BlocksPerEngine int
	// TTL forgets blocks not routed again for that long; zero means
	// DefaultTTL, negative keeps them until capacity evicts them.
	TTL time.Duration
}

// WithDefaults returns o with its zero fields set to the defaults.
func (o Options) WithDefaults() Options {
	if o.BlocksPerEngine == 0 {
		o.BlocksPerEngine = DefaultBlocksPerEngine
	}
	if o.TTL == 0 {
		o.TTL = DefaultTTL
	}
	return o
}

// Validate names the first field of o (after defaults) that is not usable.
func (o Options) Validate() error {
	o = o.WithDefaults()
	if o.BlocksPerEngine < 1 || o.BlocksPerEngine > 1<<30 {
		return fmt.Errorf("%w: BlocksPerEngine is %d, want 1..%d", ErrOptions, o.BlocksPerEngine, 1<<30)
	}
	return nil
}

// Index is one model's prefix index at one router. It is safe for
// concurrent use.
type Index struct {
	learned *kvindex.Index
}

// New validates opts and returns an empty Index.
func New(opts Options) (*Index, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.WithDefaults()
	x, err := kvindex.New(kvindex.Options{MaxBlocksPerEngine: opts.BlocksPerEngine, TTL: max(opts.TTL, 0)})
	if err != nil {
		return nil, fmt.Errorf("prefix: %w", err)
	}
	return &Index{learned: x}, nil
}

// SetCapacity sets how many blocks engine may hold (its KV size in the
// index's blocks).
func (x *Index) SetCapacity(engine string, blocks int) error {
	return x.learned.SetCapacity(engine, blocks)
}

// Pick picks the engine of t for a request with block keys (its
// protocol.PrefixKeys) and affinity key, under g: Table.PickPrefix over
// the deepest holders of its keys. It does not allocate.
//
// The prefix is shared (PickPrefix's shared depth) as deep as a second
// engine holds it: a prefix cached on two engines was sent by more than
// one request stream (or its conversation moved once), so it may be a
// hot one, and only the part beyond that, which one engine alone holds,
// is treated as the request's own history.
//
// The request is placed among weighted candidates by a key of its own
// (key mixed with its deepest block's), not by key alone: key names the
// request's leading content (protocol.AffinityKey's first 2 KiB), the
// same for every request behind one system prompt, and the same key draws
// the same few candidates, so every new conversation would be placed on
// the same handful of engines. Where a conversation goes on is the
// index's to say, not the key's.
func (x *Index) Pick(t *selection.Table, g selection.LoadGuard, key uint64, keys []uint64) (int, bool) {
	if len(keys) == 0 {
		return t.PickRecent(key, g, nil)
	}
	var mbuf [2 * MatchLimit]kvindex.Match
	return pickHeld(t, g, key, keys, x.learned.Deepest(mbuf[:0], keys, MatchLimit))
}

// PickExact picks as Pick does, with the holders of keys (token keys, as
// protocol.PrefixKeys gives for token ids) taken from exact, an
// engine-exact index fed by the engines' KV events, when it names an
// engine of t holding any of them; else from what this router routed (a
// prefix stored since the engines last reported, or engines that report
// none). It reports whether exact gave the holders. A nil exact is Pick.
// It does not allocate.
func (x *Index) PickExact(exact *kvindex.Index, t *selection.Table, g selection.LoadGuard, key uint64, keys []uint64) (idx int, ok, fromExact bool) {
	if exact == nil || len(keys) == 0 {
		idx, ok = x.Pick(t, g, key, keys)
		return idx, ok, false
	}
	var mbuf [2 * MatchLimit]kvindex.Match
	matches := exact.Deepest(mbuf[:0], keys, MatchLimit)
	for _, m := range matches {
		if _, in := t.Index(m.Engine); in {
			idx, ok = pickHeld(t, g, key, keys, matches)
			return idx, ok, true
		}
	}
	idx, ok = x.Pick(t, g, key, keys)
	return idx, ok, false
}

// pickHeld is Table.PickPrefix over matches, the deepest holders of a
// request's keys (at most MatchLimit; keys is not empty), placed by key
// mixed with the deepest key (see Pick).
func pickHeld(t *selection.Table, g selection.LoadGuard, key uint64, keys []uint64, matches []kvindex.Match) (int, bool) {
	shared := 0
	if len(matches) >= 2 {
		// Deepest returns the engines deepest first.
		shared = matches[1].Blocks
	}
	var hbuf [2 * MatchLimit]selection.Held
	held := hbuf[:0]
	for _, m := range matches {
		if i, ok := t.Index(m.Engine); ok {
			held = append(held, selection.Held{Index: i, Blocks: m.Blocks})
		}
	}
	return t.PickPrefix(selection.Mix64(key^keys[len(keys)-1]), g, held, shared, len(keys))
}

// Routed records that the request with block keys was sent to engine at
// now: the engine will hold its prefix.
func (x *Index) Routed(engine string, keys []uint64, now time.Time) {
	if len(keys) > 0 {
		// The only error is an index already holding its maximum of
		// engines (65,536), where this engine is not remembered: a missed
		// placement, never a wrong one.
		_ = x.learned.StoreAt(engine, keys, now)
	}
}
