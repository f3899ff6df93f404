package main

import (
	"context"
	"errors"
	"flag"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/aggregator"
	"github.com/switchyard-dev/switchyard/streams"
)

func aggregatorCommand() command {
	return command{
		name:         "aggregator",
		summary:      "run the aggregator: engine signals and router reports into engine and demand state",
		printsConfig: true,
		setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			url := natsFlags(fs)
			var o aggregator.Options
			fs.StringVar(&o.Durable, "durable", "sy-aggregator", "durable consumer name prefix")
			fs.DurationVar(&o.FastHalfLife, "fast-half-life", messages.DefaultFastHalfLife, "half-life of the fast EWMA window")
			fs.DurationVar(&o.SlowHalfLife, "slow-half-life", messages.DefaultSlowHalfLife, "half-life of the slow EWMA window")
			fs.DurationVar(&o.StaleAfter, "stale-after", 2*time.Second, "mark an engine stale after this long without a signal")
			fs.DurationVar(&o.DownAfter, "down-after", 6*time.Second, "mark an engine down after this long without a signal")
			fs.DurationVar(&o.WriteInterval, "write-interval", 250*time.Millisecond, "write each changed key at most once per interval")
			fs.DurationVar(&o.ForgetAfter, "forget-after", aggregator.DefaultForgetAfter, "drop the state of engines, clusters and RTT pairs silent this long (also the TTL of every value written)")
			metricsAddr := fs.String("metrics-addr", "127.0.0.1:9090", "serve /metrics on this `address` (empty: off)")
			replicas := fs.Int("replicas", 1, "provision streams and buckets with this replica count before starting (0: do not provision)")
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
				o.Provision = streams.ProvisionOptions{Replicas: *replicas} // what a deleted stream or bucket comes back with
				if o.Endpoints, err = ef.policy(o.Names); err != nil {
					return err
				}
				if o.Endpoints == nil && !e.printOnly {
					log.Warn().Msg("no engine endpoint policy: the aggregator stores whatever URL or subject an engine's signal advertises, and the dashboard shows it; give one (--engine-endpoints, docs/security.md)")
				}
				if o, err = effective(o); err != nil {
					return err
				}
				if e.printOnly {
					return e.printConfig(section{"aggregator", o})
				}
				nc, err := connectService(ctx, url, "switchyard-aggregator", log, *replicas, streams.ProvisionOptions{})
				if err != nil {
					return err
				}
				defer nc.Close()
				reg := newRegistry()
				o.Conn, o.Logger, o.Registerer = nc, log, reg
				agg, err := aggregator.New(o)
				if err != nil {
					return usageError{err}
				}
				stopMetrics, err := serveMetrics(*metricsAddr, reg, log)
				if err != nil {
					return err
				}
				defer stopMetrics()
				return agg.Run(ctx)
			}
		},
	}
}

// newRegistry returns a registry with the Go and process collectors.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// serveMetrics serves /metrics for reg on addr until the returned function is called.
func serveMetrics(addr string, reg *prometheus.Registry, log zerolog.Logger) (func(), error) {
	return serveHTTP(addr, reg, reg, nil, log)
}

// serveHTTP serves /metrics for g, and root (when not nil) at /, on addr
// until the returned function is called; reg receives the handler's own
// metrics (promhttp_*).
func serveHTTP(addr string, g prometheus.Gatherer, reg prometheus.Registerer, root http.Handler, log zerolog.Logger) (func(), error) {
	if addr == "" {
		return func() {}, nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{Registry: reg}))
	if root != nil {
		mux.Handle("/", root)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn().Err(err).Msg("metrics server")
		}
	}()
	log.Info().Str("addr", l.Addr().String()).Msg("serving /metrics")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
