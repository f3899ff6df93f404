package messages

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// TestValueBounds checks, rule by rule, that a value a writer could use to
// wedge or mislead a reader is rejected with the right sentinel errors, and
// that the honest values at each bound pass.
func TestValueBounds(t *testing.T) {
	nowMs := testNow.UnixMilli()
	skewMs := MaxFutureSkew.Milliseconds()
	ageMs := MaxMessageAge.Milliseconds()
	ceiling := GenerationCeiling(testNow)
	cases := []struct {
		name string
		msg  Message
		want []error // nil: valid
	}{
		{"signal now", signalWith(func(s *EngineSignal) {}), nil},
		{"signal at max skew", signalWith(func(s *EngineSignal) { s.Time = nowMs + skewMs }), nil},
		{"signal past max skew", signalWith(func(s *EngineSignal) { s.Time = nowMs + skewMs + 1 }), []error{ErrInvalid, ErrFuture}},
		{"signal at max age", signalWith(func(s *EngineSignal) { s.Time = nowMs - ageMs }), nil},
		{"signal past max age", signalWith(func(s *EngineSignal) { s.Time = nowMs - ageMs - 1 }), []error{ErrInvalid, ErrExpired}},
		{"signal in 1970", signalWith(func(s *EngineSignal) { s.Time = 1 }), []error{ErrInvalid}},
		{"signal expired and invalid", signalWith(func(s *EngineSignal) { s.Time = nowMs - ageMs - 1; s.KVUse = 2 }), []error{ErrInvalid}},
		{"report now", reportWith(func(r *RouterReport) {}), nil},
		{"report past max age", reportWith(func(r *RouterReport) { r.Time = nowMs - ageMs - 1 }), []error{ErrInvalid, ErrExpired}},
		{"report far future", reportWith(func(r *RouterReport) { r.Time = nowMs + 3600_000 }), []error{ErrInvalid, ErrFuture}},
		{"report denormal interval", reportWith(func(r *RouterReport) { r.IntervalS = 5e-324 }), []error{ErrInvalid}},
		{"report interval below floor", reportWith(func(r *RouterReport) { r.IntervalS = MinReportInterval / 2 }), []error{ErrInvalid}},
		{"report interval at floor", reportWith(func(r *RouterReport) {
			r.IntervalS = MinReportInterval
			r.Requests = 1
			r.Engines = nil
			r.DemandByPriority = nil
		}), nil},
		{"report zero interval", reportWith(func(r *RouterReport) { r.IntervalS = 0 }), []error{ErrInvalid}},
		{"report NaN interval", reportWith(func(r *RouterReport) { r.IntervalS = math.NaN() }), []error{ErrInvalid}},
		{"report requests at ceiling", reportWith(func(r *RouterReport) { r.Requests = int64(MaxRouterRate); r.Engines = nil; r.DemandByPriority = nil }), nil},
		{"report requests above ceiling", reportWith(func(r *RouterReport) { r.Requests = int64(MaxRouterRate) + 1 }), []error{ErrInvalid}},
		{"report requests above ceiling over a long interval", reportWith(func(r *RouterReport) { r.IntervalS = 10; r.Requests = 10*int64(MaxRouterRate) + 10 }), []error{ErrInvalid}},
		{"report shed above ceiling", reportWith(func(r *RouterReport) { r.Shed = 1 << 40 }), []error{ErrInvalid}},
		{"report retries above ceiling", reportWith(func(r *RouterReport) { r.Retries = 1 << 39 }), []error{ErrInvalid}},
		{"report priority above ceiling", reportWith(func(r *RouterReport) { r.DemandByPriority["critical"] = 1 << 39 }), []error{ErrInvalid}},
		{"report engine sent above ceiling", reportWith(func(r *RouterReport) {
			o := r.Engines["engine-a"]
			o.Sent = 1 << 40
			r.Engines["engine-a"] = o
		}), []error{ErrInvalid}},
		{"report engine errors above ceiling", reportWith(func(r *RouterReport) {
			o := r.Engines["engine-a"]
			o.Errors = map[string]int64{"5xx": 1 << 30}
			r.Engines["engine-a"] = o
		}), []error{ErrInvalid}},
		{"snapshot generation 1", snapshotWith(func(s *WeightSnapshot) { s.Generation = 1 }), nil},
		{"snapshot generation at ceiling", snapshotWith(func(s *WeightSnapshot) { s.Generation = ceiling }), nil},
		{"snapshot generation above ceiling", snapshotWith(func(s *WeightSnapshot) { s.Generation = ceiling + 1 }), []error{ErrInvalid, ErrFuture}},
		{"snapshot generation 2^64-1", snapshotWith(func(s *WeightSnapshot) { s.Generation = math.MaxUint64 }), []error{ErrInvalid, ErrFuture}},
		{"snapshot generation 2^63", snapshotWith(func(s *WeightSnapshot) { s.Generation = 1 << 63 }), []error{ErrInvalid, ErrFuture}},
		{"snapshot time far future", snapshotWith(func(s *WeightSnapshot) { s.Time = nowMs + 24*3600_000 }), []error{ErrInvalid, ErrFuture}},
		{"snapshot an hour old", snapshotWith(func(s *WeightSnapshot) { s.Time = nowMs - 3600_000 }), nil}, // state: no age limit
		{"snapshot in 1970", snapshotWith(func(s *WeightSnapshot) { s.Time = 1000 }), []error{ErrInvalid}},
		{"engine state in 1970", &EngineState{Model: "llama", Engine: "e", Status: StatusUp, Time: 86_400_000, Health: 1}, []error{ErrInvalid}},
		{"engine state a day old", &EngineState{Model: "llama", Engine: "e", Status: StatusDown, Time: nowMs - 86_400_000, Health: 1}, nil},
		{"demand router report in 1970", &DemandState{Model: "llama", Cluster: "A", Time: nowMs,
			Routers: map[string]RouterDemand{"A-1": {LastReport: 5}}}, []error{ErrInvalid}},
		{"operator in 1970", &Operator{Engine: "e", Action: ActionDrain, Time: 1}, []error{ErrInvalid}},
		{"penalty of a day", penaltyWith(func(p *Penalty) { p.Until = p.Since + 86_400_000; p.RecoverUntil = p.Until + 10_000 }), nil},
		{"penalty of a day and a millisecond", penaltyWith(func(p *Penalty) { p.Until = p.Since + 86_400_001; p.RecoverUntil = p.Until }), []error{ErrInvalid}},
		{"penalty until the year 9999", penaltyWith(func(p *Penalty) { p.Until = 253_402_300_799_000; p.RecoverUntil = p.Until }), []error{ErrInvalid}},
		{"penalty recovering for a year", penaltyWith(func(p *Penalty) { p.RecoverUntil = p.Until + 365*86_400_000 }), []error{ErrInvalid}},
		{"penalty starting tomorrow", penaltyWith(func(p *Penalty) {
			p.Since += 86_400_000
			p.Until += 86_400_000
			p.RecoverUntil += 86_400_000
		}), []error{ErrInvalid, ErrFuture}},
		{"operator a year old", &Operator{Engine: "e", Action: ActionDrain, Time: nowMs - 365*86_400_000}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.msg.Validate(testNow)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("error %q is not %v", err, w)
				}
			}
			if len(tc.want) == 1 && (errors.Is(err, ErrFuture) || errors.Is(err, ErrExpired)) {
				t.Errorf("error %q carries a time sentinel it should not", err)
			}
			// What Validate rejects, decoding rejects too.
			if data, err := encodeUnchecked(tc.msg); err == nil {
				if _, derr := DecodeAt(data, testNow); derr == nil {
					t.Error("DecodeAt accepted it")
				}
			}
		})
	}
}

// TestNextGeneration checks that generations rise by at least one, follow
// the clock, never overflow, and are always acceptable to a reader with the
// same clock.
func TestNextGeneration(t *testing.T) {
	clock := clockGeneration(testNow)
	ceiling := GenerationCeiling(testNow)
	cases := []struct {
		name   string
		prev   uint64
		want   uint64
		wantOK bool
	}{
		{"fresh key", 0, clock, true},
		{"small legacy generation", 41, clock, true},
		{"a write within the same millisecond", clock, clock + 1, true},
		{"ahead of the clock, within the skew", clock + 500, clock + 501, true},
		{"just below the ceiling", ceiling - 1, ceiling, true},
		{"at the ceiling", ceiling, 0, false},
		{"above the ceiling", ceiling + 7, 0, false},
		{"2^64-1", math.MaxUint64, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := NextGeneration(tc.prev, testNow)
			if got != tc.want || ok != tc.wantOK {
				t.Fatalf("NextGeneration(%d) = %d, %v; want %d, %v", tc.prev, got, ok, tc.want, tc.wantOK)
			}
			if ok {
				s := snapshotWith(func(s *WeightSnapshot) { s.Generation = got })
				if err := s.Validate(testNow); err != nil {
					t.Fatalf("next generation %d not acceptable: %v", got, err)
				}
			}
		})
	}
	// Before EpochMs (a clock that reads 1970) generations still rise by one.
	if g, ok := NextGeneration(3, time.UnixMilli(0)); !ok || g != 4 {
		t.Fatalf("NextGeneration(3) at 1970 = %d, %v; want 4, true", g, ok)
	}
	// A writer one millisecond later can follow the highest generation a
	// reader accepted a millisecond earlier.
	if g, ok := NextGeneration(ceiling, testNow.Add(time.Millisecond)); !ok || g != ceiling+1 {
		t.Fatalf("NextGeneration(ceiling) a millisecond later = %d, %v", g, ok)
	}
}

func signalWith(f func(*EngineSignal)) *EngineSignal {
	s := goodSignal()
	f(s)
	return s
}

func reportWith(f func(*RouterReport)) *RouterReport {
	r := goodReport()
	f(r)
	return r
}

func penaltyWith(f func(*Penalty)) *Penalty {
	p := &Penalty{Model: "llama", Engine: "engine-a", Time: testNow.UnixMilli(), Phase: PhasePenalised, Reason: ReasonErrorRate,
		Since: testNow.UnixMilli() - 1000, Until: testNow.UnixMilli() + 4000, RecoverUntil: testNow.UnixMilli() + 14000, Strikes: 1}
	f(p)
	return p
}

func snapshotWith(f func(*WeightSnapshot)) *WeightSnapshot {
	s := goodSnapshot()
	f(s)
	return s
}

// encodeUnchecked stamps and encodes m without validating it.
func encodeUnchecked(m Message) ([]byte, error) {
	m.stamp()
	return msgpack.Marshal(m)
}
