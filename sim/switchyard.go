package sim

import (
	"math"
	"slices"

	"github.com/switchyard-dev/switchyard/optimizer"
	"github.com/switchyard-dev/switchyard/router/selection"
)

// minDemandRPS is the optimizer service's demand floor.
const minDemandRPS = 1

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

// guard is a router's bounded-load and health view of its table's engines.
type guard struct {
	r     *run
	c     int
	toSim []int
}

func (g *guard) Down(i int) bool      { return g.r.down(g.c, g.toSim[i]) }
func (g *guard) InFlight(i int) int64 { return int64(g.r.inflight[g.c][g.toSim[i]]) }
func (g *guard) TotalInFlight() int64 { return int64(g.r.totalIn[g.c]) }

// Load is the router's view of the engine's load as router.Bound.Load
// computes it: the outstanding requests in the engine's last signal that
// other routers sent, plus this router's in-flight requests now, per batch
// slot.
func (g *guard) Load(i int) float64 { return g.r.routerLoad(g.c, g.toSim[i]) }

// tables is the weighted-table machinery shared by switchyard and the
// feedback loop: one selection.Table per cluster, rebuilt when weights change.
type tables struct {
	slots   int
	epsilon float64
	cur     []*clusterTable
	guards  []guard
	keys    []uint64
	recent  []*selection.RecentKeys // [cluster], switchyard only
}

func (ts *tables) setup(r *run, slots int, epsilon float64) {
	ts.slots, ts.epsilon = slots, epsilon
	ts.cur = make([]*clusterTable, len(r.f.clusters))
	ts.guards = make([]guard, len(r.f.clusters))
	ts.keys = make([]uint64, remapKeys)
	for k := range ts.keys {
		ts.keys[k] = mix(uint64(k) + 0x1234_5678)
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
	ts.guards[c] = guard{r: r, c: c, toSim: nt.toSim}
}

// pick routes a request of cluster c with the installed table: shed with the
// table's shed fraction, else Table.Pick on the request's affinity key or on
// a spread key. With two set (switchyard) a request with an affinity key
// goes through Table.PickRecent with the router's RecentKeys, and one without
// through Table.PickTwo.
func (ts *tables) pick(r *run, c int, a *Arrival, two bool) int {
	ct := ts.cur[c]
	if ct == nil {
		return -1
	}
	if ct.shed > 1e-9 && r.rng.Float64() < ct.shed {
		return -1
	}
	var i int
	var ok bool
	if key := a.Key; key != 0 {
		if two {
			i, ok = ct.t.PickRecent(key, &ts.guards[c], ts.recent[c])
		} else {
			i, ok = ct.t.Pick(key, &ts.guards[c])
		}
	} else {
		r.spreadSeq[c]++
		key = spreadKey(r.spreadSeq[c])
		if two {
			i, ok = ct.t.PickTwo(key, &ts.guards[c])
		} else {
			i, ok = ct.t.Pick(key, &ts.guards[c])
		}
	}
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

// switchyard is the real optimizer plus the real router selection, fed by
// the run's signals every control period.
type switchyard struct {
	tables
	solver *optimizer.Solver
	prev   *optimizer.Solution
	fits   []optimizer.BaseFit // by engine: the optimizer service's latency fit
}

// fitSample is the latency-fit sample of an engine's signal windows; it
// carries no time, since every control period folds in a new one.
func fitSample(s *engineSignal) optimizer.Sample {
	return optimizer.Sample{LoadRPS: s.load.Slow, CapacityRPS: s.capacity, TTFTMs: s.ttft.Slow, TBTMs: s.tbt.Slow, OutputTokens: s.out.Slow}
}

func (p *switchyard) init(r *run) {
	o := r.f.sc.Policies.Switchyard
	p.setup(r, o.Slots, o.Epsilon)
	p.recent = make([]*selection.RecentKeys, len(r.f.clusters))
	for c := range p.recent {
		rk, err := selection.NewRecentKeys(selection.DefaultRecentKeys)
		if err != nil {
			panic("sim: selection.NewRecentKeys: " + err.Error()) // a constant size; a failure is a bug
		}
		p.recent[c] = rk
	}
	// No time budget: a solve cut short by the machine's speed would make a
	// run depend on the machine, and the simulator's runs reproduce exactly.
	opt := optimizer.DefaultOptions()
	opt.TimeBudget = -1
	p.solver = optimizer.NewSolver(opt)
	p.fits = make([]optimizer.BaseFit, len(r.f.engines))
	p.solve(r, false)
}

func (p *switchyard) control(r *run) { p.solve(r, true) }

func (p *switchyard) pick(r *run, c int, a *Arrival) int { return p.tables.pick(r, c, a, true) }

// solve builds the problem from the signals, solves it warm-started, and
// installs the tables whose weights moved by the dead band or more.
func (p *switchyard) solve(r *run, fit bool) {
	f := r.f
	tu := f.sc.Policies.Switchyard.TargetUtilisation
	prob := &optimizer.Problem{}
	var idx []int
	var tus []float64 // by problem engine: its target utilisation
	for j := range f.engines {
		s := &r.sig[j]
		if fit && s.ttft.init {
			p.fits[j].Add(fitSample(s), s.idleMs)
		}
		if !s.up || !(s.capacity > 0) {
			continue
		}
		// The fit, else the prior, and never below the engine's own idle latency.
		base := p.fits[j].BaseMs(s.idleMs, s.idleMs)
		tuj := tu
		if t := f.engines[j].typ.TargetUtilisation; t > 0 {
			tuj = t
		}
		tus = append(tus, tuj)
		prob.Engines = append(prob.Engines, optimizer.Engine{Name: f.engines[j].name, CapacityRPS: s.capacity * tuj, Health: 1,
			Profile: optimizer.QueueProfile{BaseMs: base}})
		idx = append(idx, j)
	}
	for c := range f.clusters {
		d := r.demand[c].Fast
		if !r.demand[c].init || d < minDemandRPS {
			d = minDemandRPS
		}
		cl := optimizer.Cluster{Name: f.clusters[c].name}
		cl.Demand[optimizer.Standard] = d
		row := make([]optimizer.Link, len(idx))
		for k, j := range idx {
			row[k] = optimizer.Link{Engine: k, Ms: f.rtt(c, j)}
		}
		prob.Clusters = append(prob.Clusters, cl)
		prob.Network = append(prob.Network, row)
	}
	if len(idx) == 0 {
		for c := range f.clusters {
			if ct := p.cur[c]; ct == nil || ct.shed < 1 {
				p.install(r, c, make([]float64, len(f.engines)), nil, 1)
			}
		}
		return
	}
	sol, err := p.solver.Solve(prob, p.prev)
	if err != nil {
		return // keep the installed tables, as the service does
	}
	optimizer.ShareShed(prob, sol) // as the service does by default
	p.prev = sol
	if r.now >= f.measureFrom && r.now < f.measureTo {
		for k, j := range idx {
			r.m.targetUtilSum[j] += sol.Engines[k].LoadRPS / r.sig[j].capacity // of the whole capacity
		}
		r.m.targetUtilN++
	}
	// Planned utilisation, as the snapshot's Utilisation, of the capacity at
	// the common target (as services/optimizersvc writes it): an engine type
	// planned to a lower target of its own shows its plan as the lower share
	// it is, so that the routers' planned-relative comparison keeps it there
	// rather than rating it against its own, smaller planned capacity (which
	// would undo the lower target: TestTypeTargetUtilisation).
	util := make([]float64, len(f.engines))
	for k, j := range idx {
		if u := sol.Engines[k].Utilisation * tus[k] / tu; u >= 0 && !math.IsInf(u, 0) {
			util[j] = math.Min(u, 1e6)
		}
	}
	dead := p.solver.Options().DeadBand
	for c := range f.clusters {
		cr := &sol.Clusters[c]
		w := make([]float64, len(f.engines))
		for k, e := range cr.Engines {
			w[idx[e]] = cr.Weights[k]
		}
		shed := math.Max(0, math.Min(1, cr.ShedFraction))
		old := p.cur[c]
		if old == nil || tvDistance(w, old.weights, shed, old.shed) >= dead || (shed > 1e-9) != (old.shed > 1e-9) {
			p.install(r, c, w, util, shed)
		}
	}
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

func (p *feedbackLoop) pick(r *run, c int, a *Arrival) int { return p.tables.pick(r, c, a, false) }

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
