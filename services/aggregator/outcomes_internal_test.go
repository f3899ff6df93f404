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
