package router_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/testenv"
)

// httpEngine is a minimal OpenAI-ish engine on a loopback socket.
type httpEngine struct {
	name     string
	srv      *httptest.Server
	requests atomic.Int64
	probes   atomic.Int64
}

func newHTTPEngine(t *testing.T, name string) *httpEngine {
	t.Helper()
	e := &httpEngine{name: name}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			e.probes.Add(1)
			_, _ = io.WriteString(w, "ok")
			return
		}
		e.requests.Add(1)
		body, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"x","object":"chat.completion","engine":%q}`, name)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 3; i++ {
			fmt.Fprintf(w, "data: {\"i\":%d,\"engine\":%q}\n\n", i, name)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// fakeSignal describes one engine whose signals a test publishes.
type fakeSignal struct {
	model, engine string
	capacity      float64
	health        float64
	url, subject  string
	// queue, running and maxRunning are the engine's reported load.
	queue, running, maxRunning int
}

// signalPublisher publishes signals for engines every interval over core
// NATS (which the SY_SIGNALS stream also captures) until the test ends.
type signalPublisher struct {
	mu      sync.Mutex
	engines map[string]fakeSignal
	seq     uint64
}

func publishSignals(t *testing.T, nc *nats.Conn, names streams.Names, every time.Duration, engines ...fakeSignal) *signalPublisher {
	t.Helper()
	p := &signalPublisher{engines: map[string]fakeSignal{}}
	for _, e := range engines {
		p.set(e)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			p.publishAll(nc, names)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return p
}

func (p *signalPublisher) set(e fakeSignal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.engines[e.model+"."+e.engine] = e
}

func (p *signalPublisher) publishAll(nc *nats.Conn, names streams.Names) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.engines {
		p.seq++
		sig := &messages.EngineSignal{Model: e.model, Engine: e.engine, Time: time.Now().UnixMilli(), Seq: p.seq,
			CapacityRPS: e.capacity, Health: e.health, Replicas: 1,
			Queue: e.queue, Running: e.running, MaxRunning: e.maxRunning}
		if e.url != "" {
			sig.Transports = append(sig.Transports, messages.Transport{Kind: messages.TransportHTTP, Address: e.url})
		}
		if e.subject != "" {
			sig.Transports = append(sig.Transports, messages.Transport{Kind: messages.TransportNATS, Address: e.subject})
		}
		data, err := messages.Encode(sig)
		if err != nil {
			panic(err)
		}
		subj, _ := names.SignalSubject(e.model, e.engine)
		_ = nc.Publish(subj, data)
	}
}

// putSnapshot writes a weight snapshot to sy_weights.
func putSnapshot(t *testing.T, js jetstream.JetStream, names streams.Names, snap messages.WeightSnapshot) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, names.WeightsBucket)
	if err != nil {
		t.Fatalf("weights bucket: %v", err)
	}
	data, err := messages.Encode(&snap)
	if err != nil {
		t.Fatalf("encode snapshot: %v", err)
	}
	key, _ := streams.WeightsKey(snap.Model, snap.Cluster)
	if _, err := kv.Put(ctx, key, data); err != nil {
		t.Fatalf("put snapshot: %v", err)
	}
}

func snapshot(model, cluster string, gen uint64, at time.Time, weights map[string]float64) messages.WeightSnapshot {
	sum := 0.0
	for _, w := range weights {
		sum += w
	}
	return messages.WeightSnapshot{Model: model, Cluster: cluster, Generation: gen, Time: at.UnixMilli(),
		Weights: weights, ShedFraction: max(0, 1-sum)}
}

// runService starts a router service and stops it (checking a clean stop)
// when the test ends.
func runService(t *testing.T, opts router.ServiceOptions) *router.Service {
	t.Helper()
	if opts.HTTPAddr == "" {
		opts.HTTPAddr = "127.0.0.1:0"
	}
	svc, err := router.NewService(opts)
	if err != nil {
		t.Fatalf("NewService: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("service Run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("service did not stop within 15s")
		}
	})
	return svc
}

func chatJSON(model string, stream bool, content string) string {
	b, _ := json.Marshal(map[string]any{"model": model, "stream": stream,
		"messages": []map[string]string{{"role": "user", "content": content}}})
	return string(b)
}

// postChat posts a chat request to a router and returns status, the
// x-switchyard-engine header and the body.
func postChat(t *testing.T, client *http.Client, addr, body, session string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if session != "" {
		req.Header.Set("X-Session-Id", session)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Switchyard-Engine"), string(b)
}

func readiness(t *testing.T, addr string) router.Readiness {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatalf("GET /readyz: %v", err)
	}
	defer resp.Body.Close()
	var rd router.Readiness
	if err := json.NewDecoder(resp.Body).Decode(&rd); err != nil {
		t.Fatalf("decode /readyz: %v", err)
	}
	return rd
}

// waitInstalled polls until the router's store holds generation gen of model.
func waitInstalled(t *testing.T, s *control.SnapshotStore, model string, gen uint64, timeout time.Duration) {
	t.Helper()
	testenv.WaitFor(t, timeout, fmt.Sprintf("generation %d of %s installed", gen, model), func() bool {
		_, info, ok := s.Table(model)
		return ok && info.Generation == gen && info.Mode == control.ModeSnapshot
	})
}
