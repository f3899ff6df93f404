package stack_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/services/loadgen"
	"github.com/switchyard-dev/switchyard/stack"
	"github.com/switchyard-dev/switchyard/testenv"
	"github.com/switchyard-dev/switchyard/workload"
)

// logRecorder keeps every JSON line a zerolog.Logger writes, safe for
// concurrent writers.
type logRecorder struct {
	mu    sync.Mutex
	lines [][]byte
}

func (r *logRecorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, bytes.Clone(p))
	return len(p), nil
}

// mark returns how many lines were written so far.
func (r *logRecorder) mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.lines)
}

// worseThanInfo returns the lines from the from-th on whose level is warn or worse.
func (r *logRecorder) worseThanInfo(t *testing.T, from int) []string {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, l := range r.lines[from:] {
		sc := bufio.NewScanner(bytes.NewReader(l))
		for sc.Scan() {
			var m struct {
				Level string `json:"level"`
			}
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Fatalf("log line %q is not JSON: %v", sc.Text(), err)
			}
			if lvl, err := zerolog.ParseLevel(m.Level); err != nil || lvl >= zerolog.WarnLevel {
				out = append(out, sc.Text())
			}
		}
	}
	return out
}

// TestCleanShutdownLogsNoWarnings stops the whole stack — embedded NATS,
// aggregator, optimizer, routers, engines — as `switchyard up` does on
// Ctrl-C, with and without requests in flight, and requires that the stop
// logs nothing at warn or above: cancelled contexts, closed connections and
// consumers going away are what a stop is, not faults.
func TestCleanShutdownLogsNoWarnings(t *testing.T) {
	cases := []struct {
		name string
		load bool // requests in flight at the stop (`up --load`)
	}{
		{"idle", false},
		{"under load", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var rec logRecorder
			log := zerolog.New(&rec).Level(zerolog.InfoLevel).With().Timestamp().Logger()
			s, err := stack.Start(ctx, stack.Options{DataDir: t.TempDir(), NATSPort: -1, RouterAddr: "127.0.0.1:0", Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			closed := false
			defer func() {
				if !closed {
					s.Close()
				}
			}()
			waitSnapshots(t, s, s.File().Model)
			lctx, stopLoad := context.WithCancel(ctx)
			var wg sync.WaitGroup
			if c.load {
				f := s.File()
				for i, r := range s.Routers() {
					wg.Add(1)
					go func() {
						defer wg.Done()
						reqs := workload.Poisson(workload.PoissonOptions{Rate: f.Clusters[i].DemandRPS / 4, Duration: 30 * time.Second,
							PromptTokens: 64, OutputTokens: 64, Sessions: 50, Seed: uint64(i + 1)})
						_, _ = loadgen.Run(lctx, loadgen.Options{URL: "http://" + r.Addr(), Model: f.Model, Requests: reqs, StreamFraction: 0.5})
					}()
				}
				testenv.WaitFor(t, 10*time.Second, "requests in flight on every router", func() bool {
					for _, r := range s.Routers() {
						if testenv.MetricSum(t, r.Handler().Metrics(), "switchyard_router_in_flight_requests", nil) == 0 {
							return false
						}
					}
					return true
				})
			}
			testenv.WaitFor(t, 10*time.Second, "two reports published by every router", func() bool {
				for _, r := range s.Routers() {
					if testenv.MetricSum(t, r.Handler().Metrics(), "switchyard_router_reports_published_total", nil) < 2 {
						return false
					}
				}
				return true
			})
			from := rec.mark()
			// What `up` does on Ctrl-C: the load stops, then the stack.
			stopLoad()
			wg.Wait()
			s.Close()
			closed = true
			if bad := rec.worseThanInfo(t, from); len(bad) > 0 {
				t.Fatalf("a clean stop logged %d lines at warn or above (of %d):\n%s", len(bad), rec.mark()-from, joinLines(bad))
			}
			if rec.mark() == from {
				t.Fatal("the stop logged nothing; the logger is not wired to the components")
			}
		})
	}
}

func joinLines(ls []string) string {
	var b bytes.Buffer
	for _, l := range ls {
		if len(l) > 400 {
			l = l[:400] + "…"
		}
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}
