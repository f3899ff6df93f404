package selection

import (
	"errors"
	"fmt"
)

var errSlotEngine = errors.New("slot refers to no engine with positive weight")

// NewTableFromSlots builds a table whose slots are given: slots[s] is an
// index into engines, the engine that owns slot s (AssignSlots
// computes them; a snapshot carries them). Pick, Primary and Candidates work as for
// NewTable: a key picks the slot given by its top bits, and its spill and
// retry candidates are the owners of a key-derived probe sequence of other
// slots. Engines' weights set the bounded-load limits and which engines are
// eligible when probing finds none; engines with positive weight may own no
// slot.
//
// Engines are checked as by NewTable. It also fails when len(slots) is not
// a power of two in [1, MaxAssignedSlots], when a slot refers to an index
// out of range or to an engine whose weight is zero, or when there are more
// than 65,536 engines. opts.Slots and opts.Seed are ignored. With no slots
// and no positive weight the table is valid and picks nothing.
//
// The result depends only on the (name, weight) pairs and on slots as a
// mapping from slot to engine name: not on the order of engines.
func NewTableFromSlots(engines []Engine, slots []uint16, opts TableOptions) (*Table, error) {
	m := len(slots)
	if m > MaxAssignedSlots || (m > 0 && m&(m-1) != 0) {
		return nil, fmt.Errorf("router: new table from slots: %d slots is not a power of two in [1, %d]", m, MaxAssignedSlots)
	}
	if len(engines) > 1<<16 {
		return nil, fmt.Errorf("router: new table from slots: %d engines, at most %d", len(engines), 1<<16)
	}
	t, err := newTableBase(engines, opts)
	if err != nil {
		return nil, fmt.Errorf("router: new table from slots: %w", err)
	}
	if m == 0 {
		if len(t.active) > 0 {
			return nil, errors.New("router: new table from slots: no slots but engines with positive weight")
		}
		return t, nil
	}
	// t.engines is engines sorted by name; map input indexes onto it.
	sorted := make([]uint32, len(engines))
	for i, e := range engines {
		sorted[i] = uint32(t.index[e.Name])
	}
	t.slots = make([]uint32, m)
	for s, j := range slots {
		if int(j) >= len(engines) || engines[j].Weight <= 0 {
			return nil, fmt.Errorf("router: new table from slots: slot %d: engine index %d: %w", s, j, errSlotEngine)
		}
		t.slots[s] = sorted[j]
	}
	t.finishSlots()
	return t, nil
}
