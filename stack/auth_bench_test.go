package stack_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/auth"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/services/aggregator"
	"github.com/switchyard-dev/switchyard/services/optimizersvc"
	"github.com/switchyard-dev/switchyard/testenv"
)

// The cost of identities and TLS on the bus (issue 20), each benchmark
// with a "plain" server (anonymous, no TLS) and a "secure" one (operator
// mode, every component on its own identity, TLS on the client port), the
// components connected over loopback TCP as separate processes would be.
// With -count N the two run alternately, N times each.

// benchBus is a NATS server for a benchmark and a way to connect to it as
// an identity (anonymously on a plain server).
type benchBus struct {
	env *testenv.NATS
}

func startBenchBus(b *testing.B, secure bool) benchBus {
	b.Helper()
	if !secure {
		return benchBus{env: testenv.StartNATS(b)}
	}
	return benchBus{env: testenv.StartSecureNATS(b,
		auth.Identity{Name: "aggregator", Role: auth.RoleAggregator},
		auth.Identity{Name: "optimizer", Role: auth.RoleOptimizer},
		auth.Identity{Name: "router-A", Role: auth.RoleRouter, Cluster: "A", Router: "A-1"},
		auth.Identity{Name: "e1", Role: auth.RoleEngine, Model: "llama"},
		auth.Identity{Name: "e2", Role: auth.RoleEngine, Model: "llama"})}
}

func (bb benchBus) dial(b *testing.B, identity string) *nats.Conn {
	b.Helper()
	if bb.env.Auth == nil {
		return bb.env.Dial(b, identity)
	}
	return bb.env.DialAs(b, identity)
}

func forBoth(b *testing.B, fn func(b *testing.B, secure bool)) {
	b.Run("plain", func(b *testing.B) { fn(b, false) })
	b.Run("secure", func(b *testing.B) { fn(b, true) })
}

// BenchmarkSignalToSnapshot measures the control plane's reaction time:
// from an engine's signal announcing a new capacity to the router holding
// a weight snapshot that reflects it, through the aggregator (SY_SIGNALS →
// sy_engines, its default 250 ms write interval), the optimizer service
// (sy_engines → sy_weights) and the router's watch. Two engines of 100
// req/s serve cluster A's 60 req/s; each operation halves e1's capacity or
// restores it. It reports the median and the 90th percentile.
func BenchmarkSignalToSnapshot(b *testing.B) {
	forBoth(b, benchSignalToSnapshot)
}

func benchSignalToSnapshot(b *testing.B, secure bool) {
	bus := startBenchBus(b, secure)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := zerolog.Nop()
	agg, err := aggregator.New(aggregator.Options{Conn: bus.dial(b, "aggregator"), Logger: log, Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	opt, err := optimizersvc.New(optimizersvc.Options{Conn: bus.dial(b, "optimizer"), Instance: "bench", Clusters: []string{"A"},
		MinDemandRPS: 60, NetworkMs: map[string]map[string]float64{"A": {"e1": 1, "e2": 1}}, PreferConfiguredNetwork: true,
		Logger: log, Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	rs, err := router.NewService(router.ServiceOptions{Conn: bus.dial(b, "router-A"), Cluster: "A", Router: "A-1",
		NoNATSFront: true, NoMetrics: true, Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{}, 3)
	for _, run := range []func(context.Context) error{agg.Run, opt.Run, rs.Run} {
		go func() { _ = run(ctx); done <- struct{}{} }()
	}
	defer func() {
		cancel()
		for range 3 {
			<-done
		}
	}()

	// The engines signal every 200 ms, as `switchyard up`'s do; e1's
	// capacity is what the operations change.
	var capE1 atomic.Int64
	capE1.Store(100)
	conns := map[string]*nats.Conn{"e1": bus.dial(b, "e1"), "e2": bus.dial(b, "e2")}
	var seq atomic.Uint64
	signal := func(engine string, capacity float64) {
		data, err := messages.Encode(&messages.EngineSignal{Model: "llama", Engine: engine, Time: time.Now().UnixMilli(),
			Seq: seq.Add(1), TTFTMs: 100, TBTMs: 10, OutputTokens: 50, CapacityRPS: capacity, LoadRPS: 30, Replicas: 1, Health: 1,
			Transports: []messages.Transport{{Kind: messages.TransportNATS, Address: "sy.infer.llama." + engine}}})
		if err != nil {
			b.Error(err)
			return
		}
		_ = conns[engine].Publish("sy.signal.llama."+engine, data)
		_ = conns[engine].Flush()
	}
	go func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			signal("e1", float64(capE1.Load()))
			signal("e2", 100)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	weight := func() (uint64, float64, bool) {
		snap, ok := rs.Store().Snapshot("llama")
		return snap.Generation, snap.Weights["e1"], ok
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, w, ok := weight(); ok && w > 0.4 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("the router holds no snapshot splitting cluster A's traffic between e1 and e2 within 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		gen0, w0, _ := weight()
		lower := i%2 == 0
		next := int64(100)
		if lower {
			next = 50
		}
		start := time.Now()
		capE1.Store(next)
		signal("e1", float64(next))
		for {
			gen, w, _ := weight()
			if gen > gen0 && ((lower && w < w0-0.02) || (!lower && w > w0+0.02)) {
				break
			}
			if time.Since(start) > 10*time.Second {
				b.Fatalf("operation %d: e1's weight %.3f (generation %d) did not follow its capacity %d within 10 s", i, w, gen, next)
			}
			time.Sleep(time.Millisecond)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	reportQuantiles(b, lat)
}

// BenchmarkNATSForward measures one request-reply over NATS to an engine
// that answers at once (a fixed completion): "raw" sends it to the engine's
// sy.infer subject, "routed" to the router's sy.req subject (the router
// forwards it to the engine over NATS and relays the answer).
func BenchmarkNATSForward(b *testing.B) {
	forBoth(b, func(b *testing.B, secure bool) {
		bus := startBenchBus(b, secure)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// The engine answers at once with a fixed completion, so that what
		// is measured is the bus and the router, and signals every 200 ms.
		enc := bus.dial(b, "e1")
		answer := []byte(`{"id":"x","object":"chat.completion","model":"llama","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
		if _, err := enc.Subscribe("sy.infer.llama.e1", func(m *nats.Msg) {
			out := nats.NewMsg(m.Reply)
			out.Header.Set(messages.HeaderStatus, "200")
			out.Header.Set(messages.HeaderLast, "true")
			out.Data = answer
			_ = enc.PublishMsg(out)
		}); err != nil {
			b.Fatal(err)
		}
		go func() {
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for seq := uint64(1); ; seq++ {
				data, err := messages.Encode(&messages.EngineSignal{Model: "llama", Engine: "e1", Time: time.Now().UnixMilli(), Seq: seq,
					TTFTMs: 1, TBTMs: 1, OutputTokens: 2, CapacityRPS: 10000, Replicas: 1, Health: 1,
					Transports: []messages.Transport{{Kind: messages.TransportNATS, Address: "sy.infer.llama.e1"}}})
				if err == nil {
					_ = enc.Publish("sy.signal.llama.e1", data)
				}
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
		rs, err := router.NewService(router.ServiceOptions{Conn: bus.dial(b, "router-A"), Cluster: "A", Router: "A-1",
			NoMetrics: true, PreferNATS: true, Logger: zerolog.Nop()})
		if err != nil {
			b.Fatal(err)
		}
		rdone := make(chan struct{})
		go func() { _ = rs.Run(ctx); close(rdone) }()
		defer func() { cancel(); <-rdone }()
		if err := enc.Flush(); err != nil {
			b.Fatal(err)
		}
		client := bus.env.Dial(b, "client") // admin: may call the engine directly
		body := []byte(`{"model":"llama","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`)
		ask := func(subject string) error {
			m := nats.NewMsg(subject)
			m.Data = body
			r, err := client.RequestMsg(m, 5*time.Second)
			if err != nil {
				return err
			}
			if s := r.Header.Get(messages.HeaderStatus); s != "200" || r.Header.Get(messages.HeaderLast) != "true" {
				return fmt.Errorf("status %q, last %q: %s", s, r.Header.Get(messages.HeaderLast), r.Data)
			}
			return nil
		}
		deadline := time.Now().Add(20 * time.Second)
		for ask("sy.req.A.llama") != nil {
			if time.Now().After(deadline) {
				b.Fatalf("the router does not answer on sy.req.A.llama within 20 s: %v", ask("sy.req.A.llama"))
			}
			time.Sleep(20 * time.Millisecond)
		}
		for _, path := range []struct{ name, subject string }{{"raw", "sy.infer.llama.e1"}, {"routed", "sy.req.A.llama"}} {
			b.Run(path.name, func(b *testing.B) {
				lat := make([]time.Duration, 0, b.N)
				for i := 0; i < b.N; i++ {
					start := time.Now()
					if err := ask(path.subject); err != nil {
						b.Fatalf("request %d on %s: %v", i, path.subject, err)
					}
					lat = append(lat, time.Since(start))
				}
				b.StopTimer()
				reportQuantiles(b, lat)
			})
		}
	})
}

// reportQuantiles reports the median and 90th percentile of lat in µs.
func reportQuantiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) }
	b.ReportMetric(q(0.5), "p50-µs")
	b.ReportMetric(q(0.9), "p90-µs")
}
