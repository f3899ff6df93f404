package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/switchyard-dev/switchyard/services/loadgen"
	"github.com/switchyard-dev/switchyard/workload"
)

func loadCommand() command {
	return command{
		name:         "load",
		summary:      "send OpenAI requests to a router at a rate for a time, then summarise",
		usage:        "--url http://127.0.0.1:8081 [--rate 90 --duration 30s | --trace FILE]",
		printsConfig: true,
		setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			url := fs.String("url", "http://127.0.0.1:8081", "router base `URL`")
			model := fs.String("model", "llama", "model to request")
			rate := fs.Float64("rate", 10, "request rate, req/s (Poisson arrivals); with --trace, scale the trace to this rate (0: as recorded)")
			duration := fs.Duration("duration", 30*time.Second, "how long to send")
			trace := fs.String("trace", "", "replay a trace `file`: the Azure CSV or the Mooncake JSONL in ../shared/data")
			stream := fs.Float64("stream", 0.5, "share of streaming requests, 0..1")
			sessions := fs.Int("sessions", 100, "number of conversations (session ids and shared prefixes) for Poisson load")
			prompt := fs.Int("prompt-tokens", 256, "prompt length for Poisson load, tokens")
			output := fs.Int("output-tokens", 32, "output length for Poisson load, tokens")
			maxOut := fs.Int("max-output-tokens", 0, "cap max_tokens (0: no cap)")
			priority := fs.String("priority", "", "send x-switchyard-priority: critical, standard or sheddable")
			seed := fs.Uint64("seed", 1, "random seed")
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected arguments %q", args)
				}
				if *duration <= 0 || *duration > 24*time.Hour {
					return usagef("--duration %s: want 0 < duration <= 24h", *duration)
				}
				var reqs []workload.Request
				if *trace != "" {
					var err error
					if reqs, err = workload.Load(*trace); err != nil {
						return usageError{err}
					}
					if *rate > 0 {
						reqs = workload.Scale(reqs, *rate/workload.Rate(reqs))
					}
				} else {
					if *rate <= 0 || *rate > 100000 {
						return usagef("--rate %v: want 0 < rate <= 100000", *rate)
					}
					reqs = workload.Poisson(workload.PoissonOptions{Rate: *rate, Duration: *duration, PromptTokens: *prompt, OutputTokens: *output, Sessions: *sessions, Seed: *seed})
				}
				o, err := effective(loadgen.Options{URL: *url, Model: *model, Duration: *duration, StreamFraction: *stream,
					MaxOutputTokens: *maxOut, Priority: *priority, Seed: *seed, Progress: e.stderr})
				if err != nil {
					return err
				}
				if e.printOnly {
					// The schedule itself is data, not configuration: its size stands for it.
					return e.printConfig(section{"load", o}, section{"schedule", map[string]any{"Requests": len(reqs), "RatePerSecond": workload.Rate(reqs)}})
				}
				fmt.Fprintf(e.stderr, "sending to %s for up to %s (%d requests scheduled)\n", *url, *duration, len(reqs))
				o.Requests = reqs
				s, err := loadgen.Run(ctx, o)
				if err != nil {
					return usageError{err}
				}
				loadgen.WriteSummary(e.stdout, s)
				return nil
			}
		},
	}
}
