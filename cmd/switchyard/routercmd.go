package main

import (
	"context"
	"flag"
	"os"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/stack"
	"github.com/switchyard-dev/switchyard/streams"
)

func routerCommand() command {
	return command{
		name:    "router",
		summary: "run one router: OpenAI HTTP and NATS fronts, weights from sy_weights, reports",
		usage:   "--cluster NAME [flags]",
		setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			url := natsFlags(fs)
			var o router.ServiceOptions
			fs.StringVar(&o.Cluster, "cluster", "", "frontend cluster this router serves (required)")
			fs.StringVar(&o.Router, "name", "", "router name, unique in its cluster (default <cluster>-<random>)")
			fs.StringVar(&o.HTTPAddr, "listen", "127.0.0.1:8081", "HTTP front listen `address` (empty: no HTTP front)")
			fs.BoolVar(&o.NoNATSFront, "no-nats-front", false, "do not take requests on sy.req.<cluster>.<model>")
			fs.BoolVar(&o.PreferNATS, "prefer-nats", false, "forward over NATS to engines that offer both HTTP and NATS")
			fs.DurationVar(&o.StaleAfter, "stale-after", router.DefaultStaleAfter, "snapshot age past which the local policy takes over")
			fs.DurationVar(&o.ReportInterval, "report-interval", time.Second, "how often to publish reports")
			var rt router.RuntimeOptions
			fs.IntVar(&rt.GCPercent, "gogc", router.DefaultGCPercent, "garbage collector target percentage, as GOGC (0: keep GOGC from the environment or Go's 100; negative: off up to --memlimit)")
			memLimit := fs.String("memlimit", "", "soft memory limit, as GOMEMLIMIT, e.g. 512MiB (empty: keep GOMEMLIMIT from the environment, or none)")
			fs.IntVar(&rt.MaxProcs, "gomaxprocs", 0, "OS threads running Go code at once, as GOMAXPROCS (0: keep GOMAXPROCS from the environment or Go's default, the CPUs available)")
			emulate := fs.String("emulate-network", "", "emulate the network latency of this stack `file` (one-way, per engine region, from this router's cluster region)")
			mkLog := logFlags(fs, e)
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected arguments %q", args)
				}
				if err := messages.CheckName("--cluster", o.Cluster); err != nil {
					return usageError{err}
				}
				log, err := mkLog()
				if err != nil {
					return err
				}
				if *memLimit != "" {
					if rt.MemoryLimit, err = router.ParseMemoryLimit(*memLimit); err != nil {
						return usagef("--memlimit %q: %v", *memLimit, err)
					}
				}
				if rt.GCPercent < 0 && rt.MemoryLimit == 0 && os.Getenv("GOMEMLIMIT") == "" {
					return usagef("--gogc %d turns the garbage collector off: it needs --memlimit (or GOMEMLIMIT) to bound the heap", rt.GCPercent)
				}
				if !flagSet(fs, "gogc") && os.Getenv("GOGC") != "" {
					rt.GCPercent = 0 // the environment's GOGC wins over the default
				}
				rt.Apply()
				if *emulate != "" {
					f, err := stack.Load(*emulate)
					if err != nil {
						return usageError{err}
					}
					if o.NetworkDelay = f.DelayFrom(o.Cluster); o.NetworkDelay == nil {
						return usagef("--emulate-network %s: cluster %q is not in the stack file", *emulate, o.Cluster)
					}
				}
				// Routers never wait on the control plane: start even if NATS is not up yet.
				nc, err := streams.Connect(ctx, streams.ConnectOptions{URLs: []string{*url}, Name: "switchyard-router-" + o.Cluster, Logger: log, WaitForServer: true})
				if err != nil {
					return err
				}
				defer nc.Close()
				o.Conn, o.Logger = nc, log.With().Str("cluster", o.Cluster).Logger()
				svc, err := router.NewService(o)
				if err != nil {
					return usageError{err}
				}
				return svc.Run(ctx)
			}
		},
	}
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}
