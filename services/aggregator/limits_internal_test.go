package aggregator

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/internal/poison"
	"github.com/switchyard-dev/switchyard/messages"
)

// TestDemandStateWithMostRoutersEncodes: a demand state listing
// maxRoutersPerCluster routers, each with the longest name and every window
// at full precision, encodes within messages.MaxMessageSize, and their summed
// rates at messages.MaxRouterRate stay below messages.MaxRate.
func TestDemandStateWithMostRoutersEncodes(t *testing.T) {
	now := time.Now()
	w := messages.Window{Fast: math.Pi * 1e5, Slow: math.E * 1e5}
	st := messages.DemandState{Model: strings.Repeat("m", messages.MaxNameLen), Cluster: strings.Repeat("c", messages.MaxNameLen),
		Time: now.UnixMilli(), LastReport: now.UnixMilli(), Reports: math.MaxUint64, Routers: map[string]messages.RouterDemand{}}
	for i := range maxRoutersPerCluster {
		name := fmt.Sprintf("%0*d", messages.MaxNameLen, i)
		st.Routers[name] = messages.RouterDemand{LastReport: now.UnixMilli(), Seq: math.MaxUint64, RPS: w, ShedRPS: w, RetryRPS: w,
			PromptTPS: w, DoneRPS: w, OutputTPS: w, RPSVar: w,
			Priority: map[string]messages.Window{messages.PriorityCritical: w, messages.PriorityStandard: w, messages.PrioritySheddable: w}}
	}
	a := &Aggregator{opts: Options{DownAfter: time.Hour}}
	a.sumDemand(&st, now)
	st.RPSByPriority = map[string]messages.Window{messages.PriorityCritical: w, messages.PriorityStandard: w, messages.PrioritySheddable: w}
	data, err := messages.EncodeAt(&st, now)
	if err != nil {
		t.Fatalf("%d routers: %v", maxRoutersPerCluster, err)
	}
	t.Logf("%d routers: %d bytes of %d", maxRoutersPerCluster, len(data), messages.MaxMessageSize)
	if sum := maxRoutersPerCluster * messages.MaxRouterRate; sum > messages.MaxRate {
		t.Errorf("%d routers at %g req/s sum to %g, above %g", maxRoutersPerCluster, messages.MaxRouterRate, float64(sum), messages.MaxRate)
	}
}

// TestEncodeDemandDropsBadRouters: a demand state that does not encode
// because of one router's entry (an infinite rate, a time in 1970) is written
// without that entry, with the others' sum.
func TestEncodeDemandDropsBadRouters(t *testing.T) {
	now := time.Now()
	ms := now.UnixMilli()
	guard, err := poison.New(poison.Options{Component: "aggregator", Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	a := &Aggregator{opts: Options{DownAfter: time.Hour}, metrics: newMetrics(nil), guard: guard}
	st := messages.DemandState{Model: "llama", Cluster: "A", Time: ms, LastReport: ms, Routers: map[string]messages.RouterDemand{
		"good":   {LastReport: ms, Seq: 1, RPS: messages.Window{Fast: 20, Slow: 20}},
		"inf":    {LastReport: ms, Seq: 1, RPS: messages.Window{Fast: math.Inf(1), Slow: math.NaN()}},
		"epoch":  {LastReport: 1, Seq: 1, RPS: messages.Window{Fast: 1, Slow: 1}},
		"good-2": {LastReport: ms, Seq: 1, RPS: messages.Window{Fast: 5, Slow: 5}},
	}}
	a.sumDemand(&st, now)
	data, err := a.encodeDemand(&st, now)
	if err != nil {
		t.Fatalf("encodeDemand: %v", err)
	}
	var got messages.DemandState
	if err := messages.DecodeIntoAt(data, &got, now); err != nil {
		t.Fatal(err)
	}
	if len(got.Routers) != 2 || got.RPS.Fast != 25 {
		t.Fatalf("written %d routers at %v req/s, want the 2 good ones at 25", len(got.Routers), got.RPS.Fast)
	}
}
