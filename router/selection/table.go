package selection

import (
	"fmt"
	"math"
	"math/bits"
	"sort"
	"strings"
)

// DefaultSlots is the number of slots of a selection table when
// TableOptions.Slots is zero. It must be the same on every router of a
// cluster, or their tables differ.
const DefaultSlots = 1 << 16

// DefaultEpsilon is the bounded-load slack used when TableOptions.Epsilon is
// zero: an engine may carry up to 25% more than its weighted share of this
// router's in-flight requests (plus one) before requests spill.
const DefaultEpsilon = 0.25

// maxSlots bounds TableOptions.Slots (engine indexes are stored as uint32 and
// memory is 4 bytes per slot).
const maxSlots = 1 << 24

// Engine is one entry of a weight table: an engine, where to reach it, and
// the fraction of the (model, cluster) demand it should receive.
type Engine struct {
	// Name is the engine's name, a NATS token; it identifies the engine in
	// the selection hash, so it must be the same on every router.
	Name string
	// URL is the engine's base URL for HTTP forwarding, e.g.
	// "http://10.0.0.5:8000"; paths such as /v1/chat/completions are
	// appended to it. Empty when the engine is reached by other transports.
	URL string
	// Subject is the engine's NATS inference subject
	// (<prefix>.infer.<model>.<engine>). Empty when the engine is not
	// reachable over NATS.
	Subject string
	// ServedModel is the name the engine serves the table's model under,
	// written into the request's model field when it differs from what
	// the client sent; empty means the model id.
	ServedModel string
	// Weight is the fraction of demand for this engine, in [0, 1].
	Weight float64
	// Utilisation is the engine's planned utilisation: the load that the
	// optimizer's plan puts on it, from every cluster, over its capacity
	// (messages.WeightSnapshot.Utilisation). PickTwo and PickRecent weigh
	// an engine's live load against it. Zero, negative or not finite means
	// unknown; when any engine with positive weight lacks it, the table
	// uses the engines' weight shares instead (see Table.Planned).
	Utilisation float64
}

// TableOptions tunes NewTable. The zero value selects the defaults.
type TableOptions struct {
	// Slots is the number of slots, a power of two (default DefaultSlots).
	Slots int
	// Seed perturbs the hash of every engine; routers that must agree need
	// the same seed (default 0).
	Seed uint64
	// Epsilon is the bounded-load slack (default DefaultEpsilon); a negative
	// value disables bounded load.
	Epsilon float64
}

// Table is the precomputed, immutable selection structure for one weight
// snapshot of a (model, cluster). It is safe for concurrent use.
//
// A key picks the slot given by its top bits; the slot's owner is the key's
// engine. Slots come from one of two places. A snapshot that carries a slot
// table (computed by the optimizer with AssignSlots from the previous one)
// is installed as is with NewTableFromSlots: every router maps keys alike,
// and a weight change moves the minimum fraction of keys, the
// total-variation distance δ (up to one slot per engine of rounding),
// however many weights change at once. Otherwise NewTable computes the slots
// from the weights alone, as follows.
//
// Every slot s is owned by the engine that wins a weighted exponential race
// for it: argmin_j E(s,j)/w_j, where E(s,j) is an Exp(1) variable that
// depends only on the engine name and the slot (weighted rendezvous hashing,
// also known as P-MinHash).
//
// Movement: when weights change, a key moves only if its slot's race winner
// changes. Adding or removing an engine, setting one engine's weight with the
// others rescaled proportionally, or changing the shed fraction moves exactly
// the minimum, the total-variation distance δ (up to slot sampling noise).
// When several weights change independently a key moves with probability
// 1 − J_P(old, new) ≤ 2δ/(1+δ) (J_P: the probability Jaccard index), about
// 1.1–1.5·δ for random perturbations and up to ~2·δ for a pure transfer
// between two engines of a large table. No history-free scheme does better
// for every change: J_P is Pareto-optimal among consistent samplers
// (Moulton & Jiang 2018), and some pairs always reach 2δ/(1+δ) (Bavarian et
// al. 2020). That is why snapshots carry slot tables; NewTable remains for
// snapshots without one and for the router's local policy.
type Table struct {
	engines []Engine         // sorted by name
	index   map[string]int   // name → index in engines
	slots   []uint32         // slot → engine index
	shift   uint             // 64 - log2(len(slots))
	mask    uint64           // len(slots) - 1
	limit   []float64        // (1+ε)·w_i/W, or +Inf when bounded load is off
	weight  float64          // W = Σ w_i
	active  []int32          // engines with positive weight, by index
	share   []float64        // fraction of slots owned, by index
	perPlan []float64        // 1/planned load (Planned), by index; +Inf at zero weight
	ids     map[uint32]int32 // engineID → index; -1 when two names share an id
	// unbounded is set when bounded load is off (a negative epsilon).
	unbounded bool
}

// NewTable builds the selection table for engines. It fails when a name is
// empty or repeated, a weight is outside [0, 1] or not finite, the weights sum
// to more than 1, or Slots is not a power of two. A table whose weights are
// all zero is valid and picks nothing.
//
// The result depends only on the set of (name, weight) pairs, the seed and
// the slot count: not on the order of engines, nor on earlier tables.
func NewTable(engines []Engine, opts TableOptions) (*Table, error) {
	m := opts.Slots
	if m == 0 {
		m = DefaultSlots
	}
	if m < 1 || m > maxSlots || m&(m-1) != 0 {
		return nil, fmt.Errorf("router: new table: slots %d is not a power of two in [1, %d]", m, maxSlots)
	}
	t, err := newTableBase(engines, opts)
	if err != nil {
		return nil, fmt.Errorf("router: new table: %w", err)
	}
	if len(t.active) == 0 {
		return t, nil
	}
	names := make([]string, len(t.engines))
	weights := make([]float64, len(t.engines))
	for i, e := range t.engines {
		names[i], weights[i] = e.Name, e.Weight
	}
	t.slots = RendezvousSlots(names, weights, t.active, m, opts.Seed)
	t.finishSlots()
	return t, nil
}

// newTableBase checks engines and opts.Epsilon and returns a table without
// slots: engines sorted by name, their index, weights, limits and the
// active list.
func newTableBase(engines []Engine, opts TableOptions) (*Table, error) {
	eps := opts.Epsilon
	if eps == 0 {
		eps = DefaultEpsilon
	}
	if math.IsNaN(eps) || math.IsInf(eps, 0) {
		return nil, fmt.Errorf("epsilon %v is not finite", eps)
	}
	t := &Table{
		engines: append([]Engine(nil), engines...),
		index:   make(map[string]int, len(engines)),
	}
	sort.Slice(t.engines, func(a, b int) bool { return t.engines[a].Name < t.engines[b].Name })
	for i, e := range t.engines {
		if e.Name == "" || strings.ContainsAny(e.Name, ". *>\t\r\n") {
			return nil, fmt.Errorf("engine %d: invalid name %q", i, e.Name)
		}
		if _, dup := t.index[e.Name]; dup {
			return nil, fmt.Errorf("engine %q listed twice", e.Name)
		}
		if math.IsNaN(e.Weight) || e.Weight < 0 || e.Weight > 1 {
			return nil, fmt.Errorf("engine %q: weight %v outside [0, 1]", e.Name, e.Weight)
		}
		t.index[e.Name] = i
		t.weight += e.Weight
		if e.Weight > 0 {
			t.active = append(t.active, int32(i))
		}
	}
	if t.weight > 1+1e-9 {
		return nil, fmt.Errorf("weights sum to %v, more than 1", t.weight)
	}
	t.unbounded = eps < 0
	t.limit = make([]float64, len(t.engines))
	for i, e := range t.engines {
		switch {
		case eps < 0:
			t.limit[i] = math.Inf(1)
		case t.weight > 0:
			t.limit[i] = (1 + eps) * e.Weight / t.weight
		}
	}
	t.setPlan()
	t.share = make([]float64, len(t.engines))
	t.ids = make(map[uint32]int32, len(t.engines))
	for i, e := range t.engines {
		id := engineID(e.Name)
		if _, dup := t.ids[id]; dup {
			t.ids[id] = -1
			continue
		}
		t.ids[id] = int32(i)
	}
	return t, nil
}

// MinPlanned is the least planned load Table.Planned returns for an engine
// with positive weight, so that an engine planned nearly idle compares as
// lightly planned rather than dividing by zero.
const MinPlanned = 1e-3

// setPlan fills perPlan: every weighted engine's planned utilisation when
// all of them have one, else their weight shares.
func (t *Table) setPlan() {
	t.perPlan = make([]float64, len(t.engines))
	known := true
	for _, i := range t.active {
		u := t.engines[i].Utilisation
		if !(u > 0) || math.IsInf(u, 1) {
			known = false
			break
		}
	}
	for i, e := range t.engines {
		t.perPlan[i] = math.Inf(1)
		if e.Weight <= 0 {
			continue
		}
		p := e.Weight / t.weight
		if known {
			p = e.Utilisation
		}
		t.perPlan[i] = 1 / max(p, MinPlanned)
	}
}

// Planned returns the load the table plans for engine i, against which
// PickTwo and PickRecent weigh its live load: the engine's Utilisation when
// every engine with positive weight has one, else its weight share
// Weight/Weight(); at least MinPlanned; 0 for an engine of zero weight.
// Only the ratios between engines matter.
func (t *Table) Planned(i int) float64 {
	if math.IsInf(t.perPlan[i], 1) {
		return 0
	}
	return 1 / t.perPlan[i]
}

// finishSlots sets the key → slot mapping and the shares once t.slots (a
// power of two, non-empty) is filled.
func (t *Table) finishSlots() {
	m := len(t.slots)
	t.shift = uint(64 - bits.TrailingZeros(uint(m)))
	t.mask = uint64(m - 1)
	for _, j := range t.slots {
		t.share[j]++
	}
	for i := range t.share {
		t.share[i] /= float64(m)
	}
}

// Active returns the indexes of the engines with positive weight, in index
// order; the slice is the table's own and must not be modified.
func (t *Table) Active() []int32 { return t.active }

// Len returns the number of engines in the table, including those with zero
// weight.
func (t *Table) Len() int { return len(t.engines) }

// Engine returns the engine at index i (0 ≤ i < Len()); indexes follow the
// engines' names in ascending order.
func (t *Table) Engine(i int) Engine { return t.engines[i] }

// Engines returns a copy of the table's engines, sorted by name.
func (t *Table) Engines() []Engine { return append([]Engine(nil), t.engines...) }

// Index returns the index of the named engine and whether it is in the table.
func (t *Table) Index(name string) (int, bool) {
	i, ok := t.index[name]
	return i, ok
}

// Slots returns the number of slots, or 0 when no engine has positive weight.
func (t *Table) Slots() int { return len(t.slots) }

// Weight returns the total weight of the table's engines; 1 − Weight is the
// shed fraction of the snapshot.
func (t *Table) Weight() float64 { return t.weight }

// Share returns the fraction of slots, hence of uniformly spread keys, that
// engine i owns; it approximates Engine(i).Weight / Weight().
func (t *Table) Share(i int) float64 { return t.share[i] }
