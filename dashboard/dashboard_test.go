package dashboard_test

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/switchyard-dev/switchyard/dashboard"
	"github.com/switchyard-dev/switchyard/internal/enginestate"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/testenv"
)

const model = "llama"

// fixture writes sy_weights, sy_engines and sy_demand values and reads them back.
type fixture struct {
	t                        *testing.T
	weights, engines, demand jetstream.KeyValue
}

func newFixture(t *testing.T, n *testenv.NATS) *fixture {
	t.Helper()
	ctx := context.Background()
	f := &fixture{t: t}
	var err error
	for _, b := range []struct {
		kv   *jetstream.KeyValue
		name string
	}{{&f.weights, n.Names.WeightsBucket}, {&f.engines, n.Names.EnginesBucket}, {&f.demand, n.Names.DemandBucket}} {
		if *b.kv, err = n.JS.KeyValue(ctx, b.name); err != nil {
			t.Fatalf("bucket %s: %v", b.name, err)
		}
	}
	return f
}

func (f *fixture) put(kv jetstream.KeyValue, key string, m messages.Message) {
	f.t.Helper()
	data, err := messages.Encode(m)
	if err != nil {
		f.t.Fatalf("encode %s: %v", key, err)
	}
	if _, err := kv.Put(context.Background(), key, data); err != nil {
		f.t.Fatalf("put %s: %v", key, err)
	}
}

func (f *fixture) snapshot(cluster string, gen uint64, shed float64, w map[string]float64) {
	f.put(f.weights, model+"."+cluster, &messages.WeightSnapshot{Model: model, Cluster: cluster, Generation: gen,
		Time: time.Now().UnixMilli(), Weights: w, ShedFraction: shed, DemandRPS: 100, Writer: "test"})
}

func (f *fixture) engine(name, status string, capacity, health, load float64) {
	now := time.Now().UnixMilli()
	f.put(f.engines, model+"."+name, &messages.EngineState{Model: model, Engine: name, Region: "r-" + name[len(name)-1:],
		Status: status, Time: now, LastSignal: now - 200, CapacityRPS: capacity, Health: health, Replicas: 1,
		LoadRPS: messages.Window{Fast: load, Slow: load}, Queue: messages.Window{Fast: 2}, Running: messages.Window{Fast: 30}, InFlight: 32,
		TTFTMs: messages.Window{Fast: 120}, TBTMs: messages.Window{Fast: 18}, KVUse: messages.Window{Fast: 0.4}})
}

func (f *fixture) demandOf(cluster string, rps, shed, retry float64) {
	now := time.Now().UnixMilli()
	f.put(f.demand, model+"."+cluster, &messages.DemandState{Model: model, Cluster: cluster, Time: now, LastReport: now - 300,
		RPS: messages.Window{Fast: rps, Slow: rps}, ShedRPS: messages.Window{Fast: shed}, RetryRPS: messages.Window{Fast: retry},
		Routers: map[string]messages.RouterDemand{cluster + "-1": {LastReport: now - 300, RPS: messages.Window{Fast: rps}}}})
}

// caseStudy writes the case study's shape: B's overflow goes to engine-c.
func (f *fixture) caseStudy() {
	f.snapshot("A", 7, 0, map[string]float64{"engine-a": 1})
	f.snapshot("B", 9, 0, map[string]float64{"engine-b": 0.75, "engine-c": 0.25})
	f.snapshot("C", 4, 0.05, map[string]float64{"engine-c": 0.95})
	f.engine("engine-a", messages.StatusUp, 100, 1, 90)
	f.engine("engine-b", messages.StatusUp, 100, 1, 90)
	f.engine("engine-c", messages.StatusStale, 80, 1, 68)
	f.demandOf("A", 90, 0, 0.9)
	f.demandOf("B", 120, 0, 2.4)
	f.demandOf("C", 40, 2, 0)
}

// sySnapshots reads every valid snapshot in sy_weights, by cluster.
func (f *fixture) sySnapshots() map[string]messages.WeightSnapshot {
	f.t.Helper()
	ctx := context.Background()
	keys, err := f.weights.ListKeys(ctx)
	if err != nil {
		f.t.Fatalf("list sy_weights: %v", err)
	}
	out := map[string]messages.WeightSnapshot{}
	for k := range keys.Keys() {
		e, err := f.weights.Get(ctx, k)
		if err != nil {
			f.t.Fatalf("get %s: %v", k, err)
		}
		var s messages.WeightSnapshot
		if err := messages.DecodeInto(e.Value(), &s); err != nil {
			continue // not a snapshot: routers and the dashboard ignore it too
		}
		out[s.Cluster] = s
	}
	return out
}

func startDashboard(t *testing.T, n *testenv.NATS, opts dashboard.Options) *dashboard.Dashboard {
	t.Helper()
	opts.Conn, opts.Names, opts.Logger = n.Conn, n.Names, zerolog.Nop()
	d, err := dashboard.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return d
}

func TestStateHistoryAndAPI(t *testing.T) {
	n := testenv.StartNATS(t)
	f := newFixture(t, n)
	f.caseStudy()
	// Values the dashboard must ignore: an RTT state and an undecodable value.
	f.put(f.demand, "rtt.A.engine-a", &messages.RTTState{Cluster: "A", Engine: "engine-a", Time: time.Now().UnixMilli(),
		RTTMs: messages.Window{Fast: 1, Slow: 1}})
	if _, err := f.weights.Put(context.Background(), model+".Z", []byte("not msgpack")); err != nil {
		t.Fatal(err)
	}
	routers := []dashboard.RouterStatus{{Cluster: "B", Router: "B-1", Model: model, Generation: 9, AgeSeconds: 0.5, Mode: "snapshot"},
		{Cluster: "A", Router: "A-1", Model: model, Generation: 7, AgeSeconds: 0.4, Mode: "snapshot"}}
	d := startDashboard(t, n, dashboard.Options{SampleInterval: 20 * time.Millisecond, History: time.Second,
		Routers: func() []dashboard.RouterStatus { return routers }})

	testenv.WaitFor(t, 5*time.Second, "dashboard to see every value", func() bool {
		st := d.State()
		return len(st.Models) == 1 && len(st.Models[0].Snapshots) == 3 && len(st.Models[0].EngineStates) == 3 &&
			len(st.Models[0].Demand) == 3 && st.Watching[n.Names.WeightsBucket] && st.Watching[n.Names.DemandBucket]
	})
	st := d.State()
	m := st.Models[0]
	if got := strings.Join(m.Clusters, ","); got != "A,B,C" {
		t.Errorf("clusters %s, want A,B,C", got)
	}
	if got := strings.Join(m.Engines, ","); got != "engine-a,engine-b,engine-c" {
		t.Errorf("engines %s, want engine-a,engine-b,engine-c", got)
	}
	want := f.sySnapshots()
	for _, s := range m.Snapshots {
		w := want[s.Cluster]
		if s.Generation != w.Generation || len(s.Weights) != len(w.Weights) || s.ShedFraction != w.ShedFraction {
			t.Errorf("cluster %s: snapshot %+v, sy_weights has %+v", s.Cluster, s, w)
		}
		for e, v := range w.Weights {
			if s.Weights[e] != v {
				t.Errorf("cluster %s engine %s: weight %v, want %v", s.Cluster, e, s.Weights[e], v)
			}
		}
	}
	c := m.EngineStates[2]
	if c.Engine != "engine-c" || c.Status != messages.StatusStale || c.EffectiveCapacityRPS != 40 || math.Abs(c.Utilisation-1.7) > 1e-9 {
		t.Errorf("engine-c: %+v, want stale with effective capacity 40 and utilisation 1.7", c)
	}
	if b := m.Demand[1]; b.Cluster != "B" || math.Abs(b.RetryRatio-0.02) > 1e-9 || len(b.Routers) != 1 || b.Routers[0].Router != "B-1" {
		t.Errorf("demand of B: %+v, want retry ratio 0.02 and router B-1", b)
	}
	if len(st.Routers) != 2 || st.Routers[0].Router != "A-1" {
		t.Errorf("routers %+v, want A-1 then B-1", st.Routers)
	}

	// History: samples arrive, and ?since returns only newer ones.
	testenv.WaitFor(t, 5*time.Second, "history samples", func() bool { return len(d.History(0).Samples) >= 5 })
	h := d.History(0)
	last := h.Samples[len(h.Samples)-1]
	if last.Weights[model]["B"]["engine-c"] != 0.25 || last.LoadRPS[model]["engine-a"] != 90 || last.CapacityRPS[model]["engine-c"] != 40 {
		t.Errorf("newest sample %+v", last)
	}
	for i := 1; i < len(h.Samples); i++ {
		if h.Samples[i].TimeMs < h.Samples[i-1].TimeMs {
			t.Fatalf("samples out of order at %d", i)
		}
	}
	testenv.WaitFor(t, 5*time.Second, "the ring to wrap", func() bool { return len(d.History(0).Samples) == 50 })

	srv := httptest.NewServer(d.Handler())
	defer srv.Close()
	var hist dashboard.History
	getJSON(t, srv.URL+"/api/history?since="+strconv.FormatInt(last.TimeMs, 10), &hist)
	for _, s := range hist.Samples {
		if s.TimeMs <= last.TimeMs {
			t.Errorf("since=%d returned a sample of %d", last.TimeMs, s.TimeMs)
		}
	}
	var got dashboard.State
	getJSON(t, srv.URL+"/api/state", &got)
	if len(got.Models) != 1 || len(got.Models[0].Snapshots) != 3 {
		t.Errorf("/api/state: %+v", got)
	}
	for _, p := range []string{"/", "/app.js", "/style.css"} {
		resp, err := http.Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %s", p, resp.Status)
		}
	}
	if resp, err := http.Get(srv.URL + "/api/history?since=x"); err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Errorf("bad since: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	// A deleted key disappears; an update replaces the value.
	if err := f.weights.Delete(context.Background(), model+".C"); err != nil {
		t.Fatal(err)
	}
	f.snapshot("B", 10, 0, map[string]float64{"engine-b": 0.7, "engine-c": 0.3})
	testenv.WaitFor(t, 5*time.Second, "delete and update", func() bool {
		m := d.State().Models[0]
		return len(m.Snapshots) == 2 && m.Snapshots[1].Generation == 10 && m.Snapshots[1].Weights["engine-c"] == 0.3
	})
}

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := dashboard.New(dashboard.Options{}); err == nil {
		t.Error("New without Conn succeeded")
	}
	n := testenv.StartNATS(t)
	if _, err := dashboard.New(dashboard.Options{Conn: n.Conn, History: time.Second, SampleInterval: time.Second}); err == nil {
		t.Error("New with a one-sample history succeeded")
	}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// TestEngineStates: the dashboard joins each engine state with its penalty
// and operator records of sy_engines into the engine's state, on
// /api/state and in switchyard_dashboard_engine_state, and follows the
// records as they come and go.
func TestEngineStates(t *testing.T) {
	n := testenv.StartNATS(t)
	f := newFixture(t, n)
	f.caseStudy()
	now := time.Now().UnixMilli()
	f.put(f.engines, "operator.engine-a", &messages.Operator{Engine: "engine-a", Action: messages.ActionDrain, By: "ops", Time: now})
	f.put(f.engines, "penalty."+model+".engine-b", &messages.Penalty{Model: model, Engine: "engine-b", Time: now,
		Phase: messages.PhasePenalised, Multiplier: 0.25, Reason: messages.ReasonErrorRate, Since: now, Until: now + 60_000,
		RecoverUntil: now + 120_000, Strikes: 1})
	reg := prometheus.NewRegistry()
	d := startDashboard(t, n, dashboard.Options{Registerer: reg})
	states := func() map[string]dashboard.EngineView {
		out := map[string]dashboard.EngineView{}
		for _, m := range d.State().Models {
			for _, e := range m.EngineStates {
				out[e.Engine] = e
			}
		}
		return out
	}
	steps := []struct {
		name string
		do   func()
		want map[string]enginestate.State
	}{
		{"records at start", func() {}, map[string]enginestate.State{
			"engine-a": enginestate.Draining, "engine-b": enginestate.Penalised, "engine-c": enginestate.Stale}},
		{"records removed", func() {
			for _, k := range []string{"operator.engine-a", "penalty." + model + ".engine-b"} {
				if err := f.engines.Delete(context.Background(), k); err != nil {
					t.Fatal(err)
				}
			}
		}, map[string]enginestate.State{"engine-a": enginestate.Up, "engine-b": enginestate.Up, "engine-c": enginestate.Stale}},
		{"engine-b reports health 0, engine-c comes back", func() {
			f.engine("engine-b", messages.StatusUp, 100, 0, 0)
			f.engine("engine-c", messages.StatusUp, 80, 1, 60)
		}, map[string]enginestate.State{"engine-a": enginestate.Up, "engine-b": enginestate.Ejected, "engine-c": enginestate.Up}},
	}
	for _, s := range steps {
		s.do()
		testenv.WaitFor(t, 5*time.Second, s.name, func() bool {
			got := states()
			for e, want := range s.want {
				// One series per state, 1 for the engine's.
				if got[e].State != want || testenv.MetricSum(t, reg, "switchyard_dashboard_engine_state", map[string]string{"engine": e, "state": string(want)}) != 1 ||
					testenv.MetricSum(t, reg, "switchyard_dashboard_engine_state", map[string]string{"engine": e}) != 1 {
					return false
				}
			}
			return true
		})
	}
	if v := states()["engine-b"]; v.Detail != "reports health 0" || v.Status != messages.StatusUp {
		t.Errorf("engine-b: %+v, want ejected because it reports health 0, status up", v)
	}
}
