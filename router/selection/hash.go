package selection

import "math/bits"

// FNV-1a 64-bit parameters.
const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// golden is 2^64 divided by the golden ratio, rounded to odd; multiplying a
// counter by it gives a low-discrepancy (Weyl) sequence in the high bits.
const golden = 0x9E3779B97F4A7C15

// Mix64 is the SplitMix64 finaliser: a bijective avalanche of all 64 bits.
// Selection derives probe steps and shedding draws from keys with it.
func Mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	x ^= x >> 31
	return x
}

// Hasher is an allocation-free streaming FNV-1a 64 hash with a byte budget:
// bytes written after the budget is spent are ignored. Affinity keys are
// hashed with it.
type Hasher struct {
	h    uint64
	left int
}

// NewHasher returns a Hasher seeded with seed that hashes at most budget
// bytes.
func NewHasher(seed uint64, budget int) Hasher {
	return Hasher{h: fnvOffset64 ^ seed, left: budget}
}

// WriteString hashes the bytes of s, as far as the budget allows.
func (h *Hasher) WriteString(s string) {
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

// WriteBytes hashes b, as far as the budget allows.
func (h *Hasher) WriteBytes(b []byte) {
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

// WriteSep mixes a separator that no byte string can produce, so that
// ("ab","c") and ("a","bc") hash differently. It does not use the budget.
func (h *Hasher) WriteSep() {
	h.h = bits.RotateLeft64(h.h^0xFF51AFD7ED558CCD, 29) * fnvPrime64
}

// Sum returns the hash of what was written, well mixed.
func (h *Hasher) Sum() uint64 { return Mix64(h.h) }

// HashString returns a well-mixed 64-bit hash of s, suitable as a selection
// key for router.Table.Pick. It does not allocate and is the same on every platform.
func HashString(s string) uint64 {
	h := NewHasher(0, len(s))
	h.WriteString(s)
	return h.Sum()
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
	return Mix64(r.s)
}

// unit returns a float64 uniform in (0, 1].
func (r *splitmix) unit() float64 {
	return float64(r.next()>>11+1) * (1.0 / (1 << 53))
}
