package kvindex

import (
	"errors"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// op is one step of a scenario: store, remove, clear or forget keys of an engine.
type op struct {
	kind   string
	engine string
	keys   []uint64
}

func apply(t *testing.T, x *Index, ops []op) {
	t.Helper()
	for _, o := range ops {
		switch o.kind {
		case "store":
			if err := x.Store(o.engine, o.keys); err != nil {
				t.Fatalf("store %s %v: %v", o.engine, o.keys, err)
			}
		case "remove":
			x.Remove(o.engine, o.keys)
		case "clear":
			x.Clear(o.engine)
		case "forget":
			x.Forget(o.engine)
		default:
			t.Fatalf("unknown op %q", o.kind)
		}
	}
}

func sorted(m []Match) []Match {
	m = slices.Clone(m)
	sort.Slice(m, func(i, j int) bool { return m[i].Engine < m[j].Engine })
	return m
}

func TestLongest(t *testing.T) {
	for _, tc := range []struct {
		name  string
		max   int
		ops   []op
		query []uint64
		want  []Match
		total int // blocks in the index after ops
	}{
		{name: "empty", query: []uint64{1, 2}, want: nil},
		{name: "one engine full prefix", ops: []op{{"store", "a", []uint64{1, 2, 3}}},
			query: []uint64{1, 2, 3, 4}, want: []Match{{"a", 3}}, total: 3},
		{name: "two engines, different depths", ops: []op{
			{"store", "a", []uint64{1, 2, 3}}, {"store", "b", []uint64{1, 2}}, {"store", "c", []uint64{9}}},
			query: []uint64{1, 2, 3}, want: []Match{{"a", 3}, {"b", 2}}, total: 4},
		{name: "a hole ends the prefix", ops: []op{{"store", "a", []uint64{1, 3}}},
			query: []uint64{1, 2, 3}, want: []Match{{"a", 1}}, total: 2},
		{name: "no first block, no match", ops: []op{{"store", "a", []uint64{2, 3}}},
			query: []uint64{1, 2, 3}, want: nil, total: 2},
		{name: "remove the tail", ops: []op{{"store", "a", []uint64{1, 2, 3}}, {"store", "b", []uint64{1, 2, 3}},
			{"remove", "a", []uint64{3}}},
			query: []uint64{1, 2, 3}, want: []Match{{"a", 2}, {"b", 3}}, total: 3},
		{name: "remove of an unknown engine or key is a no-op", ops: []op{{"store", "a", []uint64{1}},
			{"remove", "z", []uint64{1}}, {"remove", "a", []uint64{7}}},
			query: []uint64{1}, want: []Match{{"a", 1}}, total: 1},
		{name: "clear drops one engine only", ops: []op{{"store", "a", []uint64{1, 2}}, {"store", "b", []uint64{1}},
			{"clear", "a", nil}},
			query: []uint64{1, 2}, want: []Match{{"b", 1}}, total: 1},
		{name: "clear then store again", ops: []op{{"store", "a", []uint64{1, 2}}, {"clear", "a", nil}, {"store", "a", []uint64{1}}},
			query: []uint64{1, 2}, want: []Match{{"a", 1}}, total: 1},
		{name: "forget frees the id for another engine", ops: []op{{"store", "a", []uint64{1, 2}}, {"forget", "a", nil},
			{"store", "b", []uint64{1}}},
			query: []uint64{1, 2}, want: []Match{{"b", 1}}, total: 1},
		{name: "the cap evicts a sequence's deepest blocks first", max: 3, ops: []op{{"store", "a", []uint64{1, 2, 3, 4}}},
			query: []uint64{1, 2, 3, 4}, want: []Match{{"a", 3}}, total: 3},
		{name: "the cap evicts the oldest store", max: 3, ops: []op{{"store", "a", []uint64{1, 2, 3}}, {"store", "a", []uint64{4}}},
			query: []uint64{1, 2, 3}, want: []Match{{"a", 2}}, total: 3},
		{name: "a re-stored block is young again", max: 3, ops: []op{{"store", "a", []uint64{1, 2, 3}},
			{"store", "a", []uint64{1}}, {"store", "a", []uint64{4}}},
			query: []uint64{1, 4}, want: []Match{{"a", 2}}, total: 3},
		{name: "re-stores do not take the room of blocks", max: 3, ops: []op{{"store", "a", []uint64{1}},
			{"store", "a", []uint64{2}}, {"store", "a", []uint64{2}}, {"store", "a", []uint64{2}}, {"store", "a", []uint64{3}}},
			query: []uint64{1}, want: []Match{{"a", 1}}, total: 3},
		{name: "past capacity the least recently stored block goes", max: 3, ops: []op{{"store", "a", []uint64{1}},
			{"store", "a", []uint64{2}}, {"store", "a", []uint64{2}}, {"store", "a", []uint64{3}}, {"store", "a", []uint64{4}}},
			query: []uint64{1}, want: nil, total: 3},
		{name: "a removed block's ring slot is stale", max: 2, ops: []op{{"store", "a", []uint64{1, 2}},
			{"remove", "a", []uint64{1}}, {"store", "a", []uint64{1}}, {"store", "a", []uint64{3}}},
			query: []uint64{1, 3}, want: []Match{{"a", 2}}, total: 2},
		{name: "eviction of one engine leaves the others", max: 2, ops: []op{{"store", "a", []uint64{1, 2}},
			{"store", "b", []uint64{1, 2, 3}}},
			query: []uint64{1, 2}, want: []Match{{"a", 2}, {"b", 2}}, total: 2},
		{name: "stored twice counts once", ops: []op{{"store", "a", []uint64{1, 1, 1}}},
			query: []uint64{1, 1}, want: []Match{{"a", 2}}, total: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, err := New(Options{MaxBlocksPerEngine: tc.max})
			if err != nil {
				t.Fatal(err)
			}
			apply(t, x, tc.ops)
			got := sorted(x.Longest(nil, tc.query))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Longest(%v) = %v, want %v", tc.query, got, tc.want)
			}
			if x.Blocks() != tc.total {
				t.Fatalf("Blocks() = %d, want %d", x.Blocks(), tc.total)
			}
			sum := 0
			for _, e := range []string{"a", "b", "c"} {
				sum += x.EngineBlocks(e)
			}
			if held := holdings(x); sum != held {
				t.Fatalf("engines count %d blocks, the index holds %d", sum, held)
			}
		})
	}
}

func holdings(x *Index) int {
	n := 0
	for k := range x.blocks {
		n += 1 + len(x.more[k])
	}
	return n
}

func TestOptions(t *testing.T) {
	for _, tc := range []struct {
		opts  Options
		field string
	}{
		{Options{MaxBlocksPerEngine: -1}, "MaxBlocksPerEngine"},
		{Options{MaxEngines: 1 << 17}, "MaxEngines"},
		{Options{MaxEngines: -2}, "MaxEngines"},
	} {
		_, err := New(tc.opts)
		if !errors.Is(err, ErrOptions) || !contains(err.Error(), tc.field) {
			t.Errorf("New(%+v) = %v, want an ErrOptions naming %s", tc.opts, err, tc.field)
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func TestTooManyEngines(t *testing.T) {
	x, err := New(Options{MaxEngines: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []string{"a", "b"} {
		if err := x.Store(e, []uint64{1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := x.Store("c", []uint64{1}); !errors.Is(err, ErrTooManyEngines) {
		t.Fatalf("third engine: %v, want ErrTooManyEngines", err)
	}
	x.Forget("a")
	if err := x.Store("c", []uint64{1}); err != nil {
		t.Fatalf("after a forget: %v", err)
	}
}

func TestBlockKeys(t *testing.T) {
	tokens := make([]uint32, 100)
	for i := range tokens {
		tokens[i] = uint32(i * 7)
	}
	for _, tc := range []struct {
		name      string
		tokens    []uint32
		blockSize int
		want      int
	}{
		{"partial block has no key", tokens[:15], 16, 0},
		{"full blocks only", tokens, 16, 6},
		{"block size 1", tokens[:5], 1, 5},
		{"bad block size", tokens, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := BlockKeys(nil, 0, tc.tokens, tc.blockSize); len(got) != tc.want {
				t.Fatalf("%d keys, want %d", len(got), tc.want)
			}
		})
	}
	a := BlockKeys(nil, 0, tokens, 16)
	b := BlockKeys(nil, 0, append(slices.Clone(tokens[:32]), 999), 16)
	if !slices.Equal(a[:2], b) {
		t.Fatal("a shared prefix of two blocks does not give the same two keys")
	}
	other := slices.Clone(tokens)
	other[0] = 1
	if c := BlockKeys(nil, 0, other, 16); c[5] == a[5] {
		t.Fatal("a changed first token left the sixth block's key unchanged: keys are not chained")
	}
	if d := BlockKeys(nil, 1, tokens, 16); d[0] == a[0] {
		t.Fatal("another adapter (extra) gave the same key")
	}
	long := make([]uint32, 200) // more than ChainKey's buffer holds at once
	if ChainKey(RootKey, 0, long) == ChainKey(RootKey, 0, long[:199]) {
		t.Fatal("a block one token shorter hashes the same")
	}
}

func TestLongestDoesNotAllocate(t *testing.T) {
	x, _ := New(Options{})
	keys := BlockKeys(nil, 0, make([]uint32, 64*16), 16)
	for _, e := range []string{"a", "b", "c"} {
		if err := x.Store(e, keys[:32]); err != nil {
			t.Fatal(err)
		}
	}
	dst := make([]Match, 0, 8)
	if n := testing.AllocsPerRun(100, func() { dst = x.Longest(dst[:0], keys) }); n != 0 {
		t.Fatalf("Longest allocates %v times per call", n)
	}
}

// TestDeepestLimit: a shared first block held by many engines and one
// conversation's deeper blocks on one of them; a small limit still reports
// the deep holder first, and every reported depth is right.
func TestDeepestLimit(t *testing.T) {
	x, _ := New(Options{})
	shared := []uint64{10, 11}
	for e := range 40 {
		if err := x.Store("e"+strconv.Itoa(e), shared); err != nil {
			t.Fatal(err)
		}
	}
	if err := x.Store("e17", []uint64{10, 11, 12, 13}); err != nil {
		t.Fatal(err)
	}
	got := x.Deepest(nil, []uint64{10, 11, 12, 13, 14}, 4)
	if len(got) != 4 || got[0] != (Match{"e17", 4}) {
		t.Fatalf("Deepest = %v, want e17 at 4 first and 4 matches", got)
	}
	for _, m := range got[1:] {
		if m.Blocks != 2 {
			t.Fatalf("Deepest = %v: %s reported at %d, holds 2", got, m.Engine, m.Blocks)
		}
	}
	if all := x.Longest(nil, []uint64{10, 11, 12}); len(all) != 40 {
		t.Fatalf("Longest reports %d engines, want 40", len(all))
	}
}

// TestTTL: blocks not stored again within the TTL are forgotten on a later
// store, the engine's own or another's (the sweep), and re-stored ones stay.
func TestTTL(t *testing.T) {
	x, err := New(Options{TTL: 8 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(x.StoreAt("a", []uint64{1, 2, 3}, at(0)))
	must(x.StoreAt("b", []uint64{1, 5}, at(0)))
	must(x.StoreAt("a", []uint64{1, 2}, at(5))) // 1 and 2 young again, 3 not
	must(x.StoreAt("a", []uint64{7}, at(10)))
	if got := sorted(x.Longest(nil, []uint64{1, 2, 3})); !slices.Equal(got, []Match{{"a", 2}}) {
		t.Fatalf("after the TTL: %v, want a at 2 (3 and b's blocks expired)", got)
	}
	if n := x.EngineBlocks("b"); n != 0 {
		t.Fatalf("b holds %d blocks after its TTL, want 0 (swept by a's store)", n)
	}
	must(x.StoreAt("a", []uint64{8}, at(30)))
	if n := x.EngineBlocks("a"); n != 1 {
		t.Fatalf("a holds %d blocks long after, want 1 (its newest)", n)
	}
	if err := (Options{TTL: -1}).Validate(); !errors.Is(err, ErrOptions) || !contains(err.Error(), "TTL") {
		t.Fatalf("negative TTL: %v", err)
	}
}

// TestSetCapacity: an engine's own capacity bounds its blocks.
func TestSetCapacity(t *testing.T) {
	x, _ := New(Options{MaxBlocksPerEngine: 100})
	if err := x.SetCapacity("a", 2); err != nil {
		t.Fatal(err)
	}
	if err := x.Store("a", []uint64{1, 2, 3, 4}); err != nil {
		t.Fatal(err)
	}
	if n := x.EngineBlocks("a"); n != 2 {
		t.Fatalf("a holds %d blocks with capacity 2", n)
	}
	if got := x.Longest(nil, []uint64{1, 2, 3}); !slices.Equal(got, []Match{{"a", 2}}) {
		t.Fatalf("Longest = %v, want a at 2 (the tail evicted)", got)
	}
}
