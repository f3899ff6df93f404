package stack_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestDeletedLayoutUnderLoad runs the stack as `up` runs it, under a load
// well within the fleet's capacity, and deletes SY_SIGNALS, then the other
// streams and buckets one after another, as `nats stream rm` would. Every
// request is answered 200 throughout — no 429 or 503 for healthy engines
// because the control plane lost its state — each deleted stream or bucket
// comes back, and the engines' signals flow into sy_engines again, with no
// engine marked down.
func TestDeletedLayoutUnderLoad(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := startCaseStudy(t, ctx)
	f := s.File()
	js, err := jetstream.New(s.Conn())
	if err != nil {
		t.Fatal(err)
	}
	names := streams.DefaultNames()

	// Load: two clients per router, one request each every 100 ms at most
	// (some 60 req/s over a fleet planned for 280), bounded in count.
	var mu sync.Mutex
	statuses := map[int]int{}
	var failures []string
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 10 * time.Second}
	body := fmt.Sprintf(`{"model":%q,"max_tokens":8,"messages":[{"role":"user","content":"hello"}]}`, f.Model)
	for _, r := range s.Routers() {
		for w := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(100 * time.Millisecond)
				defer tick.Stop()
				for n := 0; n < 2000; n++ {
					select {
					case <-loadCtx.Done():
						return
					case <-tick.C:
					}
					req, _ := http.NewRequestWithContext(loadCtx, http.MethodPost, "http://"+r.Addr()+"/v1/chat/completions", strings.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("X-Session-Id", fmt.Sprintf("s-%d-%d", w, n%50))
					resp, err := client.Do(req)
					if err != nil {
						if loadCtx.Err() == nil {
							mu.Lock()
							failures = append(failures, err.Error())
							mu.Unlock()
						}
						continue
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					mu.Lock()
					statuses[resp.StatusCode]++
					if resp.StatusCode != http.StatusOK && len(failures) < 20 {
						failures = append(failures, fmt.Sprintf("%d %s", resp.StatusCode, b))
					}
					mu.Unlock()
				}
			}()
		}
	}
	defer func() { stopLoad(); wg.Wait() }()

	signals := func() map[string]uint64 {
		out := map[string]uint64{}
		b, err := js.KeyValue(ctx, names.EnginesBucket)
		if err != nil {
			return out
		}
		for _, e := range f.Engines {
			key, _ := streams.EngineKey(f.Model, e.Name)
			v, err := b.Get(ctx, key)
			if err != nil {
				continue
			}
			var st messages.EngineState
			if err := messages.DecodeInto(v.Value(), &st); err != nil {
				t.Errorf("%s's state does not decode: %v", e.Name, err)
				continue
			}
			if st.Status == messages.StatusDown {
				t.Errorf("%s marked down while it serves: %+v", e.Name, st)
			}
			out[e.Name] = st.Signals
		}
		return out
	}
	time.Sleep(2 * time.Second)
	generations := func() []uint64 {
		var out []uint64
		for _, r := range s.Routers() {
			snap, _ := r.Store().Snapshot(f.Model)
			out = append(out, snap.Generation)
		}
		return out
	}

	// No engine may be marked down from the first deletion to the end,
	// when the old failure had marked every engine down: watched every
	// 250 ms while the deletions go on one after another, and for the
	// aggregator's down-after (6 s) and 2 s more after the last one, so that
	// every deletion is watched for at least that long.
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			signals()
			select {
			case <-watchCtx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	defer func() { stopWatch(); <-watched }()
	for _, name := range []string{names.SignalStream, names.ReportStream, streams.BucketStream(names.EnginesBucket),
		streams.BucketStream(names.DemandBucket), streams.BucketStream(names.WeightsBucket)} {
		before, gens := signals(), generations()
		if err := js.DeleteStream(ctx, name); err != nil {
			t.Fatalf("delete %s: %v", name, err)
		}
		start := time.Now()
		testenv.WaitFor(t, 5*time.Second, name+" re-created", func() bool {
			_, err := js.Stream(ctx, name)
			return err == nil
		})
		back := time.Since(start)
		testenv.WaitFor(t, 6*time.Second, "signals folded in again after deleting "+name, func() bool {
			now := signals()
			for _, e := range f.Engines {
				if now[e.Name] == 0 || (now[e.Name] <= before[e.Name] && name != streams.BucketStream(names.EnginesBucket)) {
					return false
				}
			}
			return true
		})
		t.Logf("%s deleted: back after %s, signals folded in again after %s", name, back.Round(time.Millisecond), time.Since(start).Round(10*time.Millisecond))
		if name == streams.BucketStream(names.WeightsBucket) {
			// Routers install snapshots from the re-created bucket.
			testenv.WaitFor(t, 5*time.Second, "every router installs a snapshot from the re-created weights bucket", func() bool {
				for i, g := range generations() {
					if g <= gens[i] {
						return false
					}
				}
				return true
			})
			t.Logf("weights bucket deleted: routers on generations %v after %v, %s after the deletion", generations(), gens, time.Since(start).Round(10*time.Millisecond))
		}
	}
	// The load stays on, and the watch on, past the down-after of the last
	// deletion.
	select {
	case <-ctx.Done():
	case <-time.After(8 * time.Second):
	}
	stopWatch()
	<-watched
	stopLoad()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("answers: %v", statuses)
	if len(failures) > 0 || len(statuses) != 1 || statuses[http.StatusOK] < 500 {
		t.Fatalf("answers %v, want only 200s; first failures: %q", statuses, failures)
	}
}
