package control

import (
	"time"

	"github.com/switchyard-dev/switchyard/router/guard"
	"github.com/switchyard-dev/switchyard/router/selection"
)

// Mode says how a model's table was made.
type Mode string

// Table modes.
const (
	// ModeSnapshot: the table comes from a fresh optimizer snapshot.
	ModeSnapshot Mode = "snapshot"
	// ModeLocalPolicy: no snapshot yet, or a stale one; the table comes from
	// the router's local policy over live engine signals.
	ModeLocalPolicy Mode = "local-policy"
)

// Info describes the table installed for a model.
type Info struct {
	// Generation is the snapshot's generation (0 for a local-policy table
	// built before any snapshot).
	Generation uint64
	// Mode says where the table came from.
	Mode Mode
	// Created is when the optimizer produced the snapshot the table was built
	// from; the snapshot's age is measured from it. Zero when unknown.
	Created time.Time
	// Figures are the snapshot's shed fractions, demand and predictions for
	// the guards (shedding, admission, retry budget); nil when the table is
	// not routed by a fresh snapshot.
	Figures *guard.Figures
}

// Tables is the source of selection tables, one per model, for the router's
// own frontend cluster; the snapshot store implements it. Table must be
// cheap (an atomic load and a map lookup) as it is called on every request.
type Tables interface {
	// Table returns the table installed for model, its info, and whether the
	// model is served.
	Table(model string) (*selection.Table, Info, bool)
	// Models returns the served models.
	Models() []string
}
