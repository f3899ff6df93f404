package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/switchyard-dev/switchyard/services/enginesim"
	"github.com/switchyard-dev/switchyard/streams"
)

func engineSimCommand() command {
	return command{
		name:         "engine-sim",
		summary:      "run one simulated continuous-batching engine (OpenAI HTTP, NATS request-reply, signals)",
		usage:        "--name NAME [flags]",
		printsConfig: true,
		setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			var o enginesim.Options
			fs.StringVar(&o.Name, "name", "", "engine name (letters, digits, - and _)")
			fs.StringVar(&o.Model, "model", "llama", "model id served, as clients name it (slashes and dots allowed: meta-llama/Llama-3.1-8B-Instruct)")
			fs.StringVar(&o.ServedModel, "served-model-name", "", "the name requests must give in their model field, as vLLM's --served-model-name (default: --model)")
			fs.StringVar(&o.Region, "region", "", "region")
			fs.StringVar(&o.Listen, "listen", "127.0.0.1:8000", "HTTP listen `address`")
			fs.StringVar(&o.AdminListen, "admin-listen", "", "serve failure injection (/admin/failure, on no other port), /metrics and /healthz on this `address`")
			url := natsFlagsURL(fs, "", "NATS server `URLs`; empty: HTTP only, no signals")
			capacity := fs.Float64("capacity", 0, "target capacity in req/s; sets --max-batch (0: use --max-batch)")
			fs.IntVar(&o.MaxBatch, "max-batch", enginesim.DefaultMaxBatch, "largest running batch")
			fs.Float64Var(&o.PrefillMsPerToken, "prefill-ms-per-token", enginesim.DefaultPrefillMsPerToken, "prefill cost per prompt token, ms")
			fs.Float64Var(&o.BaseTBTMs, "base-tbt-ms", enginesim.DefaultBaseTBTMs, "time between tokens at batch 1, ms")
			fs.Float64Var(&o.TBTGrowthMs, "tbt-growth-ms", enginesim.DefaultTBTGrowthMs, "growth of the time between tokens per running request, ms")
			fs.IntVar(&o.OutputTokens, "output-tokens", enginesim.DefaultOutputTokens, "tokens generated per request (max_tokens can lower it)")
			fs.IntVar(&o.PromptTokens, "prompt-tokens", enginesim.DefaultPromptTokens, "mean prompt length the capacity assumes")
			fs.DurationVar(&o.SignalInterval, "signal-interval", 0, "time between signals (0: SDK default)")
			fs.StringVar(&o.MetricsFormat, "metrics-format", "", "also serve /metrics in this engine's `format` (vllm), for `switchyard agent`")
			fs.StringVar(&o.KVEvents, "kv-events", "", "keep a prefix cache and publish vLLM's KV events on a ZMQ PUB socket bound to this `endpoint` (tcp://host:port)")
			fs.StringVar(&o.KVReplay, "kv-replay", "", "with --kv-events, bind vLLM's KV event replay socket to this `endpoint` (tcp://host:port)")
			fs.StringVar(&o.KVTopic, "kv-topic", "", "with --kv-events, the `topic` frame of every KV event message")
			fs.BoolVar(&o.NoSignals, "no-signals", false, "publish no signals of its own (an agent publishes for it)")
			fs.Float64Var(&o.Failure.ErrorRate, "error-rate", 0, "inject: fraction of requests failing with 500")
			fs.Float64Var(&o.Failure.AddedLatencyMs, "added-latency-ms", 0, "inject: delay before each request queues, ms")
			fs.BoolVar(&o.Failure.Hang, "hang", false, "inject: accept requests and never answer")
			fs.IntVar(&o.Failure.CrashAfter, "crash-after", 0, "inject: crash when request N+1 arrives (0: never)")
			fs.Float64Var(&o.Failure.CapacityFactor, "capacity-factor", 0, "inject: scale speed and capacity (0: 1)")
			mkLog := logFlags(fs, e)
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected arguments %q", args)
				}
				log, err := mkLog()
				if err != nil {
					return err
				}
				o.Logger = log
				if *capacity > 0 {
					if o.MaxBatch, err = enginesim.BatchForCapacity(o, *capacity); err != nil {
						return usageError{err}
					}
				}
				if o, err = effective(o); err != nil {
					return err
				}
				if e.printOnly {
					return e.printConfig(section{"engine", o})
				}
				if *url.url != "" {
					nc, err := streams.Connect(ctx, withWait(url.options("switchyard-engine-"+o.Name, log)))
					if err != nil {
						return err
					}
					defer nc.Close()
					o.Conn = nc
				}
				eng, err := enginesim.New(o)
				if err != nil {
					return usageError{err}
				}
				if err := eng.Start(ctx); err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "engine %s serving %s at %s (capacity %.1f req/s, max batch %d)\n", o.Name, o.Model, eng.URL(), eng.Capacity(), eng.Options().MaxBatch)
				<-ctx.Done()
				return eng.Close()
			}
		},
	}
}
