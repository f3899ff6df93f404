package tokenize

import "sync"

// segmentCache remembers the ids of text segments between added tokens.
// The tokenizer splits a text at its added tokens before anything else, so
// a segment's ids do not depend on what surrounds it: a cached segment is
// exact. A chat request's messages are such segments (the template puts
// special tokens between them), so a shared system prompt and a
// conversation's earlier turns are encoded once. Memory is bounded by
// bytes; when full, arbitrary entries (Go's map order) make room.
type segmentCache struct {
	mu    sync.RWMutex
	m     map[string][]uint32
	bytes int
	max   int
}

// cacheMinSegment is the shortest segment worth caching: below it, encoding
// costs less than the lookup's hashing and locking.
const cacheMinSegment = 64

// entryOverhead is the map's and the slice header's bytes per entry.
const entryOverhead = 64

func newSegmentCache(maxBytes int) *segmentCache {
	return &segmentCache{m: map[string][]uint32{}, max: maxBytes}
}

func entrySize(key string, ids []uint32) int { return len(key) + 4*len(ids) + entryOverhead }

// get appends the cached ids of seg to dst.
func (c *segmentCache) get(dst []uint32, seg string) ([]uint32, bool) {
	c.mu.RLock()
	ids, ok := c.m[seg]
	c.mu.RUnlock()
	if !ok {
		return dst, false
	}
	return append(dst, ids...), true
}

// put stores a copy of ids under seg, evicting to stay within max.
func (c *segmentCache) put(seg string, ids []uint32) {
	size := entrySize(seg, ids)
	if size > c.max/4 {
		return // one entry may not take much of the cache
	}
	// The key is cloned: seg may be part of a request's buffer.
	key := string([]byte(seg))
	val := append([]uint32(nil), ids...)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[key]; ok {
		return
	}
	for k, v := range c.m {
		if c.bytes+size <= c.max {
			break
		}
		c.bytes -= entrySize(k, v)
		delete(c.m, k)
	}
	c.m[key] = val
	c.bytes += size
}
