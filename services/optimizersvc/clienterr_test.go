package optimizersvc_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/services/aggregator"
	"github.com/switchyard-dev/switchyard/services/optimizersvc"
	"github.com/switchyard-dev/switchyard/testenv"
)

// longEngine is an engine on 127.0.0.1 that answers a request whose prompt
// is over its context window ("TOO-LONG" in the body) as vLLM does (400
// BadRequestError, "maximum context length"), or with tooLong when set, and
// every other request with a small completion.
type longEngine struct {
	name     string
	srv      *httptest.Server
	tooLong  atomic.Int32 // status for too-long prompts (400 unless set)
	rejected atomic.Int64 // too-long prompts answered
}

func newLongEngine(t *testing.T, name string) *longEngine {
	e := &longEngine{name: name}
	e.tooLong.Store(http.StatusBadRequest)
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(string(body), "TOO-LONG") {
			e.rejected.Add(1)
			st := int(e.tooLong.Load())
			w.WriteHeader(st)
			fmt.Fprintf(w, `{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 9000 tokens (8744 in the messages, 256 in the completion).","type":"BadRequestError","param":null,"code":%d}`, st)
			return
		}
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`, model)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// TestClientErrorsDoNotPenalise runs a real router (HTTP front, reporter
// on NATS), the aggregator and the optimizer against engines on 127.0.0.1:
// ten requests that one engine answers with vLLM's context-length 400
// change neither that engine's health as the router and the aggregator see
// it nor its penalty, while ten 5xx answers from the same engine for the
// same requests get it penalised (the chain does blame engines).
func TestClientErrorsDoNotPenalise(t *testing.T) {
	env := testenv.StartNATS(t)
	agg, err := aggregator.New(aggregator.Options{Conn: env.Dial(t, "aggregator"), Logger: zerolog.Nop(), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()

	names := []string{"engine-a", "engine-b", "engine-c"}
	engines := map[string]*longEngine{}
	var tableEngines []selection.Engine
	for _, n := range names {
		engines[n] = newLongEngine(t, n)
		tableEngines = append(tableEngines, selection.Engine{Name: n, URL: engines[n].srv.URL, Weight: 1.0 / 3})
	}
	// Signals: every engine healthy, at half its capacity.
	wg.Add(2)
	go func() { defer wg.Done(); _ = agg.Run(ctx) }()
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for seq := uint64(1); ; seq++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for _, n := range names {
				data, err := messages.Encode(&messages.EngineSignal{Model: model, Engine: n, Time: time.Now().UnixMilli(), Seq: seq,
					TTFTMs: 300, TBTMs: 5, OutputTokens: 100, LoadRPS: 40, CapacityRPS: 80, Replicas: 1, Health: 1})
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := env.JS.Publish(ctx, "sy.signal."+model+"."+n, data); err != nil && ctx.Err() == nil {
					t.Error(err)
				}
			}
		}
	}()
	dem := kv(t, env.JS, env.Names.DemandBucket)
	putDemand(t, dem, "A", 90)
	putDemand(t, dem, "C", 40)
	optReg := prometheus.NewRegistry()
	start(t, env, optimizersvc.Options{Instance: "opt-1", Clusters: []string{"A", "B", "C"}, PreferConfiguredNetwork: true,
		Registerer: optReg})

	// The router of cluster B: a static table over the three engines, its
	// outcomes reported every 200 ms.
	repReg := prometheus.NewRegistry()
	tables := router.NewStaticTables()
	table, err := selection.NewTable(tableEngines, selection.TableOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tables.Set(model, table, control.Info{Generation: 1, Mode: control.ModeSnapshot, Created: time.Now()})
	rep, err := control.NewReporter(control.ReporterOptions{Conn: env.Dial(t, "router-B-1"), Cluster: "B", Router: "B-1",
		Interval: 200 * time.Millisecond, Tables: tables, Logger: zerolog.Nop(), Registry: repReg})
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = rep.Run(ctx) }()
	h, err := router.NewHandler(router.Options{Tables: tables, Cluster: "B", Observer: rep, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(h)
	defer front.Close()
	client := front.Client()
	post := func(content string) (int, string) {
		body := fmt.Sprintf(`{"model":%q,"max_tokens":256,"messages":[{"role":"user","content":%q}]}`, model, content)
		resp, err := client.Post(front.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("x-switchyard-engine")
	}
	// Valid traffic to every engine (distinct prompts spread by weight),
	// bounded: at most 20 s at 25 req/s.
	trafficCtx, stopTraffic := context.WithTimeout(ctx, 20*time.Second)
	defer stopTraffic()
	var valid atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(40 * time.Millisecond)
		defer tick.Stop()
		for i := 0; trafficCtx.Err() == nil; i++ {
			select {
			case <-trafficCtx.Done():
				return
			case <-tick.C:
			}
			if st, _ := post(fmt.Sprintf("question %d", i)); st == http.StatusOK {
				valid.Add(1)
			}
		}
	}()
	eng := kv(t, env.JS, env.Names.EnginesBucket)
	state := func(engine string) *messages.EngineState {
		e, err := eng.Get(context.Background(), model+"."+engine)
		if err != nil {
			return nil
		}
		var st messages.EngineState
		if err := messages.DecodeInto(e.Value(), &st); err != nil {
			t.Fatal(err)
		}
		return &st
	}
	testenv.WaitFor(t, 10*time.Second, "every engine's outcomes folded", func() bool {
		for _, n := range names {
			if st := state(n); st == nil || st.Outcomes == nil || st.Outcomes.LastSent == 0 {
				return false
			}
		}
		return true
	})

	// Ten requests over the context window: one prompt, so one engine (the
	// affinity key), which answers 400 each time.
	var victim string
	for i := 0; i < 10; i++ {
		st, e := post("TOO-LONG " + strings.Repeat("word ", 50))
		if st != http.StatusBadRequest {
			t.Fatalf("too-long request %d: %d, want the engine's 400 relayed", i, st)
		}
		if victim == "" {
			victim = e
		} else if e != victim {
			t.Fatalf("too-long request %d went to %s, the others to %s", i, e, victim)
		}
	}
	if n := engines[victim].rejected.Load(); n != 10 {
		t.Fatalf("%s answered %d too-long requests, want 10 (no retries elsewhere)", victim, n)
	}
	for _, n := range names {
		if n != victim && engines[n].rejected.Load() != 0 {
			t.Errorf("a client error was retried on %s", n)
		}
	}
	t.Logf("10 client errors answered by %s", victim)
	// Reports carry them as client errors; for 3 s (15 report intervals,
	// three times the evidence age) neither the aggregator nor the optimizer
	// counts them against the engine.
	sentAt := time.Now()
	deadline := sentAt.Add(3 * time.Second)
	for time.Now().Before(deadline) {
		st := state(victim)
		if o := st.Outcomes; o.ErrorRate.Fast != 0 || o.ErrorRate.Slow != 0 || o.FailedIntervals != 0 {
			t.Fatalf("%s's outcomes blame it: %+v", victim, o)
		}
		if st.Health != 1 {
			t.Fatalf("%s's health %v", victim, st.Health)
		}
		if _, err := eng.Get(context.Background(), "penalty."+model+"."+victim); err == nil {
			t.Fatalf("%s penalised for client errors", victim)
		}
		if n := testenv.MetricSum(t, optReg, "switchyard_optimizer_penalties_total", nil); n != 0 {
			t.Fatalf("%v penalties", n)
		}
		if h.Live(model).Engine(victim).Ejected() {
			t.Fatalf("%s ejected by the router", victim)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if st := state(victim); time.UnixMilli(st.Outcomes.LastReport).Before(sentAt) {
		t.Fatalf("no report folded since the client errors (last %v)", time.UnixMilli(st.Outcomes.LastReport))
	}

	// The same ten requests, answered 500 by the same engine (retried
	// elsewhere): the engine is blamed and penalised.
	engines[victim].tooLong.Store(http.StatusInternalServerError)
	for _, n := range names {
		if n != victim {
			engines[n].tooLong.Store(http.StatusOK)
		}
	}
	for i := 0; i < 10; i++ {
		post("TOO-LONG " + strings.Repeat("word ", 50))
	}
	testenv.WaitFor(t, 5*time.Second, victim+" penalised for its 5xx", func() bool {
		_, err := eng.Get(context.Background(), "penalty."+model+"."+victim)
		return err == nil
	})
	if valid.Load() == 0 {
		t.Error("no valid request served")
	}
}
