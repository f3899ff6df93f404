package kvindex

import (
	"errors"
	"fmt"
	"sync"
)

// Defaults applied to zero-valued Options fields.
const (
	// DefaultMaxBlocksPerEngine bounds what one engine can make the index
	// hold. vLLM on an 80 GB GPU holds some tens of thousands of 16-token
	// blocks (its num_gpu_blocks); a million leaves room for CPU offload
	// tiers while keeping a hostile or broken publisher to some 60 MB.
	DefaultMaxBlocksPerEngine = 1 << 20
	// DefaultMaxEngines bounds the engines of one index; engine ids are 16 bits.
	DefaultMaxEngines = 1 << 16
)

// ErrOptions wraps every Options validation error.
var ErrOptions = errors.New("kvindex: invalid options")

// ErrTooManyEngines is returned when an index already holds MaxEngines engines.
var ErrTooManyEngines = errors.New("kvindex: too many engines")

// Options configures an Index.
type Options struct {
	// MaxBlocksPerEngine caps the blocks indexed per engine; past it the
	// engine's oldest stored blocks are forgotten first. Zero means
	// DefaultMaxBlocksPerEngine.
	MaxBlocksPerEngine int
	// MaxEngines caps the engines of the index. Zero means DefaultMaxEngines.
	MaxEngines int
}

func (o Options) withDefaults() Options {
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
	o = o.withDefaults()
	switch {
	case o.MaxBlocksPerEngine < 1 || o.MaxBlocksPerEngine > 1<<30:
		return fmt.Errorf("%w: MaxBlocksPerEngine is %d, want 1..%d", ErrOptions, o.MaxBlocksPerEngine, 1<<30)
	case o.MaxEngines < 1 || o.MaxEngines > DefaultMaxEngines:
		return fmt.Errorf("%w: MaxEngines is %d, want 1..%d", ErrOptions, o.MaxEngines, DefaultMaxEngines)
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

// entry is the engines holding one block: the first inline (most blocks are
// held by one engine), the others in more.
type entry struct {
	first holding
	more  []holding
}

// engineState is one engine's eviction ring: the keys of its last
// MaxBlocksPerEngine stores, oldest at head. A key removed since stays in
// the ring as a stale slot, recognised by its stamp.
type engineState struct {
	name   string
	ring   []uint64
	stored uint64 // stores so far; the next store's stamp is its low 32 bits
	blocks int    // blocks held now
	used   bool
}

// Match is one engine's longest cached prefix for a request: Blocks leading
// blocks of the request are in its cache.
type Match struct {
	// Engine is the engine's name.
	Engine string
	// Blocks is how many of the request's leading blocks it holds (>= 1).
	Blocks int
}

// Index is the prefix index of one model. It is safe for concurrent use:
// Apply and the other writers take a write lock, Longest a read lock.
type Index struct {
	opts    Options
	mu      sync.RWMutex
	blocks  map[uint64]entry
	engines []engineState
	ids     map[string]uint16
	free    []uint16
}

// New validates opts and returns an empty Index.
func New(opts Options) (*Index, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	return &Index{opts: opts.withDefaults(), blocks: map[uint64]entry{}, ids: map[string]uint16{}}, nil
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
	x.engines[id] = engineState{name: engine, used: true}
	x.ids[engine] = id
	return id, nil
}

// Store records that engine holds the blocks keys.
func (x *Index) Store(engine string, keys []uint64) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	id, err := x.id(engine)
	if err != nil {
		return err
	}
	for _, k := range keys {
		x.store(id, k)
	}
	return nil
}

func (x *Index) store(id uint16, k uint64) {
	e := &x.engines[id]
	capacity := x.opts.MaxBlocksPerEngine
	if e.ring == nil {
		e.ring = make([]uint64, 0, min(capacity, 1024))
	}
	stamp := uint32(e.stored)
	if len(e.ring) < capacity {
		e.ring = append(e.ring, k)
	} else {
		// The slot of the store made capacity stores ago: evict its key if
		// that store is still the engine's live one.
		slot := e.stored % uint64(capacity)
		x.drop(id, e.ring[slot], stamp-uint32(capacity), true)
		e.ring[slot] = k
	}
	e.stored++
	h := holding{engine: id, stamp: stamp}
	ent, ok := x.blocks[k]
	switch {
	case !ok:
		x.blocks[k] = entry{first: h}
		e.blocks++
		return
	case ent.first.engine == id:
		ent.first.stamp = stamp
		x.blocks[k] = ent
		return
	}
	for i := range ent.more {
		if ent.more[i].engine == id {
			ent.more[i].stamp = stamp
			return
		}
	}
	ent.more = append(ent.more, h)
	x.blocks[k] = ent
	e.blocks++
}

// drop removes engine id's holding of k; when exact, only if its stamp is
// stamp (an eviction of a store that may have been superseded).
func (x *Index) drop(id uint16, k uint64, stamp uint32, exact bool) {
	ent, ok := x.blocks[k]
	if !ok {
		return
	}
	// at is the holding's place: -1 for first, else its index in more.
	at := -2
	if ent.first.engine == id {
		if exact && ent.first.stamp != stamp {
			return
		}
		at = -1
	} else {
		for i, h := range ent.more {
			if h.engine == id {
				if exact && h.stamp != stamp {
					return
				}
				at = i
				break
			}
		}
	}
	switch {
	case at == -2:
		return
	case at == -1 && len(ent.more) == 0:
		delete(x.blocks, k)
		x.engines[id].blocks--
		return
	case at == -1:
		ent.first = ent.more[len(ent.more)-1]
	default:
		ent.more[at] = ent.more[len(ent.more)-1]
	}
	ent.more = ent.more[:len(ent.more)-1]
	if len(ent.more) == 0 {
		ent.more = nil
	}
	x.blocks[k] = ent
	x.engines[id].blocks--
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
	capacity := uint64(x.opts.MaxBlocksPerEngine)
	n := uint64(len(e.ring))
	for i := range n {
		stored := e.stored - n + i
		x.drop(id, e.ring[stored%capacity], uint32(stored), true)
	}
	e.ring, e.stored, e.blocks = nil, 0, 0
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

// Longest appends to dst, for every engine that holds keys[0], the number
// of leading keys it holds (its longest cached prefix of the request), and
// returns the extended slice, in no particular order. keys are a request's
// chained block keys (BlockKeys). With dst of enough capacity it does not
// allocate.
func (x *Index) Longest(dst []Match, keys []uint64) []Match {
	if len(keys) == 0 {
		return dst
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	ent, ok := x.blocks[keys[0]]
	if !ok {
		return dst
	}
	start := len(dst)
	dst = append(dst, Match{Engine: x.engines[ent.first.engine].name, Blocks: 1})
	for _, h := range ent.more {
		dst = append(dst, Match{Engine: x.engines[h.engine].name, Blocks: 1})
	}
	// alive are the candidates still matching, dst[start:start+alive].
	alive := len(dst) - start
	for i := 1; i < len(keys) && alive > 0; i++ {
		ent, ok := x.blocks[keys[i]]
		if !ok {
			break
		}
		for c := start; c < start+alive; {
			if x.holds(ent, dst[c].Engine) {
				dst[c].Blocks++
				c++
				continue
			}
			// Move the dropped candidate behind the live ones.
			last := start + alive - 1
			dst[c], dst[last] = dst[last], dst[c]
			alive--
		}
	}
	return dst
}

func (x *Index) holds(ent entry, engine string) bool {
	if x.engines[ent.first.engine].name == engine {
		return true
	}
	for _, h := range ent.more {
		if x.engines[h.engine].name == engine {
			return true
		}
	}
	return false
}
