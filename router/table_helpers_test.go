package router

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/live"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/services/enginesim"
	"github.com/switchyard-dev/switchyard/testenv"
)

func mustTable(t testing.TB, engines []selection.Engine, opts selection.TableOptions) *selection.Table {
	t.Helper()
	tbl, err := selection.NewTable(engines, opts)
	if err != nil {
		t.Fatalf("NewTable(%d engines): %v", len(engines), err)
	}
	return tbl
}

// simTables starts a simulated engine per opts and returns static tables
// (in snapshot mode) that serve model on them, with equal weights and each
// engine's served name.
func simTables(t testing.TB, model string, opts ...enginesim.Options) *StaticTables {
	t.Helper()
	engines := make([]selection.Engine, 0, len(opts))
	for _, o := range opts {
		o.Model = model
		e := testenv.StartEngine(t, o)
		engines = append(engines, selection.Engine{Name: o.Name, URL: e.URL(), ServedModel: o.ServedModel, Weight: 1 / float64(len(opts))})
	}
	tables := NewStaticTables()
	tables.Set(model, mustTable(t, engines, selection.TableOptions{}), control.Info{Mode: control.ModeSnapshot})
	return tables
}

// engineSet builds engines e0..e(n-1) with the given weights.
func engineSet(weights []float64) []selection.Engine {
	es := make([]selection.Engine, len(weights))
	for i, w := range weights {
		es[i] = selection.Engine{Name: fmt.Sprintf("e%d", i), URL: fmt.Sprintf("http://e%d", i), Weight: w}
	}
	return es
}

func keyHashes(n int) []uint64 {
	ks := make([]uint64, n)
	for i := range ks {
		ks[i] = selection.HashString(fmt.Sprintf("conversation-%d", i))
	}
	return ks
}

func randomWeights(r *rand.Rand, n int, total float64) []float64 {
	w := make([]float64, n)
	sum := 0.0
	for i := range w {
		w[i] = r.ExpFloat64()
		sum += w[i]
	}
	for i := range w {
		w[i] *= total / sum
	}
	return w
}

// slotTable builds a table from snapshot slots over es, as a router does
// (selection.AssignSlots with SlotCount's slot count, NewTableFromSlots).
func slotTable(t testing.TB, es []selection.Engine) *selection.Table {
	t.Helper()
	var names []string
	var ws []float64
	for _, e := range es {
		if e.Weight > 0 {
			names, ws = append(names, e.Name), append(ws, e.Weight)
		}
	}
	tbl, err := selection.NewTableFromSlots(es, selection.AssignSlots(nil, nil, names, ws, selection.SlotCount(len(names))), selection.TableOptions{})
	if err != nil {
		t.Fatalf("NewTableFromSlots: %v", err)
	}
	return tbl
}

func mustRecent(t testing.TB, size int) *selection.RecentKeys {
	t.Helper()
	rk, err := selection.NewRecentKeys(size)
	if err != nil {
		t.Fatal(err)
	}
	return rk
}

// TestPickLiveAllocs: a pick under the live guard, with its acquire and
// release, allocates nothing, from a table of weights and from a snapshot's
// slot table alike; on a table with no engine of weight it finds none.
func TestPickLiveAllocs(t *testing.T) {
	slotted := func(t *testing.T, es []selection.Engine) *selection.Table {
		var names []string
		var ws []float64
		for _, e := range es {
			if e.Weight > 0 {
				names, ws = append(names, e.Name), append(ws, e.Weight)
			}
		}
		tbl, err := selection.NewTableFromSlots(es, selection.AssignSlots(nil, nil, names, ws, selection.SlotCount(len(names))), selection.TableOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tbl
	}
	weighted := func(t *testing.T, es []selection.Engine) *selection.Table {
		return mustTable(t, es, selection.TableOptions{})
	}
	for _, c := range []struct {
		name  string
		build func(*testing.T, []selection.Engine) *selection.Table
		es    []selection.Engine
		empty bool
	}{
		{"weights", weighted, engineSet(randomWeights(rand.New(rand.NewPCG(5, 6)), 100, 1)), false},
		{"slots", slotted, engineSet([]float64{0.45, 0.3, 0.15, 0.05, 0}), false},
		{"none", weighted, nil, true},
		{"zero-weight", weighted, []selection.Engine{{Name: "a", Weight: 0}}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			tbl := c.build(t, c.es)
			b := live.NewLiveSet(nil).Bind(tbl)
			if c.empty {
				if _, ok := tbl.Pick(1, b); ok {
					t.Fatalf("guarded Pick on table %v succeeded, want none", c.es)
				}
				return
			}
			var seq uint64
			if allocs := testing.AllocsPerRun(1000, func() {
				seq++
				i, _ := tbl.Pick(selection.SpreadKey(seq), b)
				b.Acquire(i)
				b.Release(i)
			}); allocs != 0 {
				t.Fatalf("Pick allocates %.1f times per call", allocs)
			}
		})
	}
}
