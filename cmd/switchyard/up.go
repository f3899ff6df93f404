package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-dev/switchyard/auth"
	"github.com/switchyard-dev/switchyard/dashboard"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/services/loadgen"
	"github.com/switchyard-dev/switchyard/stack"
	"github.com/switchyard-dev/switchyard/workload"
)

func upCommand() command {
	return command{
		name:         "up",
		summary:      "run the whole stack on one machine: embedded NATS, aggregator, optimizer, routers, and simulated engines or an agent for engines by URL",
		usage:        "[--stack FILE]",
		printsConfig: true,
		setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			stackFile := fs.String("stack", "", "stack `file` (default: the built-in case study, also in examples/stack.yaml)")
			dataDir := fs.String("data-dir", defaultDataDir("up"), "`directory` for the embedded NATS server's JetStream store")
			host := fs.String("nats-host", "127.0.0.1", "embedded NATS server's client address")
			port := fs.Int("nats-port", 4222, "embedded NATS server's client port")
			signalEvery := fs.Duration("signal-interval", 200*time.Millisecond, "how often each simulated engine publishes a signal, and the agent scrapes each engine by URL")
			metricsAddr := fs.String("metrics-addr", "127.0.0.1:9090", "serve the dashboard (/) and /metrics on this `address` (empty: off)")
			emulate := fs.Bool("emulate-network", true, "routers add the stack file's network latency to each request (one machine has no real network)")
			noKV := fs.Bool("no-kv-routing", false, "routers ignore the engines' KV events (read by default when an engine of the stack file has kv_events) and place requests by what they routed only")
			var tokSpecs []string
			fs.Func("tokenizer", "routers load the engines' tokenizer from a model `[MODEL=]DIR` (tokenizer.json, tokenizer_config.json or chat_template.jinja; repeat per model) so that chat and text completions are placed by the engines' KV events too (docs/kv-events.md)",
				func(s string) error { tokSpecs = append(tokSpecs, s); return nil })
			load := fs.Bool("load", false, "send each cluster's demand through its router, and print a summary every 10 s")
			routerAddr := fs.String("router-addr", "", "listen `address` for every router, overriding the stack file (127.0.0.1:0 picks free ports)")
			mutual := fs.Bool("mutual-tls", false, "require client certificates (the material's tls/client.pem) on the NATS client port too")
			tlsOn := fs.String("tls", "auto", "TLS on the NATS client port: on, off, or auto (on unless --nats-host is a loopback address, whose traffic never leaves the machine)")
			keys := fs.String("keys", "", "API keys `file` of every router's front door, overriding the stack file's keys_file (docs/deployment.md, \"The front door\"; empty: open, as the quick start is)")
			ef := addEndpointFlags(fs)
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
				if *load && !slices.ContainsFunc(f.Clusters, func(c stack.Cluster) bool { return c.DemandRPS > 0 }) {
					return usagef("--load: no cluster of the stack file has a demand_rps to send")
				}
				so := stack.Options{File: f, DataDir: *dataDir, NATSHost: *host, NATSPort: *port,
					SignalInterval: *signalEvery, RouterAddr: *routerAddr, KeysFile: *keys, EmulateNetwork: *emulate, NoKVRouting: *noKV, Logger: log, MutualTLS: *mutual}
				if len(tokSpecs) > 0 {
					tk, err := router.LoadTokenizers(tokSpecs)
					if err != nil {
						return usageError{err}
					}
					so.Tokenizer = tk
				}
				if so.Endpoints, err = ef.rules(); err != nil {
					return err
				}
				useTLS, err := tlsWanted(*tlsOn, *host)
				if err != nil {
					return usageError{err}
				}
				if !e.printOnly {
					// Keys and the CA under <data-dir>/auth are reused on
					// restart; credentials are issued afresh for the stack file.
					if so.Auth, err = auth.Generate(auth.Options{Dir: filepath.Join(*dataDir, "auth"), Identities: stack.Identities(f), Hosts: []string{*host}}); err != nil {
						return err
					}
					so.NoTLS = !useTLS
				}
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
				// The dashboard only reads: the read-only operator's identity.
				dashConn, err := s.Connect(ctx, stack.ReaderIdentity)
				if err != nil {
					return err
				}
				defer dashConn.Close()
				dash.Conn, dash.Logger, dash.Routers, dash.Registerer = dashConn, log, dashboard.RouterStatuses(s.Routers), reg
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
				printUp(e.stdout, s, *dataDir, *metricsAddr, useTLS)
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

// tlsWanted reads --tls for a server on host.
func tlsWanted(flag, host string) (bool, error) {
	switch flag {
	case "on":
		return true, nil
	case "off":
		return false, nil
	case "auto":
		ip := net.ParseIP(host)
		return !(host == "localhost" || ip != nil && ip.IsLoopback()), nil
	}
	return false, fmt.Errorf("--tls %q: want on, off or auto", flag)
}

func printUp(w io.Writer, s *stack.Stack, dataDir, metricsAddr string, useTLS bool) {
	f := s.File()
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Switchyard is up (model %q).\n\n", f.Model)
	fmt.Fprintf(tw, "  NATS\t%s\tJetStream store in %s\n", s.NATSURL(), dataDir)
	creds := ""
	if m := s.Auth(); m != nil { // always with up: it refuses anonymous clients
		how := "anonymous clients refused"
		if useTLS {
			how += "; TLS, CA " + m.Path(auth.CAFile)
		}
		fmt.Fprintf(tw, "  identities\t%s\t%s (one <identity>.creds each: admin, reader, aggregator, optimizer, engines, router-<cluster>)\n", m.Dir, how)
		creds = " --creds " + m.CredsFile(stack.AdminIdentity)
		if useTLS {
			creds += " --tlsca " + m.Path(auth.CAFile)
		}
	}
	fmt.Fprintf(tw, "  aggregator\tin process\tsignals and reports -> KV sy_engines, sy_demand\n")
	if s.Optimizer() != nil {
		fmt.Fprintf(tw, "  optimizer\tin process\tsy_engines, sy_demand -> weight snapshots in KV sy_weights\n")
	}
	if metricsAddr != "" {
		fmt.Fprintf(tw, "  dashboard\thttp://%s/\tlive weights, engine load and health (metrics at /metrics)\n", metricsAddr)
	}
	sims := s.Engines()
	for _, se := range f.Engines {
		if se.ByURL() {
			capacity := "capacity learned"
			if se.CapacityRPS > 0 {
				capacity = fmt.Sprintf("%.0f req/s", se.CapacityRPS)
			}
			fmt.Fprintf(tw, "  %s\t%s\tregion %s, %s, signals from its %s metrics by the agent\n", se.Name, se.URL, se.Region, capacity, se.Metrics)
			continue
		}
		e := sims[0]
		sims = sims[1:]
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
	fmt.Fprintf(w, "  nats%s%s kv ls sy_engines\n", server, creds)
	fmt.Fprintf(w, "  nats%s%s kv get sy_engines %s.%s --raw | %s decode\n", server, creds, f.Model, f.Engines[min(1, len(f.Engines)-1)].Name, self)
	fmt.Fprintf(w, "  nats%s%s kv get sy_weights %s.%s --raw | %s decode\n", server, creds, f.Model, f.Clusters[min(1, len(f.Clusters)-1)].Name, self)
	fmt.Fprintf(w, "  nats%s%s sub 'sy.signal.>' --translate '%s decode --compact'\n", server, creds, self)
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
	shape := f.Sim
	if f.Simulated() == 0 && shape.PromptTokens == 0 {
		shape = stack.Default().Sim // engines by URL only: the built-in stack's request shape
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
					PromptTokens: shape.PromptTokens, OutputTokens: shape.OutputTokens, Sessions: 200, Seed: round*1000 + uint64(i)})
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
