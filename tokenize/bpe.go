package tokenize

import (
	"sync"
)

// byteRunes is GPT-2's bytes_to_unicode: the printable character that
// stands for each byte in a byte-level vocabulary (printable Latin-1 bytes
// stand for themselves, the others for U+0100 on, in byte order).
func byteRunes() [256]rune {
	var t [256]rune
	n := 0
	for b := 0; b < 256; b++ {
		if '!' <= b && b <= '~' || 0xA1 <= b && b <= 0xAC || 0xAE <= b && b <= 0xFF {
			t[b] = rune(b)
		} else {
			t[b] = rune(256 + n)
			n++
		}
	}
	return t
}

// merge is one entry of the merge table: the pair's rank (its line in
// merges, lower first) and the id of the merged token.
type merge struct {
	rank uint32
	id   uint32
}

// pairKey packs two token ids into the merge table's key.
func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

// bpe is a byte-level BPE model: the id of each byte and the merge table.
type bpe struct {
	byteID [256]uint32
	merges map[uint64]merge
	// words maps a pre-token's raw bytes to its id when the model's
	// ignore_merges is set (Llama-3): a word in the vocabulary is one
	// token, whatever the merges would make of it. Nil otherwise.
	words map[string]uint32
	// scratch holds the per-call buffers of encodeWord.
	scratch sync.Pool
}

// wordScratch is encodeWord's working memory, reused through bpe.scratch.
type wordScratch struct {
	ids  []uint32
	prev []int32
	next []int32
	// pair holds, for each live symbol, the merge of it and its right
	// neighbour (rank noMerge when there is none), so that a heap entry is
	// checked without a second lookup.
	pair []merge
	heap []uint64
}

// noMerge is the rank of a pair the table does not merge.
const noMerge = ^uint32(0)

// encodeWord appends the ids of one pre-token (raw bytes) to dst: its bytes'
// ids, merged pair by pair, the lowest-ranked adjacent pair first and the
// leftmost of equal ranks, as HF tokenizers' BPE merges them. A heap of
// candidate pairs keeps a long word at O(n log n).
func (m *bpe) encodeWord(dst []uint32, word string) []uint32 {
	if m.words != nil {
		if id, ok := m.words[word]; ok {
			return append(dst, id)
		}
	}
	n := len(word)
	if n == 1 {
		return append(dst, m.byteID[word[0]])
	}
	sc, _ := m.scratch.Get().(*wordScratch)
	if sc == nil {
		sc = &wordScratch{}
	}
	defer m.scratch.Put(sc)
	if cap(sc.ids) < n {
		sc.ids = make([]uint32, n, 2*n)
		sc.prev = make([]int32, n, 2*n)
		sc.next = make([]int32, n, 2*n)
		sc.pair = make([]merge, n, 2*n)
	}
	ids, prev, next, pair := sc.ids[:n], sc.prev[:n], sc.next[:n], sc.pair[:n]
	for i := 0; i < n; i++ {
		ids[i] = m.byteID[word[i]]
		prev[i] = int32(i - 1)
		next[i] = int32(i + 1)
	}
	next[n-1] = -1
	h := sc.heap[:0]
	// setPair records the merge of i and its right neighbour and queues it.
	setPair := func(i int32) {
		pair[i].rank = noMerge
		if j := next[i]; j >= 0 {
			if mg, ok := m.merges[pairKey(ids[i], ids[j])]; ok {
				pair[i] = mg
				h = heapPush(h, uint64(mg.rank)<<32|uint64(i))
			}
		}
	}
	for i := int32(0); i < int32(n); i++ {
		setPair(i)
	}
	for len(h) > 0 {
		var top uint64
		top, h = heapPop(h)
		rank, i := uint32(top>>32), int32(uint32(top))
		if ids[i] == dead || pair[i].rank != rank {
			continue // the pair changed since it was queued
		}
		j := next[i]
		ids[i] = pair[i].id
		ids[j] = dead
		next[i] = next[j]
		if k := next[j]; k >= 0 {
			prev[k] = i
		}
		setPair(i)
		if p := prev[i]; p >= 0 {
			setPair(p)
		}
	}
	sc.heap = h[:0]
	for i := int32(0); i >= 0; i = next[i] {
		dst = append(dst, ids[i])
	}
	return dst
}

// dead marks a symbol merged into its left neighbour. No vocabulary reaches
// it: ids are checked to be below it when the model loads.
const dead = ^uint32(0)

// heapPush adds v to the min-heap h.
func heapPush(h []uint64, v uint64) []uint64 {
	h = append(h, v)
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if h[p] <= v {
			break
		}
		h[i], h[p] = h[p], v
		i = p
	}
	return h
}

// heapPop removes and returns the least element of the non-empty min-heap h.
func heapPop(h []uint64) (uint64, []uint64) {
	top := h[0]
	last := h[len(h)-1]
	h = h[:len(h)-1]
	if len(h) == 0 {
		return top, h
	}
	i := 0
	for {
		l := 2*i + 1
		if l >= len(h) {
			break
		}
		c := l
		if r := l + 1; r < len(h) && h[r] < h[l] {
			c = r
		}
		if last <= h[c] {
			break
		}
		h[i] = h[c]
		i = c
	}
	h[i] = last
	return top, h
}
