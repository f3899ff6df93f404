package sim

import (
	"math"
	"slices"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/optimizer"
	"github.com/switchyard-dev/switchyard/plan"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/sim/scenario"
)

// remapKeys is how many fixed keys measure key movement between tables.
const remapKeys = 2048

// clusterTable is a router's installed selection table.
type clusterTable struct {
	t       *selection.Table
	toSim   []int     // table index → engine index
	weights []float64 // by engine index
	shed    float64
	lastDir []int8 // by engine index: sign of the last significant weight move
}

// loopGuard is the feedback loop's view of its table's engines: the
// simulator's own down marks and in-flight counts.
type loopGuard struct {
	r     *run
	c     int
	toSim []int
}

func (g *loopGuard) Down(i int) bool      { return g.r.down(g.c, g.toSim[i]) }
func (g *loopGuard) InFlight(i int) int64 { return int64(g.r.inflight[g.c][g.toSim[i]]) }
func (g *loopGuard) TotalInFlight() int64 { return int64(g.r.totalIn[g.c]) }

// tables is the weighted-table machinery shared by switchyard and the
// feedback loop: one selection.Table per cluster, rebuilt when weights change.
type tables struct {
	slots   int
	epsilon float64
	cur     []*clusterTable
	guards  []loopGuard
	keys    []uint64
}

func (ts *tables) setup(r *run, slots int, epsilon float64) {
	ts.slots, ts.epsilon = slots, epsilon
	ts.cur = make([]*clusterTable, len(r.f.clusters))
	ts.guards = make([]loopGuard, len(r.f.clusters))
	ts.keys = make([]uint64, remapKeys)
	for k := range ts.keys {
		ts.keys[k] = selection.Mix64(uint64(k) + 0x1234_5678)
	}
}

// install builds cluster c's table from weights (by engine index), planned
// utilisations (by engine index; nil when there is no plan) and shed
// fraction, records key movement and weight reversals, and installs it.
func (ts *tables) install(r *run, c int, weights, util []float64, shed float64) {
	entries := make([]selection.Engine, 0, len(weights))
	sum := 0.0
	for j, w := range weights {
		w = math.Max(0, math.Min(1, w))
		if w < 1e-9 {
			w = 0
		}
		weights[j] = w
		sum += w
	}
	if sum > 1 {
		for j := range weights {
			weights[j] /= sum
		}
	}
	for j, w := range weights {
		e := selection.Engine{Name: r.f.engines[j].name, Weight: w}
		if util != nil {
			e.Utilisation = util[j]
		}
		entries = append(entries, e)
	}
	t, err := selection.NewTable(entries, selection.TableOptions{Slots: ts.slots, Epsilon: ts.epsilon})
	if err != nil {
		panic("sim: selection.NewTable: " + err.Error()) // weights are clamped above; a failure is a bug
	}
	nt := &clusterTable{t: t, toSim: make([]int, t.Len()), weights: slices.Clone(weights), shed: shed, lastDir: make([]int8, len(weights))}
	byName := make(map[string]int, len(weights))
	for j := range r.f.engines {
		byName[r.f.engines[j].name] = j
	}
	for i := 0; i < t.Len(); i++ {
		nt.toSim[i] = byName[t.Engine(i).Name]
	}
	if old := ts.cur[c]; old != nil {
		copy(nt.lastDir, old.lastDir)
		moved := 0
		for _, k := range ts.keys {
			a, okA := old.t.Primary(k)
			b, okB := t.Primary(k)
			if okA != okB || (okA && old.toSim[a] != nt.toSim[b]) {
				moved++
			}
		}
		if r.now >= r.f.measureFrom && r.now < r.f.measureTo {
			r.m.weightUpdates++
			r.m.remappedSum += float64(moved) / float64(len(ts.keys))
			for j := range weights {
				d := weights[j] - old.weights[j]
				if math.Abs(d) <= 1e-3 {
					continue
				}
				dir := int8(1)
				if d < 0 {
					dir = -1
				}
				if nt.lastDir[j] != 0 && nt.lastDir[j] != dir {
					r.m.reversalsWeights++
				}
				nt.lastDir[j] = dir
			}
		}
	}
	ts.cur[c] = nt
	ts.guards[c] = loopGuard{r: r, c: c, toSim: nt.toSim}
}

// pick routes a request of cluster c with Table.Pick on the installed
// table, on the request's affinity key or on a spread key.
func (ts *tables) pick(r *run, c int, a *scenario.Arrival) int {
	ct := ts.cur[c]
	if ct == nil {
		return -1
	}
	key := a.Key
	if key == 0 {
		r.spreadSeq[c]++
		key = selection.SpreadKey(r.spreadSeq[c])
	}
	i, ok := ct.t.Pick(key, &ts.guards[c])
	if !ok {
		return -1
	}
	return ct.toSim[i]
}

// tvDistance is the total-variation distance between two weight vectors with shed fractions.
func tvDistance(a, b []float64, shedA, shedB float64) float64 {
	d := math.Abs(shedA - shedB)
	for j := range a {
		d += math.Abs(a[j] - b[j])
	}
	return d / 2
}

// switchyard is the shipped control and data plane on the run's signals:
// every control period the plan builder (plan) turns the engines' and
// clusters' states into the optimizer's problem, the optimizer solves it,
// and the plan builder renders each cluster's snapshot, installed when it
// moved by the dead band as the optimizer service writes it; each
// cluster's router routes through the router's own guards (guards.go).
type switchyard struct {
	tables
	g       guards
	solver  *optimizer.Solver
	prev    *optimizer.Solution
	fits    []*optimizer.BaseFit       // by engine: the optimizer service's latency fit
	last    []*messages.WeightSnapshot // by cluster: the installed snapshot
	targets plan.Targets
	hold    plan.DemandHold // the demand each cluster is planned for, as the optimizer service holds it
	network func(cluster, engine string) (float64, bool)
}

func (p *switchyard) init(r *run) {
	f := r.f
	o := f.sc.Policies.Switchyard
	p.setup(r, o.Slots, o.Epsilon)
	p.g.setup(r)
	// No time budget: a solve cut short by the machine's speed would make a
	// run depend on the machine, and the simulator's runs reproduce exactly.
	opt := optimizer.DefaultOptions()
	opt.TimeBudget = -1
	p.solver = optimizer.NewSolver(opt)
	p.fits = make([]*optimizer.BaseFit, len(f.engines))
	for j := range p.fits {
		p.fits[j] = optimizer.NewBaseFit(optimizer.FitOptions{})
	}
	p.last = make([]*messages.WeightSnapshot, len(f.clusters))
	p.targets = plan.Targets{Common: o.TargetUtilisation, PerEngine: map[string]float64{}}
	engineIdx := make(map[string]int, len(f.engines))
	for j := range f.engines {
		engineIdx[f.engines[j].name] = j
		if t := f.engines[j].typ.TargetUtilisation; t > 0 {
			p.targets.PerEngine[f.engines[j].name] = t
		}
	}
	clusterIdx := make(map[string]int, len(f.clusters))
	for c := range f.clusters {
		clusterIdx[f.clusters[c].name] = c
	}
	p.network = func(cluster, engine string) (float64, bool) {
		return f.rtt(clusterIdx[cluster], engineIdx[engine]), true
	}
	p.solve(r, false)
}

func (p *switchyard) control(r *run) { p.solve(r, true) }

func (p *switchyard) pick(r *run, c int, a *scenario.Arrival) int {
	if q := r.routing; r.reqs[q].tries > 0 {
		return p.g.retried(r, q)
	}
	return p.g.admitAndPick(r, c, r.routing, a)
}

func (p *switchyard) signalled(r *run) { p.g.signalled(r) }

func (p *switchyard) attemptEnded(r *run, q int32, outcome uint8) bool {
	return p.g.attemptEnded(r, q, outcome)
}

// engineState is engine j's state as the aggregator would write it from
// the run's signal windows at now (ms).
func engineState(r *run, j int, now int64) *messages.EngineState {
	s := &r.sig[j]
	st := &messages.EngineState{Model: simModel, Engine: r.f.engines[j].name, Region: r.f.engines[j].region, Time: now,
		Status: messages.StatusUp, CapacityRPS: s.capacity, Health: 1, BaseLatencyMs: s.idleMs,
		LoadRPS: s.load.Window, TTFTMs: s.ttft.Window, TBTMs: s.tbt.Window, OutputTokens: s.out.Window,
		PrefillWeight: r.f.engines[j].prefillWeight}
	if !s.up {
		st.Status = messages.StatusDown
	}
	return st
}

// solve plans from the run's signals with the plan builder, solves
// warm-started, and installs each cluster's snapshot that moved by the dead
// band or started or stopped shedding (plan.Distance), as the optimizer
// service writes them.
func (p *switchyard) solve(r *run, fit bool) {
	f := r.f
	in := plan.Input{Network: p.network, Targets: p.targets, MinDemandRPS: plan.DefaultMinDemandRPS}
	var idx []int // problem engine → engine index
	for j := range f.engines {
		st := engineState(r, j, int64(r.now))
		if fit {
			p.fits[j].Add(plan.FitSample(st), plan.FitPrior(st, plan.DefaultPriorBaseMs))
		}
		if st.Status == messages.StatusDown || !(st.CapacityRPS > 0) {
			continue
		}
		e := plan.EngineOf(st, st.Health, plan.BaseMs(p.fits[j], st, plan.DefaultPriorBaseMs))
		// The engine states its capacity for the mix it was calibrated on.
		e.PromptTokens, e.OutputTokens = f.engines[j].mixPrompt, f.engines[j].mixOutput
		in.Engines = append(in.Engines, e)
		idx = append(idx, j)
	}
	for c := range f.clusters {
		var d *messages.DemandState
		if dm := &r.demand[c]; dm.init {
			d = &messages.DemandState{Model: simModel, Cluster: f.clusters[c].name, RPS: dm.RPS, RPSVar: dm.RPSVar,
				PromptTPS: dm.PromptTPS, DoneRPS: dm.DoneRPS, OutputTPS: dm.OutputTPS}
			d = p.hold.Hold(f.clusters[c].name, d, int64(r.now))
		}
		in.Clusters = append(in.Clusters, plan.Cluster{Name: f.clusters[c].name, Demand: d})
	}
	p.hold.Sweep()
	if len(idx) == 0 {
		for c := range f.clusters {
			if ct := p.cur[c]; ct == nil || ct.shed < 1 {
				p.installSnapshot(r, c, &messages.WeightSnapshot{Model: simModel, Cluster: f.clusters[c].name, ShedFraction: 1})
			}
		}
		return
	}
	built := plan.Build(in)
	prob := built.Problem
	sol, err := p.solver.Solve(prob, p.prev)
	if err != nil {
		return // keep the installed tables, as the service does
	}
	optimizer.ShareShed(prob, sol)                               // as the service does by default
	optimizer.SplitTies(prob, sol, p.solver.Options().Tolerance) // as the service does
	p.prev = sol
	if r.now >= f.measureFrom && r.now < f.measureTo {
		for k, j := range idx {
			r.m.targetUtilSum[j] += sol.Engines[k].LoadRPS / (r.sig[j].capacity * built.EngineWork[k]) // of the whole capacity
		}
		r.m.targetUtilN++
	}
	band := max(p.solver.Options().DeadBand, 1e-9)
	for c := range f.clusters {
		snap := built.Snapshot(simModel, sol, c, p.targets)
		if old := p.last[c]; old != nil {
			if tv, flip := plan.Distance(old, snap); tv < band && !flip {
				continue
			}
		}
		p.installSnapshot(r, c, snap)
	}
}

// installSnapshot installs cluster c's snapshot: its table from the
// weights and planned utilisations, and its router's guards.
func (p *switchyard) installSnapshot(r *run, c int, snap *messages.WeightSnapshot) {
	n := len(r.f.engines)
	w, util := make([]float64, n), make([]float64, n)
	for j := range r.f.engines {
		name := r.f.engines[j].name
		w[j], util[j] = snap.Weights[name], snap.Utilisation[name]
	}
	p.install(r, c, w, util, snap.ShedFraction)
	p.g.bind(r, c, p.cur[c], snap)
	p.last[c] = snap
}

// feedbackLoop is the early feedback loop: each engine's measured latency,
// smoothed by an EWMA, plus the network round trip is a score; every
// control period each router nudges an engine's weight up or down in
// proportion to how much better or worse than the average its score is, and
// routes with weighted consistent hashing (selection.Table) on those weights.
type feedbackLoop struct {
	tables
	score []float64
	have  []bool
	w     [][]float64
}

func (p *feedbackLoop) init(r *run) {
	o := r.f.sc.Policies.Switchyard
	p.setup(r, o.Slots, o.Epsilon)
	ne := len(r.f.engines)
	p.score = make([]float64, ne)
	p.have = make([]bool, ne)
	p.w = make([][]float64, len(r.f.clusters))
	total := 0.0
	for j := range r.sig {
		total += r.sig[j].capacity
	}
	for c := range p.w {
		p.w[c] = make([]float64, ne)
		for j := range p.w[c] {
			p.w[c][j] = r.sig[j].capacity / total // operators start from capacity weights
		}
		p.install(r, c, slices.Clone(p.w[c]), nil, 0)
	}
}

func (p *feedbackLoop) pick(r *run, c int, a *scenario.Arrival) int { return p.tables.pick(r, c, a) }

func (p *feedbackLoop) control(r *run) {
	o := r.f.sc.Policies.FeedbackLoop
	for j := range r.sig {
		s := &r.sig[j]
		if !s.lastLatValid {
			continue
		}
		if !p.have[j] {
			p.score[j], p.have[j] = s.lastLat, true
		} else {
			p.score[j] += o.Alpha * (s.lastLat - p.score[j])
		}
	}
	const floor = 1e-3
	const maxNudge = 0.25 // at most ±25% per control period
	for c := range r.f.clusters {
		w := p.w[c]
		var avg float64
		n := 0
		for j := range w {
			if r.sig[j].up && p.have[j] {
				avg += p.score[j] + r.f.rtt(c, j)
				n++
			}
		}
		if n == 0 {
			continue
		}
		avg /= float64(n)
		sum := 0.0
		for j := range w {
			switch {
			case !r.sig[j].up:
				w[j] = 0
			case w[j] == 0:
				w[j] = 1 / float64(len(w)) // back from a failure
			case p.have[j] && avg > 0:
				step := o.Gain * (avg - (p.score[j] + r.f.rtt(c, j))) / avg
				w[j] *= 1 + math.Max(-maxNudge, math.Min(maxNudge, step))
			}
			w[j] = math.Max(w[j], 0)
			if r.sig[j].up {
				w[j] = math.Max(w[j], floor)
			}
			sum += w[j]
		}
		if sum <= 0 {
			continue
		}
		for j := range w {
			w[j] /= sum
		}
		if tvDistance(w, p.cur[c].weights, 0, 0) > 1e-3 {
			p.install(r, c, slices.Clone(w), nil, 0)
		}
	}
}
