package dashboard_test

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/switchyard-dev/switchyard/dashboard"
	"github.com/switchyard-dev/switchyard/services/enginesim"
	"github.com/switchyard-dev/switchyard/services/loadgen"
	"github.com/switchyard-dev/switchyard/stack"
	"github.com/switchyard-dev/switchyard/testenv"
	"github.com/switchyard-dev/switchyard/workload"
)

// envLive, set to a duration such as 90s, runs TestLiveStackScreenshot.
const envLive = "SWITCHYARD_DASHBOARD_LIVE"

// TestLiveStackScreenshot runs the case-study stack that switchyard up runs
// (at half scale), wired to a dashboard as up wires it, sends each cluster's
// demand through its router for the duration in SWITCHYARD_DASHBOARD_LIVE,
// cuts engine-b's capacity by a fifth half way through, and takes a screenshot (to
// SWITCHYARD_DASHBOARD_SCREENSHOT, or the test's temporary directory). It is
// how docs/dashboard.png is made:
//
//	SWITCHYARD_DASHBOARD_LIVE=90s SWITCHYARD_DASHBOARD_SCREENSHOT=docs/dashboard.png \
//	  go test ./dashboard -run TestLiveStackScreenshot -v
func TestLiveStackScreenshot(t *testing.T) {
	live := os.Getenv(envLive)
	if live == "" {
		t.Skipf("set %s to a duration (e.g. 90s) to run the case-study stack and screenshot its dashboard", envLive)
	}
	dur, err := time.ParseDuration(live)
	if err != nil || dur < 10*time.Second {
		t.Fatalf("%s=%q: want a duration of at least 10s", envLive, live)
	}
	bin := testenv.Chromium(t)
	// The case study at half scale (demand and capacity), so that a small
	// machine keeps up with the simulated engines.
	file := stack.Default()
	for i := range file.Clusters {
		file.Clusters[i].DemandRPS /= 2
	}
	for i := range file.Engines {
		file.Engines[i].CapacityRPS /= 2
	}
	s, _, srv := liveStack(t, file, dur, dur+10*time.Second)
	time.Sleep(dur / 2)
	for _, e := range s.Engines() {
		if e.Name() == "engine-b" {
			if err := e.SetFailure(enginesim.Failure{CapacityFactor: 0.8}); err != nil {
				t.Fatal(err)
			}
			t.Log("engine-b's capacity cut by a fifth")
		}
	}
	time.Sleep(dur / 2)

	shot := filepath.Join(t.TempDir(), "dashboard.png")
	if p := os.Getenv(envScreenshot); p != "" {
		if shot, err = filepath.Abs(p); err != nil {
			t.Fatal(err)
		}
	}
	testenv.RunChromium(t, bin, srv.URL+"/", 2500, "--screenshot="+shot, "--window-size=1280,900")
	checkPNG(t, shot)
	t.Logf("screenshot saved to %s", shot)
}

// liveStack runs file's stack wired to a dashboard as switchyard up wires
// it (with history), waits until every router holds a snapshot, and sends
// each cluster's demand through its router for at most load. It returns
// the stack, the dashboard and the dashboard's server on loopback;
// everything stops when the test ends.
func liveStack(t *testing.T, file *stack.File, history, load time.Duration) (*stack.Stack, *dashboard.Dashboard, *httptest.Server) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	s, err := stack.Start(ctx, stack.Options{File: file, DataDir: t.TempDir(), NATSPort: -1, RouterAddr: "127.0.0.1:0", Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	dash, err := dashboard.New(dashboard.Options{Conn: s.Conn(), Logger: zerolog.Nop(), History: history,
		Routers: dashboard.RouterStatuses(s.Routers)})
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = dash.Run(ctx) }()
	srv := httptest.NewServer(dash.Handler())
	t.Cleanup(srv.Close)

	f := s.File()
	testenv.WaitFor(t, 20*time.Second, "every router holds a snapshot", func() bool {
		for _, r := range s.Routers() {
			if _, ok := r.Store().Snapshot(f.Model); !ok {
				return false
			}
		}
		return true
	})
	for i, r := range s.Routers() {
		c := f.Clusters[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := workload.Poisson(workload.PoissonOptions{Rate: c.DemandRPS, Duration: load,
				PromptTokens: f.Sim.PromptTokens, OutputTokens: f.Sim.OutputTokens, Sessions: 200, Seed: uint64(i) + 1})
			_, _ = loadgen.Run(ctx, loadgen.Options{URL: "http://" + r.Addr(), Model: f.Model, Requests: reqs, StreamFraction: 0.5, Seed: 1})
		}()
	}
	return s, dash, srv
}
