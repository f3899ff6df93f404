package router

import "math/bits"

// FNV-1a 64-bit parameters.
const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// golden is 2^64 divided by the golden ratio, rounded to odd; multiplying a
// counter by it gives a low-discrepancy (Weyl) sequence in the high bits.
const golden = 0x9E3779B97F4A7C15

// mix64 is the SplitMix64 finaliser: a bijective avalanche of all 64 bits.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	x ^= x >> 31
	return x
}

// hasher is an allocation-free streaming FNV-1a 64 hash with a byte budget:
// bytes written after the budget is spent are ignored.
type hasher struct {
	h    uint64
	left int
}

func newHasher(seed uint64, budget int) hasher {
	return hasher{h: fnvOffset64 ^ seed, left: budget}
}

func (h *hasher) writeString(s string) {
	if len(s) > h.left {
		s = s[:h.left]
	}
	x := h.h
	for i := 0; i < len(s); i++ {
		x ^= uint64(s[i])
		x *= fnvPrime64
	}
	h.h = x
	h.left -= len(s)
}

func (h *hasher) writeBytes(b []byte) {
	if len(b) > h.left {
		b = b[:h.left]
	}
	x := h.h
	for _, c := range b {
		x ^= uint64(c)
		x *= fnvPrime64
	}
	h.h = x
	h.left -= len(b)
}

// writeSep mixes a separator that no byte string can produce, so that
// ("ab","c") and ("a","bc") hash differently. It does not use the budget.
func (h *hasher) writeSep() {
	h.h = bits.RotateLeft64(h.h^0xFF51AFD7ED558CCD, 29) * fnvPrime64
}

func (h *hasher) sum() uint64 { return mix64(h.h) }

// HashString returns a well-mixed 64-bit hash of s, suitable as a selection
// key for Table.Pick. It does not allocate and is the same on every platform.
func HashString(s string) uint64 {
	h := newHasher(0, len(s))
	h.writeString(s)
	return h.sum()
}

// SpreadKey turns a request sequence number into a selection key for
// requests without affinity: consecutive numbers walk the table's slots in a
// low-discrepancy order, so keyless traffic follows the weights closely.
func SpreadKey(seq uint64) uint64 { return seq * golden }

// splitmix is a tiny deterministic generator (SplitMix64); identical output
// on every platform for a given seed.
type splitmix struct{ s uint64 }

func (r *splitmix) next() uint64 {
	r.s += golden
	return mix64(r.s)
}

// unit returns a float64 uniform in (0, 1].
func (r *splitmix) unit() float64 {
	return float64(r.next()>>11+1) * (1.0 / (1 << 53))
}
