package stack_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/internal/enginestate"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/aggregator"
	"github.com/switchyard-dev/switchyard/services/enginesim"
	"github.com/switchyard-dev/switchyard/services/loadgen"
	"github.com/switchyard-dev/switchyard/stack"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/testenv"
	"github.com/switchyard-dev/switchyard/workload"
)

// urlModel is the model the engines by URL serve. The id
// meta-llama/Llama-3.1-8B-Instruct needs the router's mapping of public
// model ids to NATS tokens; until it is on this branch the engines serve a
// plain name.
const urlModel = "llama"

// startVLLMEngines starts n simulated engines in vLLM mode, the
// operator's engines the stack reaches by URL.
func startVLLMEngines(t *testing.T, n int) []*enginesim.Engine {
	t.Helper()
	return testenv.StartVLLMEngines(t, n, enginesim.Options{Model: urlModel, MaxBatch: 8, PrefillMsPerToken: 0.02, BaseTBTMs: 5, TBTGrowthMs: 0.1,
		OutputTokens: 8, PromptTokens: 64})
}

// startURLStack runs `up --stack` on a stack file of the form
// naming engines by URL, and waits until the router's snapshot plans all
// of them.
func startURLStack(t *testing.T, engines []*enginesim.Engine) *stack.Stack {
	t.Helper()
	f, err := stack.Parse("url-engines.yaml", []byte(testenv.URLStackFile(urlModel, engines)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Silence is judged in seconds, not the defaults' 2 s and 6 s, so that
	// the agent's death reaches "down" within the test's time.
	s, err := stack.Start(ctx, stack.Options{File: f, DataDir: t.TempDir(), SignalInterval: 100 * time.Millisecond,
		Aggregator: aggregator.Options{StaleAfter: time.Second, DownAfter: 2 * time.Second}, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if len(s.Engines()) != 0 || s.Agent() == nil {
		t.Fatalf("stack of engines by URL: %d simulated engines, agent %v; want none and an agent", len(s.Engines()), s.Agent())
	}
	waitEnginesPlanned(t, s, engines)
	return s
}

// waitEnginesPlanned waits until every router's snapshot plans every one
// of engines.
func waitEnginesPlanned(t *testing.T, s *stack.Stack, engines []*enginesim.Engine) {
	t.Helper()
	testenv.WaitFor(t, 15*time.Second, "every router's snapshot plans every engine by URL", func() bool {
		for _, r := range s.Routers() {
			snap, ok := r.Store().Snapshot(urlModel)
			if !ok {
				return false
			}
			for _, e := range engines {
				if _, ok := snap.Weights[e.Name()]; !ok {
					return false
				}
			}
		}
		return true
	})
}

// send runs rate req/s of Poisson arrivals for d through the stack's router.
func send(t *testing.T, s *stack.Stack, rate float64, d time.Duration, seed uint64) *loadgen.Summary {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d+20*time.Second)
	defer cancel()
	reqs := workload.Poisson(workload.PoissonOptions{Rate: rate, Duration: d, PromptTokens: 64, OutputTokens: 8, Sessions: 500, Seed: seed})
	sum, err := loadgen.Run(ctx, loadgen.Options{URL: "http://" + s.Routers()[0].Addr(), Model: urlModel, Requests: reqs, StreamFraction: 0.5, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

func noFailures(t *testing.T, what string, sum *loadgen.Summary) {
	t.Helper()
	t.Logf("%s: sent %d ok %d errors %d shed %d dropped %d; by engine %v", what, sum.Sent, sum.OK, sum.Errors, sum.Shed, sum.Dropped, sum.EngineCount)
	if sum.OK == 0 || sum.Errors != 0 || sum.Shed != 0 || sum.Dropped != 0 {
		t.Fatalf("%s: %d of %d answered, %d errors (%v), %d shed, %d dropped; want every request answered", what,
			sum.OK, sum.Sent, sum.Errors, sum.ErrorSamples, sum.Shed, sum.Dropped)
	}
}

// TestURLEnginesEndToEnd: `up --stack` with three engines by URL (engine
// simulators in vLLM mode, real HTTP on 127.0.0.1) runs the agent and no
// simulator; requests through the router are answered by all three, and
// killing one engine mid-run costs no failed request.
//
// No failed request is a real-time figure: under the race detector the
// router ejects the dead engine late, and the retry budget (a fifth of a
// retry per request) can run out on the attempts that meet it first. So it
// is skipped under -race, and .ci/run runs it without; the stack of engines
// by URL runs under -race in TestAgentDeathKeepsEnginesServing.
func TestURLEnginesEndToEnd(t *testing.T) {
	if raceEnabled {
		t.Skip("no failed request when an engine dies is a real-time figure; run without -race: go test -count=1 -run TestURLEnginesEndToEnd ./stack/")
	}
	engines := startVLLMEngines(t, 3)
	s := startURLStack(t, engines)
	sum := send(t, s, 30, 2*time.Second, 1)
	noFailures(t, "three engines", sum)
	for _, e := range engines {
		if sum.EngineCount[e.Name()] == 0 {
			t.Errorf("engine %s answered none of %d requests", e.Name(), sum.OK)
		}
	}
	done := make(chan *loadgen.Summary)
	go func() { done <- send(t, s, 30, 4*time.Second, 2) }()
	time.Sleep(time.Second) // the run is under way: the kill lands mid-run
	if err := engines[1].Close(); err != nil {
		t.Fatal(err)
	}
	noFailures(t, "engine v2 killed mid-run", <-done)
}

// verdict returns the operators' state of an engine of the stack, as
// `switchyard engine list` and the dashboard compute it.
func verdict(t *testing.T, kv jetstream.KeyValue, engine string) enginestate.Verdict {
	v, _ := verdictStatus(t, kv, engine)
	return v
}

// verdictStatus is verdict with the aggregator's status of the engine.
func verdictStatus(t *testing.T, kv jetstream.KeyValue, engine string) (enginestate.Verdict, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var st *messages.EngineState
	if e, err := kv.Get(ctx, streams.JoinKey(urlModel, engine)); err == nil {
		st = &messages.EngineState{}
		if err := messages.DecodeInto(e.Value(), st); err != nil {
			t.Fatal(err)
		}
	}
	status := ""
	if st != nil {
		status = st.Status
	}
	return enginestate.Of(enginestate.Input{State: st, Now: time.Now()}), status
}

// TestAgentDeathKeepsEnginesServing: the agent of live engines dies (it
// serves all three): requests go on being answered — no failure, no 503,
// no shed — while the engines' signals are missing past the aggregator's
// down-after, the engines' state is reported unknown, and it is up again
// once the agent returns. Its bounds hold under the race detector, so it
// runs in the -race run only.
func TestAgentDeathKeepsEnginesServing(t *testing.T) {
	engines := startVLLMEngines(t, 3)
	s := startURLStack(t, engines)
	js, err := jetstream.New(s.Conn())
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), streams.DefaultNames().EnginesBucket)
	if err != nil {
		t.Fatal(err)
	}
	noFailures(t, "agent alive", send(t, s, 20, time.Second, 3))
	if v := verdict(t, kv, "v1"); v.State != enginestate.Up {
		t.Fatalf("v1 with its agent: %s (%s), want up", v.State, v.Detail)
	}
	s.StopAgent()
	done := make(chan *loadgen.Summary)
	// Four seconds: past the aggregator's down-after (2 s) and the router's
	// own silence mark.
	go func() { done <- send(t, s, 20, 4*time.Second, 4) }()
	testenv.WaitFor(t, 8*time.Second, "v1 down by the aggregator's clock and reported unknown while its agent is dead", func() bool {
		v, status := verdictStatus(t, kv, "v1")
		return status == messages.StatusDown && v.State == enginestate.Unknown
	})
	v := verdict(t, kv, "v1")
	t.Logf("v1 without its agent: %s (%s)", v.State, v.Detail)
	noFailures(t, "agent dead", <-done)
	if err := s.StartAgent(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "v1 up again once the agent is back", func() bool {
		return verdict(t, kv, "v1").State == enginestate.Up
	})
	noFailures(t, "agent back", send(t, s, 20, time.Second, 5))
}
