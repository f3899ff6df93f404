package router

import (
	"sort"
	"sync"

	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/selection"
)

// StaticTables is a Tables held in memory and set by hand: for tests,
// single-process setups and as the local-policy fallback's holder. It is
// safe for concurrent use.
type StaticTables struct {
	mu     sync.RWMutex
	tables map[string]staticEntry
}

type staticEntry struct {
	table *selection.Table
	info  control.Info
}

// NewStaticTables returns an empty StaticTables.
func NewStaticTables() *StaticTables { return &StaticTables{tables: make(map[string]staticEntry)} }

// Set installs t with info for model, replacing any previous table.
func (s *StaticTables) Set(model string, t *selection.Table, info control.Info) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tables[model] = staticEntry{table: t, info: info}
}

// Delete stops serving model.
func (s *StaticTables) Delete(model string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.tables, model)
}

// Table returns the table installed for model.
func (s *StaticTables) Table(model string) (*selection.Table, control.Info, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e, ok := s.tables[model]
	return e.table, e.info, ok
}

// Models returns the served models, sorted.
func (s *StaticTables) Models() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]string, 0, len(s.tables))
	for m := range s.tables {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}
