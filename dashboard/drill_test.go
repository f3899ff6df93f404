package dashboard_test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-dev/switchyard/dashboard"
	"github.com/switchyard-dev/switchyard/internal/enginestate"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/enginesim"
	"github.com/switchyard-dev/switchyard/stack"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/testenv"
)

// pagePoll is how often the page polls /api/state (app.js): the page
// shows a state at most this long after /api/state does.
const pagePoll = time.Second

// TestDrillStatesInChromium runs the README's failure drills against the
// case-study stack under load, with a dashboard wired as switchyard up
// wires it: engine-b failing every request, then cleared; engine-c
// drained, then restored. After each step /api/state must show the
// engine's new state within 3 s less the page's poll interval (so the
// page, which polls every second, within 3 s of the drill), and headless
// Chromium must show it on the engine's card.
//
// Its bounds are real-time figures that the race detector's slowdown
// distorts: it is skipped under -race, and .ci/run runs it without.
func TestDrillStatesInChromium(t *testing.T) {
	if raceEnabled {
		t.Skip("real-time figures; run without -race: go test -count=1 -run TestDrillStatesInChromium ./dashboard/")
	}
	bin := testenv.Chromium(t)
	ctx := context.Background()
	// The case study at half its capacity and a quarter of its demand, so
	// that a small shared machine keeps up with the simulated engines and
	// the drills, not an overload, decide the states.
	file := stack.Default()
	for i := range file.Clusters {
		file.Clusters[i].DemandRPS /= 4
	}
	for i := range file.Engines {
		file.Engines[i].CapacityRPS /= 2
	}
	// Load for at most 3 minutes; the test's end stops it.
	s, dash, srv := liveStack(t, file, 0, 3*time.Minute)
	js, err := jetstream.New(s.Conn())
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, streams.DefaultNames().EnginesBucket)
	if err != nil {
		t.Fatal(err)
	}
	// The drills, as switchyard engine inject, drain and restore send them.
	inject := func(engine, body string) func() {
		return func() {
			subj, err := enginesim.ControlSubject(streams.Names{}, engine)
			if err != nil {
				t.Fatal(err)
			}
			if m, err := s.Conn().RequestWithContext(ctx, subj, []byte(body)); err != nil || m.Header.Get(messages.HeaderStatus) != "200" {
				t.Fatalf("inject %s into %s: %v %v", body, engine, err, m)
			}
		}
	}
	operatorKey := func(engine string) string {
		k, err := streams.OperatorKey(engine)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	drain := func(engine string) func() {
		return func() {
			data, err := messages.Encode(&messages.Operator{Engine: engine, Action: messages.ActionDrain, By: "drill", Time: time.Now().UnixMilli()})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := kv.Put(ctx, operatorKey(engine), data); err != nil {
				t.Fatal(err)
			}
		}
	}
	restore := func(engine string) func() {
		return func() {
			if err := kv.Delete(ctx, operatorKey(engine)); err != nil {
				t.Fatal(err)
			}
		}
	}
	const clear = `{"error_rate":0,"added_latency_ms":0,"capacity_factor":0,"ttft_factor":0,"crash_after":0,"hang":false,"crashed":false,"silent":false}`
	any := func(states ...enginestate.State) []enginestate.State { return states }
	view := func(engine string) dashboard.EngineView {
		for _, m := range dash.State().Models {
			for _, e := range m.EngineStates {
				if e.Engine == engine {
					return e
				}
			}
		}
		return dashboard.EngineView{}
	}
	steps := []struct {
		name   string
		from   enginestate.State // the engine's state to wait for before the drill
		do     func()
		engine string
		want   []enginestate.State
		within time.Duration // for /api/state
	}{
		{"engine inject engine-b --error-rate 1", enginestate.Up, inject("engine-b", `{"error_rate":1}`), "engine-b",
			any(enginestate.Degraded, enginestate.Ejected), 3*time.Second - pagePoll},
		// Back to up once its penalty and slow start, if any, are over.
		{"engine inject engine-b --clear", "", inject("engine-b", clear), "engine-b", any(enginestate.Up), time.Minute},
		{"engine drain engine-c", enginestate.Up, drain("engine-c"), "engine-c", any(enginestate.Drained), 3*time.Second - pagePoll},
		{"engine restore engine-c", enginestate.Drained, restore("engine-c"), "engine-c", any(enginestate.Up), 3*time.Second - pagePoll},
	}
	for _, st := range steps {
		if st.from != "" {
			testenv.WaitFor(t, time.Minute, fmt.Sprintf("%s %s before %s", st.engine, st.from, st.name), func() bool {
				return view(st.engine).State == st.from
			})
		}
		start := time.Now()
		st.do()
		var got dashboard.EngineView
		in := func() bool {
			got = view(st.engine)
			return slices.Contains(st.want, got.State)
		}
		last := ""
		for !in() && time.Since(start) < 2*st.within+5*time.Second {
			if now := fmt.Sprintf("%s (%s) q=%.1f run=%.1f load=%.1f", got.State, got.Detail, got.Queue, got.Running, got.LoadRPS); now != last {
				t.Logf("  %s after %s: %s", st.engine, time.Since(start).Round(time.Millisecond), now)
				last = now
			}
			time.Sleep(20 * time.Millisecond)
		}
		took := time.Since(start)
		t.Logf("%s: /api/state shows %s %s (%s) after %s", st.name, st.engine, got.State, got.Detail, took.Round(time.Millisecond))
		if !in() || took > st.within {
			t.Errorf("%s: /api/state shows %s %s (%s) after %s, want %v within %s", st.name, st.engine, got.State, got.Detail,
				took.Round(time.Millisecond), st.want, st.within)
			continue
		}
		dom := testenv.RunChromium(t, bin, srv.URL+"/", 1500, "--dump-dom")
		card := regexp.MustCompile(`<div class="card" data-engine="` + st.engine + `"[^>]*\bdata-state="([a-z]+)"`).FindStringSubmatch(dom)
		if card == nil || !slices.Contains(st.want, enginestate.State(card[1])) {
			t.Errorf("%s: the page's card of %s is %v, want state %v as /api/state showed", st.name, st.engine, card, st.want)
		}
	}
}
