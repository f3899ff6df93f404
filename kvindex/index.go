package kvindex

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Defaults applied to zero-valued Options fields.
const (
	// DefaultMaxBlocksPerEngine bounds what one engine can make the index
	// hold. vLLM on an 80 GB GPU holds some tens of thousands of 16-token
	// blocks (its num_gpu_blocks); a million leaves room for CPU offload
	// tiers while keeping a hostile or broken publisher to some 40 MB.
	DefaultMaxBlocksPerEngine = 1 << 20
	// DefaultMaxEngines bounds the engines of one index; engine ids are 16 bits.
	DefaultMaxEngines = 1 << 16
)

// MaxMatches is the most engines Longest reports for one request: the
// deepest first. A block held by more engines than that says little about
// where a request should go, and bounding the answer bounds the lookup.
const MaxMatches = 256

// MaxKeys is the most leading keys of a request Longest reads; later keys
// are ignored (a prefix that long is matched as if it ended there).
const MaxKeys = 256

// ErrOptions wraps every Options validation error.
var ErrOptions = errors.New("kvindex: invalid options")

// ErrTooManyEngines is returned when an index already holds MaxEngines engines.
var ErrTooManyEngines = errors.New("kvindex: too many engines")

// Options configures an Index.
type Options struct {
	// MaxBlocksPerEngine caps the blocks indexed per engine; past it the
	// engine's least recently stored blocks are forgotten first. Zero means
	// DefaultMaxBlocksPerEngine. SetCapacity overrides it per engine.
	MaxBlocksPerEngine int
	// MaxEngines caps the engines of the index. Zero means DefaultMaxEngines.
	MaxEngines int
	// TTL, when positive, forgets a block that was not stored again for
	// that long (StoreAt's clock). Zero keeps blocks until capacity or an
	// event evicts them, as an engine-exact index fed by events should.
	TTL time.Duration
}

// WithDefaults returns o with its zero fields set to the defaults.
func (o Options) WithDefaults() Options {
	if o.MaxBlocksPerEngine == 0 {
		o.MaxBlocksPerEngine = DefaultMaxBlocksPerEngine
	}
	if o.MaxEngines == 0 {
		o.MaxEngines = DefaultMaxEngines
	}
	return o
}

// Validate names the first field of o (after defaults) that is not usable.
func (o Options) Validate() error {
	o = o.WithDefaults()
	switch {
	case o.MaxBlocksPerEngine < 1 || o.MaxBlocksPerEngine > 1<<30:
		return fmt.Errorf("%w: MaxBlocksPerEngine is %d, want 1..%d", ErrOptions, o.MaxBlocksPerEngine, 1<<30)
	case o.MaxEngines < 1 || o.MaxEngines > DefaultMaxEngines:
		return fmt.Errorf("%w: MaxEngines is %d, want 1..%d", ErrOptions, o.MaxEngines, DefaultMaxEngines)
	case o.TTL < 0:
		return fmt.Errorf("%w: TTL is %s, want >= 0", ErrOptions, o.TTL)
	}
	return nil
}

// holding says that an engine holds a block; stamp is the engine's store
// counter when it stored it, so that its eviction ring can tell a live entry
// from one removed (or stored again) since.
type holding struct {
	engine uint16
	stamp  uint32
}

// A block's entry in Index.blocks is its first holding packed in one word
// (most blocks are held by one engine): the engine in the low 16 bits, the
// stamp in the next 32, moreBit when Index.more holds the block's other
// holdings, sorted by engine. One word a block keeps the index near 50
// bytes a block with its eviction ring.
const moreBit = 1 << 63

func pack(h holding) uint64 { return uint64(h.stamp)<<16 | uint64(h.engine) }

func unpack(v uint64) holding { return holding{engine: uint16(v), stamp: uint32(v >> 16)} }

// mark is a stretch of an engine's store history for TTL expiry: its
// stores from stored (to the next mark's) were made from at to last (Unix
// ms). A new mark starts when a store comes an eighth of the TTL after the
// current one began, so expiry is that precise and the marks are few.
type mark struct {
	stored   uint64
	at, last int64
}

// engineState is one engine's eviction ring: the keys of its stores from
// oldest to stored, at slot store % span. A key removed or stored again
// since stays in the ring as a stale slot, recognised by its stamp.
//
// capacity bounds the blocks held (live keys), not the stores: a router
// stores a conversation's whole prefix again with every turn, so most of
// a busy ring's slots are stale, and a ring of capacity stores would hold
// a fraction of capacity blocks — the index would forget prefixes the
// engine, whose cache counts blocks, still holds (on the simulator's
// Mooncake trace it knew none of the prompt for 147 of 3,993 requests
// whose engine held 30–90 blocks of it). So the ring grows while it is
// full of stores but not of blocks, up to ringSpans × capacity slots, and
// the oldest live store is evicted when the blocks exceed capacity.
type engineState struct {
	name     string
	ring     []uint64
	span     uint64 // the ring's slots (capacity..ringSpans×capacity); 0 before the first store
	capacity int
	stored   uint64 // stores so far; the next store's stamp is its low 32 bits
	oldest   uint64 // the oldest store still in the ring
	blocks   int    // blocks held now
	marks    []mark // TTL history, oldest first
	used     bool
}

// Match is one engine's longest cached prefix for a request: Blocks leading
// blocks of the request are in its cache.
type Match struct {
	// Engine is the engine's name.
	Engine string
	// Blocks is how many of the request's leading blocks it holds (>= 1).
	Blocks int
}

// Index is the prefix index of one model: which engine holds which block,
// by chained block keys. It serves both of a router's sources alike: blocks
// learned from what the router routed (StoreAt on the chosen engine, with a
// TTL, since the engine evicts without saying so) and blocks an engine's
// KV events report (Store, Remove, Clear). It is safe for concurrent use:
// writers take a write lock, Longest a read lock.
type Index struct {
	opts    Options
	mu      sync.RWMutex
	blocks  map[uint64]uint64    // key → packed first holding
	more    map[uint64][]holding // key → the other holdings, by engine
	engines []engineState
	ids     map[string]uint16
	free    []uint16
	sweep   int // the next engine StoreAt expires besides the one it stores for
}

// New validates opts and returns an empty Index.
func New(opts Options) (*Index, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	return &Index{opts: opts.WithDefaults(), blocks: map[uint64]uint64{}, more: map[uint64][]holding{}, ids: map[string]uint16{}}, nil
}

// Blocks returns how many distinct blocks the index holds.
func (x *Index) Blocks() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.blocks)
}

// EngineBlocks returns how many blocks engine holds.
func (x *Index) EngineBlocks(engine string) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if id, ok := x.ids[engine]; ok {
		return x.engines[id].blocks
	}
	return 0
}

func (x *Index) id(engine string) (uint16, error) {
	if id, ok := x.ids[engine]; ok {
		return id, nil
	}
	var id uint16
	switch {
	case len(x.free) > 0:
		id = x.free[len(x.free)-1]
		x.free = x.free[:len(x.free)-1]
	case len(x.engines) < x.opts.MaxEngines:
		id = uint16(len(x.engines))
		x.engines = append(x.engines, engineState{})
	default:
		return 0, fmt.Errorf("%w: engine %q would be number %d (MaxEngines %d)", ErrTooManyEngines, engine, len(x.engines)+1, x.opts.MaxEngines)
	}
	x.engines[id] = engineState{name: engine, used: true, capacity: x.opts.MaxBlocksPerEngine}
	x.ids[engine] = id
	return id, nil
}

// SetCapacity sets how many blocks engine may hold (its KV cache size in
// the index's blocks, when known), within 1..Options.MaxBlocksPerEngine;
// a change forgets the engine's blocks, as its ring is rebuilt.
func (x *Index) SetCapacity(engine string, blocks int) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	id, err := x.id(engine)
	if err != nil {
		return err
	}
	blocks = max(1, min(blocks, x.opts.MaxBlocksPerEngine))
	if e := &x.engines[id]; e.capacity != blocks {
		x.clear(id)
		e.capacity = blocks
	}
	return nil
}

// Store records that engine holds the blocks keys.
func (x *Index) Store(engine string, keys []uint64) error {
	return x.StoreAt(engine, keys, time.Time{})
}

// StoreAt records that engine holds the blocks keys as of now, and forgets
// blocks of engine (and of one other engine, in turn) not stored again
// within Options.TTL. A zero now, or no TTL, expires nothing.
func (x *Index) StoreAt(engine string, keys []uint64, now time.Time) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	id, err := x.id(engine)
	if err != nil {
		return err
	}
	if x.opts.TTL > 0 && !now.IsZero() {
		ms := now.UnixMilli()
		x.expire(id, ms)
		if len(x.engines) > 1 {
			x.sweep = (x.sweep + 1) % len(x.engines)
			if x.engines[x.sweep].used {
				x.expire(uint16(x.sweep), ms)
			}
		}
		e := &x.engines[id]
		if n := len(e.marks); n == 0 || ms-e.marks[n-1].at >= x.opts.TTL.Milliseconds()/8 {
			e.marks = append(e.marks, mark{stored: e.stored, at: ms, last: ms})
		} else {
			e.marks[n-1].last = max(e.marks[n-1].last, ms)
		}
	}
	// Deepest first, so that the ring, which evicts the oldest stores
	// first, drops a sequence's blocks from its tail, keeping what an
	// engine holds of it a prefix.
	for i := len(keys) - 1; i >= 0; i-- {
		x.store(id, keys[i])
	}
	return nil
}

// expire forgets engine id's stores made more than the TTL before now (ms),
// stretch by stretch of its marks.
func (x *Index) expire(id uint16, now int64) {
	e := &x.engines[id]
	cut := now - x.opts.TTL.Milliseconds()
	for len(e.marks) > 0 && e.marks[0].last <= cut {
		upTo := e.stored
		if len(e.marks) > 1 {
			upTo = e.marks[1].stored
		}
		x.evictUpTo(id, upTo)
		e.marks = e.marks[1:]
	}
}

// ringSpans bounds an engine's ring at that many slots per block of its
// capacity (8 bytes a slot): room for each held block to have been stored
// four times since the oldest one was, as a conversation's earlier blocks
// are at its fourth turn. Past it the oldest store is evicted even while
// the blocks are under capacity.
const ringSpans = 4

// evictUpTo drops engine id's live stores older than store upTo.
func (x *Index) evictUpTo(id uint16, upTo uint64) {
	e := &x.engines[id]
	for ; e.oldest < upTo && e.oldest < e.stored; e.oldest++ {
		x.drop(id, e.ring[e.oldest%e.span], uint32(e.oldest), true)
	}
}

// grow doubles engine id's ring (within ringSpans × capacity), keeping each
// store's stamp: only the slots move.
func (x *Index) grow(id uint16) {
	e := &x.engines[id]
	span := min(2*e.span, ringSpans*uint64(e.capacity))
	ring := make([]uint64, span)
	for s := e.oldest; s < e.stored; s++ {
		ring[s%span] = e.ring[s%e.span]
	}
	e.ring, e.span = ring, span
}

// store records that engine id holds k.
func (x *Index) store(id uint16, k uint64) {
	e := &x.engines[id]
	if e.ring == nil {
		e.span = uint64(e.capacity)
		e.ring = make([]uint64, 0, min(e.span, 1024))
	}
	if e.stored-e.oldest == e.span {
		if e.blocks < e.capacity && e.span < ringSpans*uint64(e.capacity) {
			// Full of stores, not of blocks: stale slots take the room.
			x.grow(id)
			e = &x.engines[id]
		} else {
			// Evict the oldest store if it is still live.
			x.drop(id, e.ring[e.oldest%e.span], uint32(e.oldest), true)
			e.oldest++
		}
	}
	stamp := uint32(e.stored)
	if slot := e.stored % e.span; slot < uint64(len(e.ring)) {
		e.ring[slot] = k
	} else {
		e.ring = append(e.ring, k)
	}
	e.stored++
	x.hold(id, k, holding{engine: id, stamp: stamp})
	// Over capacity: evict the oldest live stores (the least recently
	// stored blocks); k, the newest, is not among them.
	for e.blocks > e.capacity && e.oldest < e.stored {
		x.drop(id, e.ring[e.oldest%e.span], uint32(e.oldest), true)
		e.oldest++
	}
}

// hold records holding h of k (h.engine's newest store of k).
func (x *Index) hold(id uint16, k uint64, h holding) {
	e := &x.engines[id]
	v, ok := x.blocks[k]
	switch {
	case !ok:
		x.blocks[k] = pack(h)
		e.blocks++
		return
	case unpack(v).engine == id:
		x.blocks[k] = pack(h) | v&moreBit
		return
	}
	more := x.more[k]
	at, found := slices.BinarySearchFunc(more, id, func(h holding, id uint16) int { return int(h.engine) - int(id) })
	if found {
		more[at].stamp = h.stamp
		return
	}
	x.more[k] = slices.Insert(more, at, h)
	x.blocks[k] = v | moreBit
	e.blocks++
}

// drop removes engine id's holding of k; when exact, only if its stamp is
// stamp (an eviction of a store that may have been superseded).
func (x *Index) drop(id uint16, k uint64, stamp uint32, exact bool) {
	v, ok := x.blocks[k]
	if !ok {
		return
	}
	if first := unpack(v); first.engine == id {
		if exact && first.stamp != stamp {
			return
		}
		x.engines[id].blocks--
		if v&moreBit == 0 {
			delete(x.blocks, k)
			return
		}
		// Promote the last of the others.
		more := x.more[k]
		last := more[len(more)-1]
		x.setMore(k, more[:len(more)-1], pack(last))
		return
	}
	if v&moreBit == 0 {
		return
	}
	more := x.more[k]
	at, found := slices.BinarySearchFunc(more, id, func(h holding, id uint16) int { return int(h.engine) - int(id) })
	if !found || (exact && more[at].stamp != stamp) {
		return
	}
	x.engines[id].blocks--
	x.setMore(k, slices.Delete(more, at, at+1), v&^moreBit)
}

// setMore stores k's first holding (packed, without moreBit) and the
// others.
func (x *Index) setMore(k uint64, more []holding, first uint64) {
	if len(more) == 0 {
		delete(x.more, k)
		x.blocks[k] = first
		return
	}
	x.more[k] = more
	x.blocks[k] = first | moreBit
}

// Remove records that engine no longer holds the blocks keys.
func (x *Index) Remove(engine string, keys []uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	id, ok := x.ids[engine]
	if !ok {
		return
	}
	for _, k := range keys {
		x.drop(id, k, 0, false)
	}
}

// Clear forgets every block of engine (vLLM's AllBlocksCleared, an engine
// restart, or a gap in its events); the engine keeps its id.
func (x *Index) Clear(engine string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if id, ok := x.ids[engine]; ok {
		x.clear(id)
	}
}

func (x *Index) clear(id uint16) {
	e := &x.engines[id]
	x.evictUpTo(id, e.stored)
	e.ring, e.stored, e.oldest, e.blocks, e.marks = nil, 0, 0, 0, nil
}

// Forget removes engine and its blocks from the index, freeing its id.
func (x *Index) Forget(engine string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	id, ok := x.ids[engine]
	if !ok {
		return
	}
	x.clear(id)
	x.engines[id] = engineState{}
	delete(x.ids, engine)
	x.free = append(x.free, id)
}

// Longest appends to dst, for the engines that hold keys[0] (at most
// MaxMatches of them), how many leading keys each holds — its cached
// prefix of the request — and returns the extended slice, the deepest
// first. keys are a request's chained block keys (BlockKeys, or a router's
// text blocks); only the first MaxKeys count.
func (x *Index) Longest(dst []Match, keys []uint64) []Match {
	return x.Deepest(dst, keys, MaxMatches)
}

// Deepest is Longest reporting at most limit engines (1..MaxMatches), the
// deepest first: when more engines hold a request's leading blocks than
// limit, those left out hold no more of it than the last one reported.
// With dst of enough capacity it does not allocate.
//
// It bisects rather than reading every key: an engine's depth is where its
// holdings of the request's keys end, found in about log2(len(keys)) map
// reads per distinct depth. That is exact while what an engine holds of a
// request is a prefix of it — always for blocks a router stored from what
// it routed, and for an engine's events as long as it evicts a sequence's
// blocks from the tail, as vLLM's free queue does (a request's blocks are
// freed last block first). An engine with a hole in the middle (a block
// removed by an event while later ones stay) is reported at a depth where
// its holdings change, not necessarily its first hole.
func (x *Index) Deepest(dst []Match, keys []uint64, limit int) []Match {
	limit = max(1, min(limit, MaxMatches))
	if len(keys) > MaxKeys {
		keys = keys[:MaxKeys]
	}
	if len(keys) == 0 {
		return dst
	}
	// found holds the engines reported so far: a router asks for a few,
	// and zeroing room for MaxMatches would be a good part of its lookup.
	if limit <= fewMatches {
		var found [fewMatches]uint16
		return x.deepest(dst, keys, limit, found[:0])
	}
	var found [MaxMatches]uint16
	return x.deepest(dst, keys, limit, found[:0])
}

// fewMatches is the limit up to which Deepest keeps its found engines in a
// small array.
const fewMatches = 16

// deepest is Deepest for 1..MaxKeys keys and limit 1..cap(found), found
// empty.
func (x *Index) deepest(dst []Match, keys []uint64, limit int, found []uint16) []Match {
	x.mu.RLock()
	defer x.mu.RUnlock()
	// Each round finds the deepest key held by an engine not found yet:
	// all its holders not found have that depth, and the engines left hold
	// less, so the next round bisects the keys before it. The entries of
	// keys[0] and of each round's deepest key are read once.
	e0 := x.entry(keys[0])
	if !e0.held {
		return dst
	}
	root := step{first: e0.v &^ moreBit, more: x.others(keys[0], &e0)}
	for hi := len(keys); hi > 0 && len(found) < limit && x.fresh(keys[0], &e0, found); {
		lo, at := 0, e0 // x.fresh(keys[lo], &at, found) holds; find the last such lo < hi
		for r := hi - 1; lo < r; {
			mid := (lo + r + 1) / 2
			if e := x.entry(keys[mid]); x.fresh(keys[mid], &e, found) {
				lo, at = mid, e
			} else {
				r = mid - 1
			}
		}
		ids := x.others(keys[lo], &at)
		for k := -1; k < len(ids) && len(found) < limit; k++ {
			id := uint16(at.v)
			if k >= 0 {
				id = ids[k].engine
			}
			if in(found, id) {
				continue
			}
			found = append(found, id)
			if root.holds(id) { // else it holds none of the request's prefix
				dst = append(dst, Match{Engine: x.engines[id].name, Blocks: lo + 1})
			}
		}
		hi = lo
	}
	return dst
}

// entry is a block's entry as a lookup read it: held, its packed first
// holding v, and (once moreRead) its other holdings.
type entry struct {
	v        uint64
	held     bool
	moreRead bool
	more     []holding
}

// entry reads key's entry.
func (x *Index) entry(key uint64) entry {
	v, ok := x.blocks[key]
	return entry{v: v, held: ok}
}

// others returns the other holdings of key, whose entry e is, reading them
// at most once.
func (x *Index) others(key uint64, e *entry) []holding {
	if !e.moreRead {
		e.moreRead = true
		if e.v&moreBit != 0 {
			e.more = x.more[key]
		}
	}
	return e.more
}

// fresh reports whether key, whose entry e is, has a holder not in found.
func (x *Index) fresh(key uint64, e *entry, found []uint16) bool {
	if !e.held {
		return false
	}
	if !in(found, uint16(e.v)) {
		return true
	}
	for _, h := range x.others(key, e) {
		if !in(found, h.engine) {
			return true
		}
	}
	return false
}

// step is a key's holdings as a lookup read them.
type step struct {
	first uint64
	more  []holding
}

// holds reports whether engine id holds the block s describes.
func (s *step) holds(id uint16) bool {
	if uint16(s.first) == id {
		return true
	}
	// s.more is sorted by engine; a plain bisection, since a generic one
	// with a comparison function was a tenth of a router's pick.
	lo, hi := 0, len(s.more)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if s.more[mid].engine < id {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo < len(s.more) && s.more[lo].engine == id
}

// in reports whether ids holds id.
func in(ids []uint16, id uint16) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}
