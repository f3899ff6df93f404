package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-dev/switchyard/messages"
)

// requestBody is the benchmark request: non-streamed chat, one output token.
var requestBody = []byte(`{"model":"bench","messages":[{"role":"user","content":"hello"}],"max_tokens":1}`)

// doer sends one request and waits for the whole answer.
type doer func(ctx context.Context) error

// httpDoer posts requestBody to url with a keep-alive client of its own.
func httpDoer(url string, conns int) (doer, func()) {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(requestBody))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}, tr.CloseIdleConnections
}

// natsDoer sends requestBody to subject by NATS request-reply and waits for
// the one (last) reply of a non-streamed answer.
func natsDoer(nc *nats.Conn, subject string) doer {
	return func(ctx context.Context) error {
		m := nats.NewMsg(subject)
		m.Data = requestBody
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		r, err := nc.RequestMsgWithContext(ctx, m)
		if err != nil {
			return err
		}
		if s := r.Header.Get(messages.HeaderStatus); s != "200" {
			return fmt.Errorf("status %q: %s", s, r.Data)
		}
		if r.Header.Get(messages.HeaderLast) != "true" {
			return fmt.Errorf("reply not marked last")
		}
		return nil
	}
}

// result is one measured phase.
type result struct {
	n, errs  int
	firstErr error
	elapsed  time.Duration
	lat      []time.Duration // sorted
	late     int             // open loop: requests that found every worker busy
}

func (r result) rps() float64 { return float64(r.n) / r.elapsed.Seconds() }

// pct returns the q-quantile (nearest rank) of the sorted latencies.
func (r result) pct(q float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	i := int(q*float64(len(r.lat))+0.5) - 1
	i = max(0, min(i, len(r.lat)-1))
	return r.lat[i]
}

type collector struct {
	mu       sync.Mutex
	lat      []time.Duration
	errs     int
	firstErr error
}

func (c *collector) add(lat []time.Duration, errs int, firstErr error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lat = append(c.lat, lat...)
	c.errs += errs
	if c.firstErr == nil {
		c.firstErr = firstErr
	}
}

func (c *collector) result(elapsed time.Duration, late int) result {
	slices.Sort(c.lat)
	return result{n: len(c.lat), errs: c.errs, firstErr: c.firstErr, elapsed: elapsed, lat: c.lat, late: late}
}

// closedLoop runs conc workers, each sending its next request when the
// previous one is answered, until n requests are done or d has passed.
func closedLoop(ctx context.Context, do doer, conc, n int, d time.Duration) result {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var next atomic.Int64
	var c collector
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, n/conc+1)
			errs := 0
			var firstErr error
			for ctx.Err() == nil && next.Add(1) <= int64(n) {
				t := time.Now()
				err := do(ctx)
				if ctx.Err() != nil {
					break // cut by the deadline: not a result
				}
				if err != nil {
					errs++
					if firstErr == nil {
						firstErr = err
					}
					continue
				}
				lat = append(lat, time.Since(t))
			}
			c.add(lat, errs, firstErr)
		}()
	}
	wg.Wait()
	return c.result(time.Since(start), 0)
}

// openLoop offers rate requests per second, evenly spaced, until n have
// been offered or d has passed, to a pool of workers; latency runs from the
// moment a request is handed to the pool to its complete answer, so a slow
// server is charged for the queueing it causes (but not the pacer's own
// timer lateness). A request due while every worker is busy is counted late
// and still sent.
func openLoop(ctx context.Context, do doer, rate float64, workers, n int, d time.Duration) result {
	ctx, cancel := context.WithTimeout(ctx, d+10*time.Second)
	defer cancel()
	due := make(chan time.Time, n)
	var c collector
	var wg sync.WaitGroup
	var busy atomic.Int64
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			errs := 0
			var firstErr error
			for t := range due {
				busy.Add(1)
				err := do(ctx)
				busy.Add(-1)
				if err != nil {
					errs++
					if firstErr == nil {
						firstErr = err
					}
					continue
				}
				lat = append(lat, time.Since(t))
			}
			c.add(lat, errs, firstErr)
		}()
	}
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	late := 0
	for i := range n {
		t := start.Add(time.Duration(i) * interval)
		if t.Sub(start) > d || ctx.Err() != nil {
			break
		}
		if w := time.Until(t); w > 0 {
			time.Sleep(w)
		}
		if busy.Load() >= int64(workers) {
			late++
		}
		due <- time.Now() // not t: the sleep's own lateness is not the server's
	}
	close(due)
	wg.Wait()
	return c.result(time.Since(start), late)
}
