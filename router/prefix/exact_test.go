package prefix

import (
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/kvindex"
)

// TestPickExact: the engine-exact index's holders come first, what the
// router routed is the fallback when it names no engine of the table, and
// a nil index is Pick.
func TestPickExact(t *testing.T) {
	x, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	exact, err := kvindex.New(kvindex.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tbl, g := table(t, 4), newGuard(4)
	keys := keysOf(7, 3)
	x.Routed("e1", keys, time.Unix(1000, 0)) // the router believes e1 holds it

	check := func(what string, exact *kvindex.Index, want string, wantExact bool) {
		t.Helper()
		i, ok, fromExact := x.PickExact(exact, tbl, g, 42, keys)
		if !ok || tbl.Engine(i).Name != want || fromExact != wantExact {
			t.Fatalf("%s: picked %s (ok %v, from the exact index %v), want %s (from it %v)", what, tbl.Engine(i).Name, ok, fromExact, want, wantExact)
		}
	}
	check("no exact index", nil, "e1", false)
	check("an exact index that knows nothing", exact, "e1", false)
	if err := exact.Store("e3", keys); err != nil { // e1 evicted it, e3 holds it
		t.Fatal(err)
	}
	check("e3 reports it", exact, "e3", true)
	exact.Clear("e3")
	if err := exact.Store("gone", keys); err != nil { // an engine the table does not have
		t.Fatal(err)
	}
	check("only an engine outside the table reports it", exact, "e1", false)
	if err := exact.Store("e2", keys[:6]); err != nil { // the system prompt only
		t.Fatal(err)
	}
	check("e2 reports the shared prefix", exact, "e2", true)
	if n := testing.AllocsPerRun(100, func() { x.PickExact(exact, tbl, g, 42, keys) }); n != 0 {
		t.Errorf("PickExact allocates %v times, want none", n)
	}
}
