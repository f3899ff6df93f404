package dashboard

import (
	"cmp"
	"slices"
	"time"

	"github.com/switchyard-dev/switchyard/internal/enginestate"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/optimizer"
	"github.com/switchyard-dev/switchyard/streams"
)

// State is the body of GET /api/state.
type State struct {
	// TimeMs is when the state was taken, Unix milliseconds.
	TimeMs int64 `json:"time_ms"`
	// Connected says whether the NATS connection is up.
	Connected bool `json:"connected"`
	// Watching says, per bucket, whether its watcher has delivered the
	// bucket's current values and is following it.
	Watching map[string]bool `json:"watching"`
	// Models holds one entry per model seen in any bucket, sorted by name.
	Models []ModelState `json:"models"`
	// Routers holds the status of the routers in this process (from
	// Options.Routers), sorted by cluster, router and model.
	Routers []RouterStatus `json:"routers"`
}

// ModelState is everything the dashboard knows about one model.
type ModelState struct {
	// Model is the model's name.
	Model string `json:"model"`
	// Clusters lists the frontend clusters seen in snapshots or demand, sorted.
	Clusters []string `json:"clusters"`
	// Engines lists the engines seen in snapshots or engine states, sorted.
	Engines []string `json:"engines"`
	// Snapshots holds the newest weight snapshot of each cluster that has one,
	// sorted by cluster: the rows of the weights matrix.
	Snapshots []SnapshotView `json:"snapshots"`
	// EngineStates holds each engine's state from sy_engines, sorted by engine.
	EngineStates []EngineView `json:"engine_states"`
	// Demand holds each cluster's demand from sy_demand, sorted by cluster.
	Demand []ClusterDemand `json:"demand"`
}

// SnapshotView is one weight snapshot, as stored in sy_weights.
type SnapshotView struct {
	// Cluster is the frontend cluster.
	Cluster string `json:"cluster"`
	// Generation is the snapshot's generation.
	Generation uint64 `json:"generation"`
	// TimeMs is when the optimizer computed it, Unix milliseconds.
	TimeMs int64 `json:"time_ms"`
	// AgeSeconds is the snapshot's age when the state was taken.
	AgeSeconds float64 `json:"age_s"`
	// Weights is the fraction of the cluster's traffic per engine.
	Weights map[string]float64 `json:"weights"`
	// ShedFraction is the fraction of the cluster's demand to shed.
	ShedFraction float64 `json:"shed_fraction"`
	// DemandRPS is the demand the snapshot was computed for, req/s.
	DemandRPS float64 `json:"demand_rps"`
	// Utilisation is each engine's predicted load over its effective capacity.
	Utilisation map[string]float64 `json:"utilisation,omitempty"`
	// LatencyMs is each engine's predicted latency from this cluster, ms.
	LatencyMs map[string]float64 `json:"latency_ms,omitempty"`
	// Gap is the solver's relative optimality gap.
	Gap float64 `json:"gap"`
	// Writer names the optimizer instance that wrote it.
	Writer string `json:"writer,omitempty"`
}

// EngineView is one engine's state, as the aggregator stored it in
// sy_engines, with the fast (about one second) EWMA of each signal, and
// the state operators are shown (enginestate.Of over the engine state and
// its penalty and operator records).
type EngineView struct {
	// Engine and Region name the engine.
	Engine string `json:"engine"`
	Region string `json:"region,omitempty"`
	// Verdict is the engine's state (state, detail, error and timeout
	// rates, multiplier, until_ms, reason), the one shown everywhere.
	enginestate.Verdict
	// Status is the aggregator's liveness: "up", "stale" or "down".
	Status string `json:"status"`
	// Health is the engine's reported health, 0..1.
	Health float64 `json:"health"`
	// CapacityRPS is the engine's reported capacity, req/s.
	CapacityRPS float64 `json:"capacity_rps"`
	// EffectiveCapacityRPS is the capacity the optimizer plans with:
	// capacity × health, halved again (optimizer.StaleHealthFactor) when
	// stale, and 0 when down.
	EffectiveCapacityRPS float64 `json:"effective_capacity_rps"`
	// LoadRPS is the arrival rate (fast EWMA), req/s; LoadSlowRPS the slow one.
	LoadRPS     float64 `json:"load_rps"`
	LoadSlowRPS float64 `json:"load_slow_rps"`
	// Utilisation is LoadRPS over EffectiveCapacityRPS (0 when that is 0).
	Utilisation float64 `json:"utilisation"`
	// Queue and Running are the waiting and running requests (fast EWMA).
	Queue   float64 `json:"queue"`
	Running float64 `json:"running"`
	// KVUse is the KV-cache use, 0..1 (fast EWMA).
	KVUse float64 `json:"kv_use"`
	// TTFTMs and TBTMs are the time to first token and between tokens, ms
	// (fast EWMA).
	TTFTMs float64 `json:"ttft_ms"`
	TBTMs  float64 `json:"tbt_ms"`
	// Replicas is the number of ready replicas.
	Replicas int `json:"replicas"`
	// SignalAgeSeconds is the age of the newest signal folded in; negative
	// when the state has none.
	SignalAgeSeconds float64 `json:"signal_age_s"`
}

// ClusterDemand is one frontend cluster's demand, as the aggregator stored it
// in sy_demand (fast EWMAs).
type ClusterDemand struct {
	// Cluster is the frontend cluster.
	Cluster string `json:"cluster"`
	// RPS, ShedRPS and RetryRPS are the request, shed and retry rates, per second.
	RPS      float64 `json:"rps"`
	ShedRPS  float64 `json:"shed_rps"`
	RetryRPS float64 `json:"retry_rps"`
	// ShedRatio and RetryRatio are ShedRPS and RetryRPS over RPS (0 when RPS is 0).
	ShedRatio  float64 `json:"shed_ratio"`
	RetryRatio float64 `json:"retry_ratio"`
	// AgeSeconds is the age of the newest report folded in; negative when none.
	AgeSeconds float64 `json:"age_s"`
	// Routers lists the routers reporting for the cluster, sorted by name.
	Routers []ReportingRouter `json:"routers"`
}

// ReportingRouter is one router's share of a cluster's demand.
type ReportingRouter struct {
	// Router is the router's name.
	Router string `json:"router"`
	// RPS, ShedRPS and RetryRPS are its request, shed and retry rates (fast EWMA).
	RPS      float64 `json:"rps"`
	ShedRPS  float64 `json:"shed_rps"`
	RetryRPS float64 `json:"retry_rps"`
	// ReportAgeSeconds is the age of its newest report.
	ReportAgeSeconds float64 `json:"report_age_s"`
}

// History is the body of GET /api/history.
type History struct {
	// IntervalSeconds is the time between samples.
	IntervalSeconds float64 `json:"interval_s"`
	// WindowSeconds is how far back the history reaches.
	WindowSeconds float64 `json:"window_s"`
	// Samples are the samples, oldest first.
	Samples []Sample `json:"samples"`
}

// Sample is the state at one instant, for the charts.
type Sample struct {
	// TimeMs is when the sample was taken, Unix milliseconds.
	TimeMs int64 `json:"t"`
	// Weights is model → cluster → engine → weight.
	Weights map[string]map[string]map[string]float64 `json:"weights"`
	// Shed is model → cluster → shed fraction.
	Shed map[string]map[string]float64 `json:"shed"`
	// LoadRPS is model → engine → load (fast EWMA), req/s.
	LoadRPS map[string]map[string]float64 `json:"load_rps"`
	// CapacityRPS is model → engine → effective capacity, req/s.
	CapacityRPS map[string]map[string]float64 `json:"capacity_rps"`
}

// effectiveCapacity is the capacity the optimizer plans with for st.
func effectiveCapacity(st *messages.EngineState) float64 {
	if st.ServedOnOutcomes(time.Now(), messages.OutcomeEvidenceAge) {
		return st.CapacityRPS * st.Health // silent, but served on routers' outcomes
	}
	switch st.Status {
	case messages.StatusDown:
		return 0
	case messages.StatusStale:
		return st.CapacityRPS * st.Health * optimizer.StaleHealthFactor
	}
	return st.CapacityRPS * st.Health
}

func ratio(a, b float64) float64 {
	if b > 0 {
		return a / b
	}
	return 0
}

func ageSeconds(now time.Time, ms int64) float64 {
	if ms == 0 {
		return -1
	}
	return float64(now.UnixMilli()-ms) / 1000
}

// State returns the current state, as served on /api/state.
func (d *Dashboard) State() State {
	now := d.opts.Now()
	st := State{TimeMs: now.UnixMilli(), Connected: d.opts.Conn.IsConnected(), Watching: map[string]bool{},
		Models: []ModelState{}, Routers: []RouterStatus{}}
	d.mu.Lock()
	for _, b := range []string{d.opts.Names.WeightsBucket, d.opts.Names.EnginesBucket, d.opts.Names.DemandBucket} {
		st.Watching[b] = d.watching[b]
	}
	models := map[string]*modelAcc{}
	get := func(m string) *modelAcc {
		a := models[m]
		if a == nil {
			a = &modelAcc{clusters: map[string]bool{}, engines: map[string]bool{}}
			models[m] = a
		}
		return a
	}
	for _, s := range d.weights {
		a := get(s.Model)
		a.clusters[s.Cluster] = true
		for e := range s.Weights {
			a.engines[e] = true
		}
		a.ms.Snapshots = append(a.ms.Snapshots, SnapshotView{Cluster: s.Cluster, Generation: s.Generation, TimeMs: s.Time,
			AgeSeconds: ageSeconds(now, s.Time), Weights: s.Weights, ShedFraction: s.ShedFraction, DemandRPS: s.DemandRPS,
			Utilisation: s.Utilisation, LatencyMs: s.LatencyMs, Gap: s.Gap, Writer: s.Writer})
	}
	for _, e := range d.engines {
		a := get(e.Model)
		a.engines[e.Engine] = true
		eff := effectiveCapacity(e)
		a.ms.EngineStates = append(a.ms.EngineStates, EngineView{Engine: e.Engine, Region: e.Region,
			Verdict: d.verdictLocked(e, now), Status: e.Status,
			Health: e.Health, CapacityRPS: e.CapacityRPS, EffectiveCapacityRPS: eff, LoadRPS: e.LoadRPS.Fast,
			LoadSlowRPS: e.LoadRPS.Slow, Utilisation: ratio(e.LoadRPS.Fast, eff), Queue: e.Queue.Fast,
			Running: e.Running.Fast, KVUse: e.KVUse.Fast, TTFTMs: e.TTFTMs.Fast, TBTMs: e.TBTMs.Fast,
			Replicas: e.Replicas, SignalAgeSeconds: ageSeconds(now, e.LastSignal)})
	}
	for _, dm := range d.demand {
		a := get(dm.Model)
		a.clusters[dm.Cluster] = true
		cd := ClusterDemand{Cluster: dm.Cluster, RPS: dm.RPS.Fast, ShedRPS: dm.ShedRPS.Fast, RetryRPS: dm.RetryRPS.Fast,
			ShedRatio: ratio(dm.ShedRPS.Fast, dm.RPS.Fast), RetryRatio: ratio(dm.RetryRPS.Fast, dm.RPS.Fast),
			AgeSeconds: ageSeconds(now, dm.LastReport), Routers: []ReportingRouter{}}
		for name, r := range dm.Routers {
			cd.Routers = append(cd.Routers, ReportingRouter{Router: name, RPS: r.RPS.Fast, ShedRPS: r.ShedRPS.Fast,
				RetryRPS: r.RetryRPS.Fast, ReportAgeSeconds: ageSeconds(now, r.LastReport)})
		}
		slices.SortFunc(cd.Routers, func(x, y ReportingRouter) int { return cmp.Compare(x.Router, y.Router) })
		a.ms.Demand = append(a.ms.Demand, cd)
	}
	d.mu.Unlock()

	for _, name := range sortedKeys(models) {
		a := models[name]
		ms := a.ms
		ms.Model = name
		ms.Clusters = sortedKeys(a.clusters)
		ms.Engines = sortedKeys(a.engines)
		ms.Snapshots = nonNil(ms.Snapshots)
		ms.EngineStates = nonNil(ms.EngineStates)
		ms.Demand = nonNil(ms.Demand)
		slices.SortFunc(ms.Snapshots, func(x, y SnapshotView) int { return cmp.Compare(x.Cluster, y.Cluster) })
		slices.SortFunc(ms.EngineStates, func(x, y EngineView) int { return cmp.Compare(x.Engine, y.Engine) })
		slices.SortFunc(ms.Demand, func(x, y ClusterDemand) int { return cmp.Compare(x.Cluster, y.Cluster) })
		st.Models = append(st.Models, ms)
	}
	if d.opts.Routers != nil {
		st.Routers = append(st.Routers, d.opts.Routers()...)
		slices.SortFunc(st.Routers, func(x, y RouterStatus) int {
			return cmp.Or(cmp.Compare(x.Cluster, y.Cluster), cmp.Compare(x.Router, y.Router), cmp.Compare(x.Model, y.Model))
		})
	}
	return st
}

// verdictLocked is the engine's state from e and its penalty and operator
// records; d.mu is held.
func (d *Dashboard) verdictLocked(e *messages.EngineState, now time.Time) enginestate.Verdict {
	return enginestate.Of(enginestate.Input{State: e, Penalty: d.penalties[streams.JoinKey(e.Model, e.Engine)],
		Operator: d.operators[e.Engine], Now: now})
}

type modelAcc struct {
	clusters, engines map[string]bool
	ms                ModelState
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// sample appends the current weights and engine loads to the history ring.
func (d *Dashboard) sample() {
	now := d.opts.Now()
	s := Sample{TimeMs: now.UnixMilli(), Weights: map[string]map[string]map[string]float64{},
		Shed: map[string]map[string]float64{}, LoadRPS: map[string]map[string]float64{},
		CapacityRPS: map[string]map[string]float64{}}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, w := range d.weights {
		if s.Weights[w.Model] == nil {
			s.Weights[w.Model] = map[string]map[string]float64{}
			s.Shed[w.Model] = map[string]float64{}
		}
		s.Weights[w.Model][w.Cluster] = w.Weights // snapshots are never modified once stored
		s.Shed[w.Model][w.Cluster] = w.ShedFraction
	}
	for _, e := range d.engines {
		if s.LoadRPS[e.Model] == nil {
			s.LoadRPS[e.Model] = map[string]float64{}
			s.CapacityRPS[e.Model] = map[string]float64{}
		}
		s.LoadRPS[e.Model][e.Engine] = e.LoadRPS.Fast
		s.CapacityRPS[e.Model][e.Engine] = effectiveCapacity(e)
	}
	d.ring[d.next] = s
	d.next++
	if d.next == len(d.ring) {
		d.next, d.full = 0, true
	}
}

// History returns the samples taken after sinceMs (Unix ms; 0 for all),
// oldest first, as served on /api/history.
func (d *Dashboard) History(sinceMs int64) History {
	h := History{IntervalSeconds: d.opts.SampleInterval.Seconds(), WindowSeconds: d.opts.History.Seconds(), Samples: []Sample{}}
	d.mu.Lock()
	defer d.mu.Unlock()
	var ordered []Sample
	if d.full {
		ordered = append(ordered, d.ring[d.next:]...)
	}
	ordered = append(ordered, d.ring[:d.next]...)
	for _, s := range ordered {
		if s.TimeMs > sinceMs {
			h.Samples = append(h.Samples, s)
		}
	}
	return h
}
