package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-dev/switchyard/dashboard"
	"github.com/switchyard-dev/switchyard/services/loadgen"
	"github.com/switchyard-dev/switchyard/stack"
	"github.com/switchyard-dev/switchyard/workload"
)

func upCommand() command {
	return command{
		name:         "up",
		summary:      "run the whole stack on one machine: embedded NATS, aggregator and simulated engines",
		usage:        "[--stack FILE]",
		printsConfig: true,
		setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			stackFile := fs.String("stack", "", "stack `file` (default: the built-in case study, also in examples/stack.yaml)")
			dataDir := fs.String("data-dir", defaultDataDir("up"), "`directory` for the embedded NATS server's JetStream store")
			host := fs.String("nats-host", "127.0.0.1", "embedded NATS server's client address")
			port := fs.Int("nats-port", 4222, "embedded NATS server's client port")
			signalEvery := fs.Duration("signal-interval", 200*time.Millisecond, "how often each simulated engine publishes a signal")
			metricsAddr := fs.String("metrics-addr", "127.0.0.1:9090", "serve the dashboard (/) and /metrics on this `address` (empty: off)")
			emulate := fs.Bool("emulate-network", true, "routers add the stack file's network latency to each request (one machine has no real network)")
			load := fs.Bool("load", false, "send each cluster's demand through its router, and print a summary every 10 s")
			routerAddr := fs.String("router-addr", "", "listen `address` for every router, overriding the stack file (127.0.0.1:0 picks free ports)")
			keys := fs.String("keys", "", "API keys `file` of every router's front door, overriding the stack file's keys_file (docs/deployment.md, \"The front door\"; empty: open, as the quick start is)")
			mkLog := logFlags(fs, e)
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected arguments %q", args)
				}
				log, err := mkLog()
				if err != nil {
					return err
				}
				f := stack.Default()
				if *stackFile != "" {
					if f, err = stack.Load(*stackFile); err != nil {
						return usageError{err}
					}
				}
				so := stack.Options{File: f, DataDir: *dataDir, NATSHost: *host, NATSPort: *port,
					SignalInterval: *signalEvery, RouterAddr: *routerAddr, KeysFile: *keys, EmulateNetwork: *emulate, Logger: log}
				plan, err := so.Plan()
				if err != nil {
					return usageError{err}
				}
				dash, err := effective(dashboard.Options{})
				if err != nil {
					return err
				}
				if e.printOnly {
					return e.printConfig(section{"stack", f}, section{"components", plan}, section{"dashboard", dash})
				}
				reg := newRegistry()
				so.Registerer = reg
				s, err := stack.Start(ctx, so)
				if err != nil {
					return err
				}
				defer s.Close()
				dash.Conn, dash.Logger, dash.Routers, dash.Registerer = s.Conn(), log, dashboard.RouterStatuses(s.Routers), reg
				dashHandler, stopDash, err := startDashboard(ctx, dash)
				if err != nil {
					return err
				}
				defer stopDash()
				stopMetrics, err := serveHTTP(*metricsAddr, prometheus.Gatherers{reg, s.Gatherer()}, reg, dashHandler, log)
				if err != nil {
					return err
				}
				defer stopMetrics()
				printUp(e.stdout, s, *dataDir, *metricsAddr)
				if *load {
					stopLoad := startLoad(ctx, s, e.stdout)
					defer stopLoad()
				}
				select {
				case <-ctx.Done():
					fmt.Fprintln(e.stderr, "stopping...")
					return nil
				case err := <-s.Errors():
					return err
				}
			}
		},
	}
}

// selfCommand is how the user runs this binary: "go run ./cmd/switchyard"
// under go run, the binary's name otherwise.
func selfCommand() string {
	if strings.Contains(os.Args[0], "go-build") {
		return "go run ./cmd/switchyard"
	}
	return "switchyard"
}

func printUp(w io.Writer, s *stack.Stack, dataDir, metricsAddr string) {
	f := s.File()
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Switchyard is up (model %q).\n\n", f.Model)
	fmt.Fprintf(tw, "  NATS\t%s\tJetStream store in %s\n", s.NATSURL(), dataDir)
	fmt.Fprintf(tw, "  aggregator\tin process\tsignals and reports -> KV sy_engines, sy_demand\n")
	if s.Optimizer() != nil {
		fmt.Fprintf(tw, "  optimizer\tin process\tsy_engines, sy_demand -> weight snapshots in KV sy_weights\n")
	}
	if metricsAddr != "" {
		fmt.Fprintf(tw, "  dashboard\thttp://%s/\tlive weights, engine load and health (metrics at /metrics)\n", metricsAddr)
	}
	for i, e := range s.Engines() {
		se := f.Engines[i]
		fmt.Fprintf(tw, "  %s\t%s\tregion %s, %.0f req/s, NATS %s\n", e.Name(), e.URL(), se.Region, e.Capacity(), e.InferSubject())
	}
	routers := s.Routers()
	for i, c := range f.Clusters {
		where := "region " + c.Region
		if i < len(routers) {
			where = "http://" + routers[i].Addr()
		}
		fmt.Fprintf(tw, "  router %s\t%s\tcluster %s in region %s, demand %.0f req/s; NATS sy.req.%s.%s\n", c.Name, where, c.Name, c.Region, c.DemandRPS, c.Name, f.Model)
	}
	tw.Flush()
	self := selfCommand()
	server := ""
	if u := s.NATSURL(); u != "nats://127.0.0.1:4222" {
		server = " -s " + u
	}
	fmt.Fprintf(w, "\nLook inside with the nats CLI (go install github.com/nats-io/natscli/nats@v0.5.0):\n")
	fmt.Fprintf(w, "  nats%s kv ls sy_engines\n", server)
	fmt.Fprintf(w, "  nats%s kv get sy_engines %s.%s --raw | %s decode\n", server, f.Model, f.Engines[min(1, len(f.Engines)-1)].Name, self)
	fmt.Fprintf(w, "  nats%s kv get sy_weights %s.%s --raw | %s decode\n", server, f.Model, f.Clusters[min(1, len(f.Clusters)-1)].Name, self)
	fmt.Fprintf(w, "  nats%s sub 'sy.signal.>' --translate '%s decode --compact'\n", server, self)
	fmt.Fprintf(w, "\nCtrl-C stops everything.\n")
}

// startLoad sends every cluster's demand through its router in 10-second
// rounds of Poisson arrivals, printing one summary line per cluster per round,
// until ctx ends or the returned function is called.
func startLoad(ctx context.Context, s *stack.Stack, w io.Writer) func() {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var mu sync.Mutex
	f := s.File()
	// Wait (up to 15 s) until every router routes on a snapshot, so that the
	// first requests do not race the first signals.
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(100 * time.Millisecond) {
		ready := true
		for _, r := range s.Routers() {
			if _, ok := r.Store().Snapshot(f.Model); !ok {
				ready = false
			}
		}
		if ready {
			break
		}
	}
	fmt.Fprintf(w, "\nSending each cluster's demand through its router; a summary per cluster every 10 s.\n")
	for i, r := range s.Routers() {
		c := f.Clusters[i]
		if c.DemandRPS <= 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := uint64(1); ctx.Err() == nil; round++ {
				reqs := workload.Poisson(workload.PoissonOptions{Rate: c.DemandRPS, Duration: 10 * time.Second,
					PromptTokens: f.Sim.PromptTokens, OutputTokens: f.Sim.OutputTokens, Sessions: 200, Seed: round*1000 + uint64(i)})
				sum, err := loadgen.Run(ctx, loadgen.Options{URL: "http://" + r.Addr(), Model: f.Model, Requests: reqs, StreamFraction: 0.5, Seed: round})
				if err != nil || ctx.Err() != nil {
					return
				}
				mu.Lock()
				fmt.Fprintf(w, "cluster %s: %s\n", c.Name, oneLine(sum))
				mu.Unlock()
			}
		}()
	}
	return func() { cancel(); wg.Wait() }
}

func oneLine(s *loadgen.Summary) string {
	engines := make([]string, 0, len(s.EngineShare))
	for e := range s.EngineShare {
		engines = append(engines, e)
	}
	slices.Sort(engines)
	var b strings.Builder
	fmt.Fprintf(&b, "%d ok, %d errors, %d shed; e2e p50 %s p99 %s;", s.OK, s.Errors, s.Shed, s.E2EP50.Round(time.Millisecond), s.E2EP99.Round(time.Millisecond))
	for _, e := range engines {
		fmt.Fprintf(&b, " %s %.0f%%", e, 100*s.EngineShare[e])
	}
	return b.String()
}
