package optimizersvc

import (
	"sort"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/selection"
)

// withSlots sets snap's selection table (SlotEngines, Slots), computed by
// selection.AssignSlots from prev's table — prev is the snapshot of the key
// this instance last read or wrote, nil when none — so that routers move
// only the keys the weight change requires. The engines are those of
// positive weight, by name; the slot count is selection.SlotCount of their
// number, but never less than prev's: halving a table would move up to
// half the keys. With no positive weight snap gets no table.
func withSlots(snap, prev *messages.WeightSnapshot) {
	snap.SlotEngines, snap.Slots = nil, nil
	names := make([]string, 0, len(snap.Weights))
	for e, w := range snap.Weights {
		if w > 0 {
			names = append(names, e)
		}
	}
	if len(names) == 0 {
		return
	}
	sort.Strings(names)
	weights := make([]float64, len(names))
	for i, e := range names {
		weights[i] = snap.Weights[e]
	}
	slots := selection.SlotCount(len(names))
	var prevIdx []uint16
	var prevNames []string
	if prev != nil && len(prev.Slots) > 0 {
		if idx, err := selection.DecodeSlots(prev.Slots); err == nil {
			prevIdx, prevNames = idx, prev.SlotEngines
			slots = max(slots, len(idx))
		}
	}
	slots = min(slots, messages.MaxSnapshotSlots, selection.MaxAssignedSlots)
	idx := selection.AssignSlots(prevIdx, prevNames, names, weights, slots)
	if idx == nil {
		return
	}
	snap.SlotEngines, snap.Slots = names, selection.EncodeSlots(idx)
}
