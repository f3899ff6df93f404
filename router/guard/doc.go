// Package guard holds the router's request guards that need no I/O: the
// router-wide retry budget (RetryBudget) and its amplification window
// (AmpWindow), the snapshot's figures for the guards (Figures, FiguresOf),
// shedding by priority and key (ShedFractions, KeyUnit, RelaxedShed,
// PriorityMix) and the admission allotments (Allotment,
// CapacityAllotment). Every reader of the clock takes it as an argument or
// a constructor's now, so the simulator runs the same rules on its own
// time as the router does on the wall clock.
package guard
