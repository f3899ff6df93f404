package kvcache

import "testing"

func TestKVCacheLRUAndPrefix(t *testing.T) {
	c := New(6)
	if hit, ok := c.Acquire([]uint64{1, 2, 3}, 1, false); !ok || hit != 0 {
		t.Fatalf("first acquire: hit %d ok %v", hit, ok)
	}
	// 4 blocks used, all pinned: 3 more do not fit.
	if _, ok := c.Acquire([]uint64{4, 5}, 1, false); ok {
		t.Fatal("acquire beyond capacity succeeded")
	}
	c.Release([]uint64{1, 2, 3}, 1)
	if hit, _ := c.Acquire([]uint64{1, 2, 9}, 0, false); hit != 2 {
		t.Fatalf("prefix hit %d, want 2", hit)
	}
	c.Release([]uint64{1, 2, 9}, 0)
	// Resident: 3 (oldest), 1, 2, 9. Four new blocks evict the oldest two: 3 and 1.
	if _, ok := c.Acquire([]uint64{20, 21, 22, 23}, 0, false); !ok {
		t.Fatal("acquire with eviction failed")
	}
	if c.Prefix([]uint64{3}) != 0 || c.Prefix([]uint64{1}) != 0 || c.Prefix([]uint64{2}) != 1 || c.Prefix([]uint64{9}) != 1 {
		t.Fatal("LRU evicted the wrong blocks")
	}
	if c.Used() != 6 {
		t.Fatalf("used %d, want 6", c.Used())
	}
}
