package optimizersvc

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/optimizer"
)

// newRampService returns a Service without NATS over one engine m.e1 of
// capacity 30 req/s, for the problem-building logic alone.
func newRampService() (*Service, *messages.EngineState) {
	reg := prometheus.NewRegistry()
	opts := Options{Penalties: PenaltyOptions{SlowStart: 10 * time.Second}, Logger: zerolog.Nop(), Registerer: reg}
	opts = opts.WithDefaults()
	s := &Service{opts: opts, log: opts.Logger, metrics: newMetrics(reg), engines: map[string]*messages.EngineState{},
		demand: map[string]*messages.DemandState{}, rtt: map[string]float64{}, fits: map[string]*optimizer.BaseFit{},
		pens: map[string]*penalty{}, ramps: map[string]*ramp{}, operators: map[string]*messages.Operator{}}
	st := &messages.EngineState{Model: "m", Engine: "e1", Status: messages.StatusUp, CapacityRPS: 30, Health: 1}
	s.engines["m.e1"] = st
	return s, st
}

// slowStartGauges returns how many engines the slow-start gauge shows.
func slowStartGauges(t *testing.T, s *Service) int {
	t.Helper()
	fams, err := s.opts.Registerer.(*prometheus.Registry).Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "switchyard_optimizer_slow_start_multiplier" {
			return len(f.GetMetric())
		}
	}
	return 0
}

// health returns e1's health in the problem buildProblems builds now, -1
// when it is left out.
func health(t *testing.T, s *Service) float64 {
	t.Helper()
	b := s.buildProblems()
	if len(b) != 1 {
		t.Fatalf("%d problems, want 1", len(b))
	}
	for _, e := range b[0].problem.Engines {
		if e.Name == "e1" {
			return e.Health
		}
	}
	return -1
}

func TestSlowStartAfterCapacityReturns(t *testing.T) {
	s, st := newRampService()
	if h := health(t, s); h != 1 {
		t.Fatalf("engine first seen healthy: health %v, want 1 (no slow start at start-up)", h)
	}
	back := func(what string) {
		t.Helper()
		h := health(t, s)
		if math.Abs(h-s.opts.Penalties.RecoveryFloor) > 0.02 {
			t.Fatalf("%s: health %v just after the return, want about the floor %v", what, h, s.opts.Penalties.RecoveryFloor)
		}
		if n := slowStartGauges(t, s); n != 1 {
			t.Fatalf("%s: %d slow-start gauges, want 1", what, n)
		}
		now := s.ramps["m.e1"].start
		if m := s.slowStart("m.e1", st, 30, now.Add(5*time.Second)); math.Abs(m-0.55) > 1e-9 {
			t.Fatalf("%s: multiplier %v half-way through the slow start, want 0.55", what, m)
		}
		if m := s.slowStart("m.e1", st, 30, now.Add(10*time.Second)); m != 1 {
			t.Fatalf("%s: multiplier %v after the slow start, want 1", what, m)
		}
		if n := slowStartGauges(t, s); n != 0 {
			t.Fatalf("%s: %d slow-start gauges after it ended, want 0", what, n)
		}
		if h := health(t, s); h != 1 {
			t.Fatalf("%s: health %v after the slow start, want 1", what, h)
		}
	}

	// The engine's own health signal.
	st.Health = 0
	if h := health(t, s); h != -1 {
		t.Fatalf("health 0: engine in the problem with health %v", h)
	}
	st.Health = 1
	back("signal health")

	// Down, then up again.
	st.Status = messages.StatusDown
	if h := health(t, s); h != -1 {
		t.Fatalf("down: engine in the problem with health %v", h)
	}
	st.Status = messages.StatusUp
	back("down and up")

	// An operator's drain, then restore.
	s.operators["operator.e1"] = &messages.Operator{Engine: "e1", Action: messages.ActionDrain}
	if h := health(t, s); h != -1 {
		t.Fatalf("drained: engine in the problem with health %v", h)
	}
	delete(s.operators, "operator.e1")
	back("operator restore")

	// A capacity drop to about zero (below AboutZeroShare of the 30 req/s seen).
	st.CapacityRPS = 1
	if h := health(t, s); h != 1 {
		t.Fatalf("capacity 1 req/s: health %v, want 1 (capacity carries the drop)", h)
	}
	st.CapacityRPS = 30
	back("capacity drop")

	// A partial drop is no return from zero.
	st.Health = 0.5
	_ = health(t, s)
	st.Health = 1
	if h := health(t, s); h != 1 {
		t.Fatalf("after health 0.5: health %v, want 1 (no slow start)", h)
	}

	// An engine whose state is gone is forgotten.
	delete(s.engines, "m.e1")
	_ = s.buildProblems()
	if len(s.ramps) != 0 {
		t.Fatalf("ramps %v after the engine's state went away", s.ramps)
	}
}

// TestSlowStartNotDoubledAfterPenalty: a penalty's end brings the capacity
// back from zero through the penalty's own slow start, which is not
// multiplied by a second ramp.
func TestSlowStartNotDoubledAfterPenalty(t *testing.T) {
	s, _ := newRampService()
	_ = health(t, s)
	now := time.Now()
	s.pens["m.e1"] = &penalty{strikes: 1, mult: 0, since: now.Add(-time.Second), until: now.Add(time.Second),
		recoverUntil: now.Add(11 * time.Second)}
	if h := health(t, s); h != -1 {
		t.Fatalf("penalised with multiplier 0: engine in the problem with health %v", h)
	}
	p := s.pens["m.e1"]
	p.since, p.until, p.recoverUntil = now.Add(-3*time.Second), now.Add(-time.Second), now.Add(9*time.Second)
	want := p.multiplier(time.Now(), s.opts.Penalties.RecoveryFloor)
	if h := health(t, s); math.Abs(h-want) > 0.01 {
		t.Fatalf("recovering from a penalty: health %v, want the penalty's ramp %v alone", h, want)
	}
}

// TestFollowerAdoptsPenalty: a follower takes the leader's penalty record
// (a later penalty or more strikes) in place of its own judgement, and
// ignores an older one.
func TestFollowerAdoptsPenalty(t *testing.T) {
	s, _ := newRampService()
	now := time.Now().Truncate(time.Millisecond)
	rec := func(strikes int, since time.Time) []byte {
		t.Helper()
		data, err := messages.Encode(&messages.Penalty{Model: "m", Engine: "e1", Phase: messages.PhasePenalised, Multiplier: 0,
			Reason: messages.ReasonFailures, Since: since.UnixMilli(), Until: since.Add(20 * time.Second).UnixMilli(),
			RecoverUntil: since.Add(30 * time.Second).UnixMilli(), Strikes: strikes, Time: now.UnixMilli()})
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	s.pens["m.e1"] = &penalty{strikes: 1, mult: 0, since: now.Add(-time.Second), until: now.Add(4 * time.Second),
		recoverUntil: now.Add(14 * time.Second)}
	if !s.handleOther("penalty.m.e1", rec(3, now)) {
		t.Fatal("penalty record not recognised")
	}
	p := s.pens["m.e1"]
	if p.strikes != 3 || !p.since.Equal(now) || !p.until.Equal(now.Add(20*time.Second)) {
		t.Fatalf("after the leader's record of 3 strikes: %+v", p)
	}
	s.handleOther("penalty.m.e1", rec(2, now.Add(time.Second)))
	if p := s.pens["m.e1"]; p.strikes != 3 {
		t.Fatalf("an older record (2 strikes) replaced the penalty: %+v", p)
	}
	// Strikes escalate from the adopted ones.
	po := &s.opts.Penalties
	at := now.Add(31 * time.Second)
	ev := po.judge(s.pens, []string{"m.e1", "m.e2", "m.e3"},
		map[string]*messages.EngineOutcomes{"m.e1": failing(at), "m.e2": healthy(at), "m.e3": healthy(at)}, nil, at)
	if len(ev) != 1 || ev[0].p.strikes != 4 {
		t.Fatalf("penalty after the adopted one: %+v, want strike 4", ev)
	}
}

// TestTargetUtilisation: the problem plans every engine at TargetUtilisation
// of its effective capacity, and shares outside (0, 1] are refused.
func TestTargetUtilisation(t *testing.T) {
	s, _ := newRampService()
	s.opts.TargetUtilisation = 0.9
	b := s.buildProblems()
	if len(b) != 1 || len(b[0].problem.Engines) != 1 {
		t.Fatalf("problems %+v", b)
	}
	if e := b[0].problem.Engines[0]; math.Abs(e.EffectiveCapacity()-27) > 1e-9 {
		t.Fatalf("engine of 30 req/s at target utilisation 0.9: effective capacity %v in the problem, want 27", e.EffectiveCapacity())
	}
	// An engine's own target replaces the common one.
	s.opts.EngineTargetUtilisation = map[string]float64{"e1": 0.6}
	if b := s.buildProblems(); len(b) != 1 || math.Abs(b[0].problem.Engines[0].EffectiveCapacity()-18) > 1e-9 {
		t.Fatalf("engine of 30 req/s with its own target 0.6: problems %+v, want effective capacity 18", b)
	}
	// Its planned utilisation in the snapshot is relative to the common
	// target: 9 req/s on 30 is 0.3 of its capacity, 0.5 of its own planned
	// capacity, and 0.3/0.9 of the common target's.
	s.opts.Clusters = []string{"c"}
	s.opts.NetworkMs = map[string]map[string]float64{"c": {"e1": 1}}
	b = s.buildProblems()
	sol, err := optimizer.NewSolver(optimizer.DefaultOptions()).Solve(b[0].problem, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := sol.Engines[0].LoadRPS; math.Abs(got-1) > 1e-6 {
		t.Fatalf("planned load %v req/s, want the minimum demand 1", got)
	}
	snap := s.snapshot(b[0], sol, 0, time.Now())
	if got, want := snap.Utilisation["e1"], 1.0/30/0.9; math.Abs(got-want) > 1e-9 {
		t.Errorf("engine with its own target 0.6: snapshot utilisation %v, want %v (of the common target 0.9)", got, want)
	}
	bad := Options{Conn: &nats.Conn{}, EngineTargetUtilisation: map[string]float64{"e1": 1.5}}
	bad = bad.WithDefaults()
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "EngineTargetUtilisation[e1]") {
		t.Errorf("EngineTargetUtilisation 1.5: validate said %v", err)
	}
	for _, tu := range []float64{-0.1, 1.5, math.NaN()} {
		o := Options{Conn: &nats.Conn{}, TargetUtilisation: tu}
		o = o.WithDefaults()
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "TargetUtilisation") {
			t.Errorf("TargetUtilisation %v: validate said %v", tu, err)
		}
	}
	o := Options{Conn: &nats.Conn{}}
	o = o.WithDefaults()
	if err := o.Validate(); err != nil || o.TargetUtilisation != 1 {
		t.Errorf("default TargetUtilisation %v (validate: %v), want 1", o.TargetUtilisation, err)
	}
}

// TestNoSlowStart: with Penalties.NoSlowStart an engine back from about
// zero capacity gets its full health at once, and no slow-start gauge.
func TestNoSlowStart(t *testing.T) {
	s, st := newRampService()
	s.opts.Penalties.NoSlowStart = true
	if h := health(t, s); h != 1 {
		t.Fatalf("engine first seen healthy: health %v, want 1", h)
	}
	st.Health = 0
	if h := health(t, s); h != -1 {
		t.Fatalf("health 0: engine in the problem with health %v", h)
	}
	st.Health = 1
	if h := health(t, s); h != 1 {
		t.Errorf("back without slow start: health %v, want 1", h)
	}
	if n := slowStartGauges(t, s); n != 0 {
		t.Errorf("%d slow-start gauges, want 0", n)
	}
}
