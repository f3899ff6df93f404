package optimizersvc

import (
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/messages"
)

func TestStrikesDecay(t *testing.T) {
	o := defaultPenalties()
	end := time.UnixMilli(1_780_000_000_000)
	p := &penalty{strikes: 4, until: end.Add(-10 * time.Second), recoverUntil: end}
	for _, tc := range []struct {
		at   time.Duration
		want int
	}{{-time.Second, 4}, {0, 4}, {59 * time.Second, 4}, {time.Minute, 3}, {150 * time.Second, 2}, {4 * time.Minute, 0}, {time.Hour, 0}} {
		if got := o.strikesAt(p, end.Add(tc.at)); got != tc.want {
			t.Errorf("strikes %v after the slow start: %d, want %d", tc.at, got, tc.want)
		}
	}
	if o.forgotten(p, end.Add(239*time.Second)) || !o.forgotten(p, end.Add(4*time.Minute)) {
		t.Error("four strikes not forgotten exactly four decays after the slow start")
	}
	if o.forgotten(p, end.Add(-time.Second)) {
		t.Error("forgotten during its slow start")
	}
	// Without decay, Forget alone clears them.
	nd := defaultPenalties()
	nd.NoStrikeDecay = true
	if nd.strikesAt(p, end.Add(4*time.Minute)) != 4 || nd.forgotten(p, end.Add(4*time.Minute)) || !nd.forgotten(p, end.Add(5*time.Minute+time.Second)) {
		t.Error("no-decay strikes: Forget does not clear them")
	}
	// Forget caps decay: 20 strikes are gone after 5 min anyway.
	many := &penalty{strikes: 20, recoverUntil: end}
	if !o.forgotten(many, end.Add(5*time.Minute+time.Second)) {
		t.Error("Forget does not cap the decay")
	}
}

// A relapse after strikes decayed escalates from what is left, not from
// the strikes once given.
func TestPenaltyAfterDecay(t *testing.T) {
	o := defaultPenalties()
	t0 := time.UnixMilli(1_780_000_000_000)
	pens := map[string]*penalty{"m.a": {strikes: 3, since: t0, until: t0.Add(20 * time.Second), recoverUntil: t0.Add(30 * time.Second)}}
	keys := []string{"m.a", "m.b", "m.c"}
	at := t0.Add(30*time.Second + 150*time.Second) // two decays after the slow start
	outs := map[string]*messages.EngineOutcomes{"m.a": failing(at), "m.b": healthy(at), "m.c": healthy(at)}
	ev := o.judge(pens, keys, outs, nil, at)
	if len(ev) != 1 || ev[0].p.strikes != 2 || ev[0].p.until.Sub(at) != 10*time.Second {
		t.Fatalf("relapse after two decays: %+v, want strike 2 for 10 s", ev)
	}
	// A relapse within a minute of the slow start keeps escalating.
	pens["m.a"] = &penalty{strikes: 3, since: t0, until: t0.Add(20 * time.Second), recoverUntil: t0.Add(30 * time.Second)}
	at = t0.Add(50 * time.Second)
	outs["m.a"] = failing(at)
	if ev := o.judge(pens, keys, outs, nil, at); len(ev) != 1 || ev[0].p.strikes != 4 || ev[0].p.until.Sub(at) != 40*time.Second {
		t.Fatalf("flapping engine: %+v, want strike 4 for 40 s", ev)
	}
}

// A penalty record from before a restart keeps its strikes but not its
// penalty; one written while this instance runs is adopted as it is.
func TestRestoredPenaltyLifted(t *testing.T) {
	s := &Service{pens: map[string]*penalty{}, log: zerolog.Nop(), started: time.Now()}
	s.opts.Penalties = *defaultPenalties()
	before := s.started.Add(-time.Second)
	inForce := func(at time.Time, engine string) *messages.Penalty {
		return &messages.Penalty{Model: "m", Engine: engine, Phase: messages.PhasePenalised, Multiplier: 0, Reason: messages.ReasonFailures,
			Since: at.UnixMilli(), Until: at.Add(5 * time.Minute).UnixMilli(), RecoverUntil: at.Add(5*time.Minute + 10*time.Second).UnixMilli(),
			Strikes: 7, Time: at.UnixMilli()}
	}
	s.adoptPenalty(inForce(before, "old"))
	now := time.Now()
	p := s.pens["m.old"]
	if p == nil || p.strikes != 7 || !p.stored {
		t.Fatalf("restored record not adopted: %+v", p)
	}
	if m := p.multiplier(now, 0.1); m != 1 {
		t.Errorf("restored penalty still in force: multiplier %v", m)
	}
	if got := s.opts.Penalties.strikesAt(p, now.Add(2*time.Minute)); got != 5 {
		t.Errorf("restored strikes two minutes on: %d, want 5", got)
	}
	after := s.started.Add(time.Second)
	s.adoptPenalty(inForce(after, "new"))
	if p := s.pens["m.new"]; p == nil || p.multiplier(after.Add(time.Minute), 0.1) != 0 {
		t.Errorf("a penalty written after the start not kept: %+v", p)
	}
}
