package stack_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/aggregator"
	"github.com/switchyard-dev/switchyard/stack"
	"github.com/switchyard-dev/switchyard/testenv"

	"github.com/nats-io/nats.go/jetstream"
)

// TestSignalPathWithSimulatedEngines runs the case-study stack — embedded
// JetStream, the aggregator and three simulated engines under steady load —
// and checks that sy_engines follows what each engine measured, and that a
// stopped engine becomes down within the configured bound.
func TestSignalPathWithSimulatedEngines(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const downAfter = time.Second
	s, err := stack.Start(ctx, stack.Options{DataDir: t.TempDir(), NATSPort: -1, SignalInterval: 200 * time.Millisecond, RouterAddr: "127.0.0.1:0",
		Logger: zerolog.Nop(), Aggregator: aggregator.Options{StaleAfter: 400 * time.Millisecond, DownAfter: downAfter, WriteInterval: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	js, err := jetstream.New(s.Conn())
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, "sy_engines")
	if err != nil {
		t.Fatal(err)
	}

	// Steady load: each engine gets a short completion every 20 ms, so that
	// every 200 ms signal averages about ten requests.
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 10 * time.Second}
	for _, e := range s.Engines() {
		url := e.URL() + "/v1/completions"
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(80 * time.Millisecond)
				defer tick.Stop()
				for n := 0; n < 1000; n++ {
					select {
					case <-loadCtx.Done():
						return
					case <-tick.C:
					}
					body := []byte(`{"model":"llama","prompt":"hello there, engine","max_tokens":8}`)
					req, _ := http.NewRequestWithContext(loadCtx, http.MethodPost, url, bytes.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					resp, err := client.Do(req)
					if err != nil {
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
	}
	defer func() { stopLoad(); wg.Wait() }()

	state := func(engine string) *messages.EngineState {
		e, err := kv.Get(ctx, "llama."+engine)
		if err != nil {
			return nil
		}
		var st messages.EngineState
		if err := messages.DecodeInto(e.Value(), &st); err != nil {
			t.Fatalf("state of %s: %v", engine, err)
		}
		return &st
	}
	within := func(got, want float64) bool { return want > 0 && math.Abs(got-want) <= 0.05*want }
	var last string
	converged := func() bool {
		for _, e := range s.Engines() {
			st := state(e.Name())
			m := e.Stats()
			if st == nil || m.Completed < 20 {
				last = fmt.Sprintf("%s: no state or too few completions yet", e.Name())
				return false
			}
			ttft, tbt := float64(m.MeanTTFT)/1e6, float64(m.MeanTBT)/1e6
			if !within(st.TTFTMs.Fast, ttft) || !within(st.TBTMs.Fast, tbt) {
				last = fmt.Sprintf("%s: EWMA TTFT %.2f vs measured %.2f ms, TBT %.2f vs %.2f ms", e.Name(), st.TTFTMs.Fast, ttft, st.TBTMs.Fast, tbt)
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(20 * time.Second); !converged(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("EWMA TTFT and TBT not within 5%% of each engine's own measurements after 20s: %s", last)
		}
	}

	// One engine stops: down within DownAfter plus a write interval or two.
	victim := s.Engines()[2]
	if err := victim.Close(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	testenv.WaitFor(t, 5*time.Second, victim.Name()+" down", func() bool {
		st := state(victim.Name())
		return st != nil && st.Status == messages.StatusDown
	})
	if took := time.Since(stopped); took > downAfter+500*time.Millisecond {
		t.Fatalf("%s went down %s after it stopped; the bound is %s (+ signal and write intervals)", victim.Name(), took, downAfter)
	}
	for _, e := range s.Engines()[:2] {
		if st := state(e.Name()); st.Status != messages.StatusUp {
			t.Fatalf("%s is %s, want up", e.Name(), st.Status)
		}
	}
}
