package aggregator

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

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
