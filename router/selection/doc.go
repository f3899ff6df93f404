// Package selection holds the pure parts of engine selection that more than
// the router needs: the weighted rendezvous slot table (RendezvousSlots),
// the minimal-movement slot assignment the optimizer service ships in every
// weight snapshot (AssignSlots, SlotCount, EncodeSlots, DecodeSlots), and
// the hashes that turn requests into selection keys (HashString, SpreadKey,
// Hasher, Mix64).
//
// It imports nothing of Switchyard, so the optimizer service and the
// simulator compute exactly what routers install without linking the
// router's HTTP stack.
package selection
