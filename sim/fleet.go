package sim

import (
	"fmt"
	"math"

	"github.com/switchyard-dev/switchyard/batching"
	"github.com/switchyard-dev/switchyard/sim/scenario"
)

// fleet is a scenario compiled into indexes: what every policy run shares.
type fleet struct {
	sc       *scenario.Scenario
	engines  []engineDesc
	clusters []clusterDesc
	// oneWay[c][j] is the one-way network latency from cluster c to engine j, ms.
	oneWay [][]float64
	events []timedEvent
	// horizon is the time after which nothing is simulated, ms.
	horizon float64
	// measureFrom and measureTo bound the arrivals that count, ms.
	measureFrom, measureTo float64
}

type engineDesc struct {
	name, region string
	typ          *scenario.EngineType
	typeIdx      int
	// capacity is the calibrated saturation throughput at speed 1, req/s.
	capacity float64
	// idleMs is the calibrated engine-side latency of a lone request, ms.
	idleMs float64
	// mixPrompt and mixOutput are the mean tokens of the requests capacity
	// was calibrated on, and prefillWeight the type's prompt token cost in
	// output tokens at that mix (batching.Cost.PrefillWeight): what the
	// engine states with its capacity.
	mixPrompt, mixOutput, prefillWeight float64
}

type clusterDesc struct {
	name, region string
}

type evKind uint8

const (
	tFail evKind = iota
	tRecover
	tCapacity
	tDemand
)

type timedEvent struct {
	at      float64 // ms
	kind    evKind
	engines []int
	factor  float64
}

// compile builds the fleet of a validated scenario for arrivals ending at lastMs.
func compile(sc *scenario.Scenario, lastMs float64) (*fleet, error) {
	f := &fleet{sc: sc}
	typeIdx := map[string]int{}
	for k := range sc.EngineTypes {
		typeIdx[sc.EngineTypes[k].Name] = k
	}
	for k := range sc.Engines {
		e := &sc.Engines[k]
		for _, n := range e.Names() {
			ti := typeIdx[e.Type]
			f.engines = append(f.engines, engineDesc{name: n, region: e.Region, typ: &sc.EngineTypes[ti], typeIdx: ti})
		}
	}
	for k := range sc.Clusters {
		f.clusters = append(f.clusters, clusterDesc{name: sc.Clusters[k].Name, region: sc.Clusters[k].Region})
	}
	f.oneWay = make([][]float64, len(f.clusters))
	for c := range f.clusters {
		f.oneWay[c] = make([]float64, len(f.engines))
		for j := range f.engines {
			f.oneWay[c][j] = sc.Network.OneWayMs(f.clusters[c].region, f.engines[j].region)
		}
	}
	for _, ev := range sc.SortedEvents() {
		te := timedEvent{at: ev.AtS * 1000}
		var tg *scenario.Target
		switch {
		case ev.Fail != nil:
			te.kind, tg = tFail, ev.Fail
		case ev.Recover != nil:
			te.kind, tg = tRecover, ev.Recover
		case ev.Capacity != nil:
			te.kind, tg, te.factor = tCapacity, &ev.Capacity.Target, ev.Capacity.Factor
		default:
			te.kind = tDemand // applied to the arrivals; kept for the lower bound's phases
		}
		if tg != nil {
			for j := range f.engines {
				if f.engines[j].name == tg.Engine || (tg.Region != "" && f.engines[j].region == tg.Region) {
					te.engines = append(te.engines, j)
				}
			}
			if len(te.engines) == 0 {
				return nil, fmt.Errorf("sim: event at %gs selects no engine", ev.AtS)
			}
		}
		f.events = append(f.events, te)
	}
	end := sc.DurationS * 1000
	if end == 0 || lastMs >= end {
		end = math.Nextafter(lastMs, math.Inf(1)) // the last arrival counts
	}
	f.measureFrom = sc.WarmupS * 1000
	f.measureTo = end
	f.horizon = end + sc.DrainS*1000
	return f, nil
}

// engineCost returns the step-time model of an engine type.
func engineCost(t *scenario.EngineType) batching.Cost {
	return batching.Cost{PrefillMsPerToken: t.PrefillMsPerToken, TBTBaseMs: t.TBTBaseMs,
		TBTPerRequestMs: t.TBTPerRequestMs, TBTPerKTokenMs: t.TBTPerKTokenMs}
}

// anonBlocks is the number of anonymous KV blocks a request reserves: its
// output, plus its prompt when the prompt has no block names.
func anonBlocks(a *scenario.Arrival) int {
	n := int(a.Output)
	if len(a.Blocks) == 0 {
		n += int(a.Prompt)
	}
	return (n + 511) / 512
}

// rtt returns the round-trip network latency from cluster c to engine j.
func (f *fleet) rtt(c, j int) float64 { return 2 * f.oneWay[c][j] }

// nearestOrder returns cluster c's engines by increasing latency (stable).
func (f *fleet) nearestOrder(c int) []int {
	out := make([]int, len(f.engines))
	for j := range out {
		out[j] = j
	}
	for a := 1; a < len(out); a++ {
		for b := a; b > 0 && f.oneWay[c][out[b]] < f.oneWay[c][out[b-1]]; b-- {
			out[b], out[b-1] = out[b-1], out[b]
		}
	}
	return out
}
