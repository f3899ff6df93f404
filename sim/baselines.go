package sim

import (
	"math"
	"slices"

	"github.com/switchyard-dev/switchyard/sim/scenario"
)

// The peers' routers, as published, for the simulator's baselines. Block sizes differ from the simulator's
// 512-token blocks (SGLang matches characters, llm-d 64-token blocks); sizes given in those units are
// converted to 512-token blocks at 4 characters per token.
const (
	// sglangCacheThreshold, sglangBalanceAbs and sglangBalanceRel are the SGLang model gateway's (sgl-router's)
	// defaults for its cache_aware policy: --cache-threshold 0.3, --balance-abs-threshold 64,
	// --balance-rel-threshold 1.5.
	sglangCacheThreshold = 0.3
	sglangBalanceAbs     = 64
	sglangBalanceRel     = 1.5
	// sglangEvictionMs is its --eviction-interval (120 s), and sglangMaxTreeBlocks its --max-tree-size of 2^26
	// characters per worker: 2^26 / 4 characters per token / 512 tokens per block.
	sglangEvictionMs    = 120_000
	sglangMaxTreeBlocks = 1 << 26 / 4 / 512

	// llmdPrefixWeight, llmdQueueWeight and llmdKVWeight are the weights of the llm-d inference scheduler's
	// default scheduling profile (the InferencePool chart's default-plugins.yaml): prefix-cache-scorer 3,
	// queue-scorer 2, kv-cache-utilization-scorer 2, summed and picked by max-score-picker.
	llmdPrefixWeight = 3
	llmdQueueWeight  = 2
	llmdKVWeight     = 2
	// llmdLRUBlocks is the prefix-cache-scorer's default lruCapacityPerServer, 31,250 blocks of 64 tokens, in
	// 512-token blocks.
	llmdLRUBlocks = 31250 * 64 / 512
)

// routedIndex is a router's approximate prefix index, built from what the router itself routed (as both
// peers' routers build theirs): per engine, the blocks it was sent, stamped with their last use. A request's
// leading blocks are a chain (each block's id names its content and everything before it), so a set of blocks
// per engine matches prefixes as a radix tree does.
type routedIndex struct {
	blocks []map[uint64]uint64 // [engine] block → last use
	anon   []int               // [engine] blocks of prompts without names
	clock  uint64
}

func newRoutedIndex(engines int) *routedIndex {
	x := &routedIndex{blocks: make([]map[uint64]uint64, engines), anon: make([]int, engines)}
	for j := range x.blocks {
		x.blocks[j] = map[uint64]uint64{}
	}
	return x
}

// match returns how many leading blocks engine j is believed to hold.
func (x *routedIndex) match(j int, blocks []uint64) int {
	m := x.blocks[j]
	for k, id := range blocks {
		if _, ok := m[id]; !ok {
			return k
		}
	}
	return len(blocks)
}

// size returns the number of blocks engine j is believed to hold.
func (x *routedIndex) size(j int) int { return len(x.blocks[j]) + x.anon[j] }

// insert records that a's prompt was sent to engine j.
func (x *routedIndex) insert(j int, a *scenario.Arrival) {
	x.clock++
	if len(a.Blocks) == 0 {
		x.anon[j] += (int(a.Prompt) + 511) / 512
		return
	}
	m := x.blocks[j]
	for _, id := range a.Blocks {
		m[id] = x.clock
	}
}

// evict drops engine j's least recently used blocks down to limit (prompts without names first: they can
// never match).
func (x *routedIndex) evict(j, limit int) {
	x.anon[j] = max(0, min(x.anon[j], limit-len(x.blocks[j])))
	m := x.blocks[j]
	over := len(m) - limit
	if over <= 0 {
		return
	}
	stamps := make([]uint64, 0, len(m))
	for _, s := range m {
		stamps = append(stamps, s)
	}
	slices.Sort(stamps)
	cut := stamps[over-1]
	for id, s := range m {
		if s <= cut {
			delete(m, id)
		}
	}
}

// sglangCacheAware is the SGLang model gateway's cache_aware policy. Each router keeps an approximate radix
// tree per worker of what it routed and counts its own requests in flight per worker. When the load is
// imbalanced — max − min > balance_abs_threshold and max > balance_rel_threshold × min — it sends to the
// least loaded worker; otherwise to the worker with the longest prefix match when the match covers more than
// cache_threshold of the prompt, else to the worker whose tree is smallest. Every 120 s each worker's tree is
// cut back to max_tree_size, least recently used first.
type sglangCacheAware struct {
	noControl
	trees     []*routedIndex // [cluster]
	lastEvict []float64      // [cluster]
}

func (p *sglangCacheAware) pick(r *run, c int, a *scenario.Arrival) int {
	if p.trees == nil {
		p.trees = make([]*routedIndex, len(r.f.clusters))
		p.lastEvict = make([]float64, len(r.f.clusters))
		for k := range p.trees {
			p.trees[k] = newRoutedIndex(len(r.engines))
		}
	}
	tree, evict := p.trees[c], r.now-p.lastEvict[c] >= sglangEvictionMs
	if evict {
		p.lastEvict[c] = r.now
	}
	minLoad, maxLoad, minJ := int32(math.MaxInt32), int32(-1), -1
	for j := range r.engines {
		if evict {
			tree.evict(j, sglangMaxTreeBlocks)
		}
		if r.down(c, j) {
			continue
		}
		l := r.inflight[c][j]
		if l < minLoad {
			minLoad, minJ = l, j
		}
		maxLoad = max(maxLoad, l)
	}
	if minJ < 0 {
		return -1
	}
	pick := minJ
	if !(maxLoad-minLoad > sglangBalanceAbs && float64(maxLoad) > float64(minLoad)*sglangBalanceRel) {
		best, bestMatch := -1, -1
		smallest, smallestSize := -1, math.MaxInt
		for j := range r.engines {
			if r.down(c, j) {
				continue
			}
			if m := tree.match(j, a.Blocks); m > bestMatch {
				best, bestMatch = j, m
			}
			if s := tree.size(j); s < smallestSize {
				smallest, smallestSize = j, s
			}
		}
		pick = smallest
		if len(a.Blocks) > 0 && float64(bestMatch)/float64(len(a.Blocks)) > sglangCacheThreshold {
			pick = best
		}
	}
	tree.insert(pick, a)
	return pick
}

// llmdWeighted is the llm-d inference scheduler's default scheduling profile: every live engine is scored by
// the prefix-cache scorer (the share of the prompt's leading blocks in the scheduler's index of what it
// routed, LRU-bounded per server), the queue scorer (waiting requests, min-max normalised over the
// candidates: the shortest queue scores 1, the longest 0, all 1 when equal) and the KV-cache-utilisation
// scorer (1 − the share of KV blocks in use by running requests); the weighted sum is maximised, ties broken
// at random. The scheduler scrapes engine metrics every 50 ms, so queue and KV use are read from the engines
// as they are.
type llmdWeighted struct {
	noControl
	index []*routedIndex // [cluster]
}

func (p *llmdWeighted) pick(r *run, c int, a *scenario.Arrival) int {
	n := len(r.engines)
	if p.index == nil {
		p.index = make([]*routedIndex, len(r.f.clusters))
		for k := range p.index {
			p.index[k] = newRoutedIndex(n)
		}
	}
	idx := p.index[c]
	qmin, qmax := math.MaxInt, -1
	for j := range r.engines {
		if r.down(c, j) {
			continue
		}
		q := r.engines[j].batch.Queued()
		qmin, qmax = min(qmin, q), max(qmax, q)
	}
	if qmax < 0 {
		return -1
	}
	best, bestScore, ties := -1, math.Inf(-1), 0
	for j := range r.engines {
		if r.down(c, j) {
			continue
		}
		e := &r.engines[j]
		prefix := 0.0
		if len(a.Blocks) > 0 {
			prefix = float64(idx.match(j, a.Blocks)) / float64(len(a.Blocks))
		}
		queue := 1.0
		if qmax > qmin {
			queue = float64(qmax-e.batch.Queued()) / float64(qmax-qmin)
		}
		kv := 1 - math.Min(1, float64(e.kv.used-e.kv.lruLen)/float64(e.kv.capacity))
		s := llmdPrefixWeight*prefix + llmdQueueWeight*queue + llmdKVWeight*kv
		switch {
		case s > bestScore:
			best, bestScore, ties = j, s, 1
		case s == bestScore:
			ties++
			if r.rng.IntN(ties) == 0 {
				best = j
			}
		}
	}
	idx.insert(best, a)
	if idx.size(best) > llmdLRUBlocks+llmdLRUBlocks/16 {
		idx.evict(best, llmdLRUBlocks)
	}
	return best
}
