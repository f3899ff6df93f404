// Package control holds the router's clients of the control plane: the
// snapshot store that watches the optimizer's weight snapshots and builds
// each model's selection table from them (or from the local policy when
// they are missing or stale), the live engine signals it folds into
// endpoints, down and silent marks, and the reporter that publishes what
// the router saw, with the one classification of forwarding outcomes
// (Result, StatusResult) that ejection, retries and reports share.
//
// It depends on router/selection for the tables and on nothing of the
// router's fronts: the router imports it, never the other way round.
package control
