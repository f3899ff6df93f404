package router

import (
	"strings"
	"testing"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/guard"
	"github.com/switchyard-dev/switchyard/router/httpfront"
)

// TestUnplannedShedSaysSo: a snapshot that names no engine for the cluster
// (none up, or none of a known latency from it) sheds with an answer that
// says so, not "overloaded", and counts under its own reason.
func TestUnplannedShedSaysSo(t *testing.T) {
	figs := guard.FiguresOf(&messages.WeightSnapshot{ShedFraction: 1})
	if !figs.Unplanned {
		t.Fatal("a snapshot with no engine and shed 1 is not Unplanned")
	}
	if guard.FiguresOf(&messages.WeightSnapshot{ShedFraction: 1, Weights: map[string]float64{"e0": 0}}).Unplanned {
		t.Fatal("a snapshot naming an engine (of weight 0) is Unplanned")
	}
	f := newPFront(t, httpfront.ServerStd, []int32{modeOK}, []float64{1}, figs, Options{Cluster: "A"})
	r := f.do(streamBody("x"), nil)
	if r.status != 429 || !strings.Contains(r.body, `"no_engine_planned"`) || !strings.Contains(r.body, `cluster \"A\"`) ||
		strings.Contains(r.body, "overloaded") {
		t.Fatalf("unplanned shed: %d %s, want 429 no_engine_planned naming cluster A", r.status, r.body)
	}
	if n := f.engines[0].count(); n != 0 {
		t.Fatalf("engine called %d times for a shed request", n)
	}
}
