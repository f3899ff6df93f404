// Package kvcache is the simulator's model of an engine's KV cache: a
// fixed number of blocks, named prompt blocks kept after their request and
// evicted least-recently-used, anonymous blocks held while their request
// runs. A pure data structure, no clock.
package kvcache

// Cache is an engine's KV cache of fixed size in blocks. Named blocks (a
// prompt's hash ids) stay resident after their request finishes and are
// evicted least-recently-used; anonymous blocks (output space, prompts
// without names) are held only while their request runs.
type Cache struct {
	capacity int
	used     int // resident named blocks + anonymous blocks
	index    map[uint64]int32
	nodes    []kvNode
	free     []int32 // unused node slots
	head     int32   // LRU list of unpinned resident blocks: head is the oldest
	tail     int32
	lruLen   int
}

type kvNode struct {
	id         uint64
	ref        int32
	prev, next int32
}

const nilNode = -1

// New returns an empty cache of capacity blocks.
func New(capacity int) *Cache {
	return &Cache{capacity: capacity, index: map[uint64]int32{}, head: nilNode, tail: nilNode}
}

// Used returns the blocks in use: resident named blocks and anonymous ones.
func (c *Cache) Used() int { return c.used }

// Utilisation returns the fraction of the capacity pinned by running
// requests (used blocks less the evictable resident ones), as an engine's
// KV-use gauge reports it.
func (c *Cache) Utilisation() float64 {
	if c.capacity <= 0 {
		return 1
	}
	return float64(c.used-c.lruLen) / float64(c.capacity)
}

// Reset empties the cache (an engine restart).
func (c *Cache) Reset() {
	clear(c.index)
	c.nodes = c.nodes[:0]
	c.free = c.free[:0]
	c.head, c.tail = nilNode, nilNode
	c.used, c.lruLen = 0, 0
}

// Prefix returns how many leading blocks are resident.
func (c *Cache) Prefix(blocks []uint64) int {
	for k, id := range blocks {
		if _, ok := c.index[id]; !ok {
			return k
		}
	}
	return len(blocks)
}

func (c *Cache) unlink(n int32) {
	nd := &c.nodes[n]
	if nd.prev != nilNode {
		c.nodes[nd.prev].next = nd.next
	} else {
		c.head = nd.next
	}
	if nd.next != nilNode {
		c.nodes[nd.next].prev = nd.prev
	} else {
		c.tail = nd.prev
	}
	nd.prev, nd.next = nilNode, nilNode
	c.lruLen--
}

func (c *Cache) pushTail(n int32) {
	nd := &c.nodes[n]
	nd.prev, nd.next = c.tail, nilNode
	if c.tail != nilNode {
		c.nodes[c.tail].next = n
	} else {
		c.head = n
	}
	c.tail = n
	c.lruLen++
}

// Acquire pins blocks and reserves anon anonymous blocks, evicting unpinned
// blocks as needed. It returns the number of leading blocks that were
// already resident (the prefix hit) and false, changing nothing, when the
// cache cannot make room. force admits the request even then (for a request
// larger than the whole cache on an idle engine): the cache overflows until
// it is released.
func (c *Cache) Acquire(blocks []uint64, anon int, force bool) (int, bool) {
	hit := c.Prefix(blocks)
	need := anon
	pinnable := 0 // resident unpinned blocks of this request: not evictable for it
	for _, id := range blocks {
		n, ok := c.index[id]
		if !ok {
			need++
		} else if c.nodes[n].ref == 0 {
			pinnable++
		}
	}
	room := c.capacity - c.used + c.lruLen - pinnable
	if need > room && !force {
		return 0, false
	}
	// Pin the resident blocks first so that eviction cannot take them.
	for _, id := range blocks {
		if n, ok := c.index[id]; ok {
			if c.nodes[n].ref == 0 {
				c.unlink(n)
			}
			c.nodes[n].ref++
		}
	}
	for c.capacity-c.used < need && c.head != nilNode {
		n := c.head
		c.unlink(n)
		delete(c.index, c.nodes[n].id)
		c.free = append(c.free, n)
		c.used--
	}
	for _, id := range blocks {
		if _, ok := c.index[id]; ok {
			continue
		}
		var n int32
		if k := len(c.free); k > 0 {
			n = c.free[k-1]
			c.free = c.free[:k-1]
		} else {
			n = int32(len(c.nodes))
			c.nodes = append(c.nodes, kvNode{})
		}
		c.nodes[n] = kvNode{id: id, ref: 1, prev: nilNode, next: nilNode}
		c.index[id] = n
		c.used++
	}
	c.used += anon
	return hit, true
}

// Release unpins blocks (which stay cached) and frees anon anonymous blocks.
func (c *Cache) Release(blocks []uint64, anon int) {
	c.used -= anon
	for _, id := range blocks {
		n, ok := c.index[id]
		if !ok {
			continue
		}
		nd := &c.nodes[n]
		if nd.ref > 0 {
			nd.ref--
			if nd.ref == 0 {
				c.pushTail(n)
			}
		}
	}
}
