package aggregator

import (
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
)

// Intervals of nothing but client errors are neither failures nor a
// failure streak: the engine answered every request.
func TestOutcomesClientErrorsNotFailures(t *testing.T) {
	s := messages.DefaultSmoother()
	var a outcomeAcc
	out := &messages.EngineOutcomes{}
	now := time.Now()
	for i := 0; i < 10; i++ {
		o := messages.EngineOutcome{Sent: 10, Errors: map[string]int64{messages.ErrorClassClient: 10}}
		a.fold(out, o, now.UnixMilli(), now, s)
		now = now.Add(time.Second)
	}
	if out.FailedIntervals != 0 || out.ErrorRate.Fast != 0 || out.ErrorRate.Slow != 0 {
		t.Errorf("client errors counted against the engine: %+v", out)
	}
	o := messages.EngineOutcome{Sent: 10, Errors: map[string]int64{messages.ErrorClassClient: 5, "5xx": 5}}
	if n := failures(o); n != 5 {
		t.Errorf("failures %d, want the 5 5xx only", n)
	}
}

// The outcome windows are rates over wall time: once the failures stop —
// the engine idle, or sent nothing — its error and timeout rates fall to
// zero without another report, however high they were.
func TestOutcomesDecayWhenIdle(t *testing.T) {
	s := messages.Smoother{Fast: 1, Slow: 30}
	start := time.Unix(1_800_000_000, 0)
	cases := []struct {
		name    string
		o       messages.EngineOutcome
		after   time.Duration
		fastMax float64 // the fast error rate at most, after
		slowMax float64 // the slow error rate at most, after
	}{
		// A failing engine stops being sent anything (ejected, drained):
		// the fast window empties within seconds, the slow one within
		// minutes.
		{"failed, idle 2s", messages.EngineOutcome{Sent: 100, Errors: map[string]int64{"5xx": 100}}, 2 * time.Second, 1, 1},
		{"failed, idle 15s", messages.EngineOutcome{Sent: 100, Errors: map[string]int64{"5xx": 100}}, 15 * time.Second, 0.01, 1},
		{"failed, idle 10min", messages.EngineOutcome{Sent: 100, Errors: map[string]int64{"5xx": 100}}, 10 * time.Minute, 0, 0.01},
		{"one failure, idle 5s", messages.EngineOutcome{Sent: 1, Errors: map[string]int64{"5xx": 1}}, 5 * time.Second, 0.05, 1},
		{"timeouts, idle 20s", messages.EngineOutcome{Sent: 20, Timeouts: 20}, 20 * time.Second, 0, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var a outcomeAcc
			out := &messages.EngineOutcomes{}
			a.fold(out, c.o, start.UnixMilli(), start, s)
			if out.ErrorRate.Fast+out.TimeoutRate.Fast < 0.99 {
				t.Fatalf("after the failing report: %+v, want rate 1", out)
			}
			// Ticks as the aggregator's writes make them, every 250 ms.
			moved := false
			for now := start; now.Before(start.Add(c.after)); now = now.Add(250 * time.Millisecond) {
				moved = a.tick(out, now.Add(250*time.Millisecond), s) || moved
			}
			if !moved {
				t.Errorf("tick never reported a change")
			}
			if out.ErrorRate.Fast > c.fastMax || out.ErrorRate.Slow > c.slowMax {
				t.Errorf("error rate %+v after %s idle, want fast <= %v, slow <= %v", out.ErrorRate, c.after, c.fastMax, c.slowMax)
			}
			if c.o.Timeouts > 0 && out.TimeoutRate.Fast > c.fastMax {
				t.Errorf("timeout rate %+v after %s idle, want fast <= %v", out.TimeoutRate, c.after, c.fastMax)
			}
			if c.after >= 10*time.Minute && (*out != messages.EngineOutcomes{Reports: 1, LastReport: out.LastReport, LastSent: out.LastSent, FailedIntervals: 1}) {
				t.Errorf("after %s idle the windows are not settled at zero: %+v", c.after, out)
			}
		})
	}
	// A steady failing engine keeps its rate: decay is for the idle.
	var a outcomeAcc
	out := &messages.EngineOutcomes{}
	now := start
	for i := 0; i < 30; i++ {
		a.fold(out, messages.EngineOutcome{Sent: 10, Succeeded: 5, Errors: map[string]int64{"5xx": 5}}, now.UnixMilli(), now, s)
		a.tick(out, now.Add(500*time.Millisecond), s)
		now = now.Add(time.Second)
	}
	if out.ErrorRate.Fast < 0.45 || out.ErrorRate.Fast > 0.55 || out.ErrorRate.Slow < 0.45 || out.ErrorRate.Slow > 0.55 {
		t.Errorf("steady 50%% errors read as %+v", out.ErrorRate)
	}
}
