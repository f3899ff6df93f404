package main

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/switchyard-dev/switchyard/services/agent"
	"github.com/switchyard-dev/switchyard/streams"
)

func agentCommand() command {
	return command{
		name:         "agent",
		summary:      "run the engine agent: scrape vLLM, SGLang, TGI or llama.cpp engines' metrics and health, publish their signals",
		usage:        "--engine name=NAME,url=URL,metrics=FORMAT[,key=value...] [--engine ...] [flags]",
		printsConfig: true,
		setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			url := natsFlags(fs)
			var o agent.Options
			var specs []string
			fs.Func("engine", "an engine to serve, `SPEC` = name=NAME,url=URL,metrics=vllm|sglang|tgi|llamacpp and optionally "+
				"model=, region=, capacity_rps=, max_running=, base_latency_ms=, replicas=, served_model=, metrics_path=, health_path=, advertise= "+
				"(repeat for several engines of this node)", func(s string) error { specs = append(specs, s); return nil })
			model := fs.String("model", "llama", "model of engines whose spec names none")
			region := fs.String("region", "", "region of engines whose spec names none")
			name := fs.String("name", "", "NATS connection `name` (default: switchyard-agent-<first engine>)")
			fs.DurationVar(&o.Interval, "interval", agent.DefaultInterval, "time between scrapes and between signals")
			fs.DurationVar(&o.ScrapeTimeout, "scrape-timeout", agent.DefaultScrapeTimeout, "bound on one metrics or health request (a late answer is not a down engine)")
			fs.DurationVar(&o.StaleAfter, "stale-after", 0, "stop publishing this long after the last good scrape (0: max(5s, scrape timeout + 2 intervals))")
			fs.IntVar(&o.HealthFailures, "health-failures", agent.DefaultHealthFailures, "consecutive definite health failures before health 0")
			metricsAddr := fs.String("metrics-addr", "127.0.0.1:9097", "serve the agent's own /metrics on this `address` (empty: off)")
			mkLog := logFlags(fs, e)
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected arguments %q", args)
				}
				if len(specs) == 0 {
					return usagef("no --engine given")
				}
				for _, s := range specs {
					ec, err := agent.ParseEngineSpec(s, *model, *region)
					if err != nil {
						return usageError{err}
					}
					o.Engines = append(o.Engines, ec)
				}
				log, err := mkLog()
				if err != nil {
					return err
				}
				connName := *name
				if connName == "" {
					connName = "switchyard-agent-" + o.Engines[0].Name
				}
				// Validate before connecting, so a bad spec fails fast.
				if o, err = effective(o); err != nil {
					return err
				}
				if e.printOnly {
					return e.printConfig(section{"agent", o})
				}
				nc, err := streams.Connect(ctx, withWait(url.options(connName, log)))
				if err != nil {
					return err
				}
				defer nc.Close()
				reg := newRegistry()
				o.Conn, o.Logger, o.Registerer = nc, log, reg
				a, err := agent.New(o)
				if err != nil {
					return usageError{err}
				}
				stopMetrics, err := serveMetrics(*metricsAddr, reg, log)
				if err != nil {
					return err
				}
				defer stopMetrics()
				names := make([]string, len(o.Engines))
				for i, ec := range o.Engines {
					names[i] = fmt.Sprintf("%s (%s, %s)", ec.Name, ec.Format, ec.URL)
				}
				fmt.Fprintf(e.stdout, "agent serving %s\n", strings.Join(names, ", "))
				return a.Run(ctx)
			}
		},
	}
}
