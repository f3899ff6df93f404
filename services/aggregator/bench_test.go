package aggregator_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/auth"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/aggregator"
	"github.com/switchyard-dev/switchyard/testenv"
)

// BenchmarkIngest measures the aggregator's ingest rate: b.N signals from
// 10,000 engines are stored in SY_SIGNALS first, then the timer runs while the
// aggregator consumes, folds and writes them all. "secure" runs the server
// in operator mode with TLS, the aggregator on its own identity, as a
// deployment does; "plain" is the anonymous server without TLS.
func BenchmarkIngest(b *testing.B) {
	b.Run("plain", func(b *testing.B) { benchIngest(b, false) })
	b.Run("secure", func(b *testing.B) { benchIngest(b, true) })
}

func benchIngest(b *testing.B, secure bool) {
	const engines = 10000
	var env *testenv.NATS
	dial := func() *nats.Conn { return env.Dial(b, "aggregator") }
	if secure {
		env = testenv.StartSecureNATS(b, auth.Identity{Name: "aggregator", Role: auth.RoleAggregator})
		dial = func() *nats.Conn { return env.DialAs(b, "aggregator") }
	} else {
		env = testenv.StartNATS(b)
	}
	ctx := context.Background()
	js, err := jetstream.New(env.Conn, jetstream.WithPublishAsyncMaxPending(8192))
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	for i := 0; i < b.N; i++ {
		e := i % engines
		data, err := messages.EncodeAt(&messages.EngineSignal{Model: "llama", Engine: fmt.Sprintf("e%05d", e),
			Time: now.UnixMilli() - int64(b.N-i), Seq: uint64(i/engines + 1), TTFTMs: 100, TBTMs: 20, Queue: 2, Running: 8,
			KVUse: 0.5, CapacityRPS: 10, LoadRPS: 8, Replicas: 1, Health: 1}, now)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := js.PublishAsync(fmt.Sprintf("sy.signal.llama.e%05d", e), data); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(2 * time.Minute):
		b.Fatal("publishing timed out")
	}
	reg := prometheus.NewRegistry()
	agg, err := aggregator.New(aggregator.Options{Conn: dial(), Logger: zerolog.Nop(), Registerer: reg,
		StaleAfter: time.Hour, DownAfter: 2 * time.Hour, ForgetAfter: 3 * time.Hour, WriteInterval: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	b.ResetTimer()
	start := time.Now()
	go func() { done <- agg.Run(rctx) }()
	for counter(b, reg, "switchyard_aggregator_signals_total") < float64(b.N) {
		time.Sleep(5 * time.Millisecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "signals/s")
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

func counter(tb testing.TB, reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}
