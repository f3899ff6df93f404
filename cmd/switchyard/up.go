package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/switchyard-dev/switchyard/stack"
)

func upCommand() command {
	return command{
		name:    "up",
		summary: "run the whole stack on one machine: embedded NATS, aggregator and simulated engines",
		usage:   "[--stack FILE]",
		setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			stackFile := fs.String("stack", "", "stack `file` (default: the built-in case study, also in examples/stack.yaml)")
			dataDir := fs.String("data-dir", defaultDataDir("up"), "`directory` for the embedded NATS server's JetStream store")
			host := fs.String("nats-host", "127.0.0.1", "embedded NATS server's client address")
			port := fs.Int("nats-port", 4222, "embedded NATS server's client port")
			signalEvery := fs.Duration("signal-interval", 200*time.Millisecond, "how often each simulated engine publishes a signal")
			metricsAddr := fs.String("metrics-addr", "127.0.0.1:9090", "serve /metrics on this `address` (empty: off)")
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
				reg := newRegistry()
				s, err := stack.Start(ctx, stack.Options{File: f, DataDir: *dataDir, NATSHost: *host, NATSPort: *port,
					SignalInterval: *signalEvery, Logger: log, Registerer: reg})
				if err != nil {
					return err
				}
				defer s.Close()
				stopMetrics, err := serveMetrics(*metricsAddr, reg, log)
				if err != nil {
					return err
				}
				defer stopMetrics()
				printUp(e.stdout, s, *dataDir, *metricsAddr)
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
	if metricsAddr != "" {
		fmt.Fprintf(tw, "  metrics\thttp://%s/metrics\t\n", metricsAddr)
	}
	for i, e := range s.Engines() {
		se := f.Engines[i]
		fmt.Fprintf(tw, "  %s\t%s\tregion %s, %.0f req/s, NATS %s\n", e.Name(), e.URL(), se.Region, e.Capacity(), e.InferSubject())
	}
	for _, c := range f.Clusters {
		fmt.Fprintf(tw, "  cluster %s\tregion %s\tdemand %.0f req/s\n", c.Name, c.Region, c.DemandRPS)
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
	fmt.Fprintf(w, "  nats%s sub 'sy.signal.>' --translate '%s decode --compact'\n", server, self)
	fmt.Fprintf(w, "\nCtrl-C stops everything.\n")
}
