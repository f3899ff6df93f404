package selection

import (
	"fmt"
	"sync/atomic"
)

// RecentKeys remembers, for the affinity keys a router has routed lately,
// the engine it sent each one to: a fixed-size, direct-mapped array (a key
// evicts whatever other key shares its entry), safe for concurrent use and
// free of allocation. Table.PickRecent uses it to keep a key on the engine
// that holds its cached prefix across weight snapshots, and to place a key
// it has not seen — whose prefix is cached nowhere it knows of — by load.
//
// One RecentKeys serves one model at one router; its memory is 8 bytes per
// entry.
type RecentKeys struct {
	entries []atomic.Uint64 // key tag << 32 | engine id; 0 is empty
	shift   uint
}

// DefaultRecentKeys is a RecentKeys size for one model at one router: 65536
// entries (512 KiB), more keys than a fleet's KV caches hold prefixes for
// one router's share of traffic in most deployments.
const DefaultRecentKeys = 1 << 16

// NewRecentKeys returns a RecentKeys of size entries, a power of two from 1
// to 1<<24.
func NewRecentKeys(size int) (*RecentKeys, error) {
	if size < 1 || size > 1<<24 || size&(size-1) != 0 {
		return nil, fmt.Errorf("router: recent keys: size %d is not a power of two in [1, %d]", size, 1<<24)
	}
	return newRecentKeys(size), nil
}

// newRecentKeys returns a RecentKeys of size entries, a valid size.
func newRecentKeys(size int) *RecentKeys {
	shift := uint(64)
	for s := size; s > 1; s >>= 1 {
		shift--
	}
	return &RecentKeys{entries: make([]atomic.Uint64, size), shift: shift}
}

// entry returns key's entry and the tag that marks it as key's.
func (rk *RecentKeys) entry(key uint64) (*atomic.Uint64, uint64) {
	var i uint64
	if rk.shift < 64 {
		i = key >> rk.shift
	}
	return &rk.entries[i], (key & 0xFFFF_FFFF) | 1 // never 0, so an entry is never empty by accident
}

// lookup returns the engine id remembered for key and whether there is one.
func (rk *RecentKeys) lookup(key uint64) (uint32, bool) {
	e, tag := rk.entry(key)
	v := e.Load()
	if v>>32 != tag {
		return 0, false
	}
	return uint32(v), true
}

// remember records that key was sent to the engine with id.
func (rk *RecentKeys) remember(key uint64, id uint32) {
	e, tag := rk.entry(key)
	e.Store(tag<<32 | uint64(id))
}

// Seen reports whether rk remembers key (false for a nil rk).
func (rk *RecentKeys) Seen(key uint64) bool {
	if rk == nil {
		return false
	}
	_, ok := rk.lookup(key)
	return ok
}

// RememberName records that key was sent to the engine named name; a nil
// rk records nothing.
func (rk *RecentKeys) RememberName(key uint64, name string) {
	if rk != nil {
		rk.remember(key, engineID(name))
	}
}

// engineID is an engine's identity in RecentKeys: a hash of its name, the
// same in every table.
func engineID(name string) uint32 { return uint32(HashString(name)) }

// PickRecent picks the engine for a request with affinity key and remembers
// the choice in rk:
//
//   - a key rk remembers stays on its engine while that engine has positive
//     weight in t, is live and within its bounded load — whatever the slots
//     of t say, so that a new weight snapshot does not move a key away from
//     the prefix cached for it;
//   - a remembered key whose engine cannot take it goes where Pick sends it;
//   - a key rk does not remember has, as far as this router knows, no
//     prefix cached anywhere, so it is placed as PickTwo places a keyless
//     request, but among NewKeyChoices weighted candidates: on the one
//     whose load is lowest relative to its planned load.
//
// The weights still decide where new keys go and, through the bounded load,
// how far a remembered key may overload its engine. With a nil rk it is Pick.
// It does not allocate and is O(1) like Pick and PickTwo.
func (t *Table) PickRecent(key uint64, g LoadGuard, rk *RecentKeys) (int, bool) {
	if rk == nil || g == nil {
		return t.Pick(key, g)
	}
	var i int
	var ok bool
	if id, seen := rk.lookup(key); seen {
		if x, has := t.ids[id]; has && x >= 0 && t.engines[x].Weight > 0 && !g.Down(int(x)) &&
			t.within(int(x), g.InFlight(int(x)), float64(g.TotalInFlight())) {
			return int(x), true
		}
		i, ok = t.Pick(key, g)
	} else {
		i, ok = t.pickLeast(key, g, NewKeyChoices)
	}
	if ok {
		rk.remember(key, engineID(t.engines[i].Name))
	}
	return i, ok
}
