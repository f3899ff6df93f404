package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/switchyard-dev/switchyard/dashboard"
	"github.com/switchyard-dev/switchyard/plan"
	"github.com/switchyard-dev/switchyard/services/optimizersvc"
	"github.com/switchyard-dev/switchyard/stack"
	"github.com/switchyard-dev/switchyard/streams"
)

func optimizerCommand() command {
	return command{
		name:         "optimizer",
		summary:      "run the optimizer service: engine and demand state into weight snapshots (one leader at a time)",
		usage:        "[--stack FILE | --network FILE] [flags]",
		printsConfig: true,
		setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			url := natsFlags(fs)
			var o optimizersvc.Options
			stackFile := fs.String("stack", "", "take frontend clusters and network latency from this stack `file`")
			networkFile := fs.String("network", "", "YAML or JSON `file` of configured one-way latency, ms: {cluster: {engine: ms}}")
			fs.StringVar(&o.Instance, "instance", "", "instance name, unique among optimizers (default <hostname>-<pid>)")
			fs.DurationVar(&o.MinInterval, "min-interval", 100*time.Millisecond, "solve at most this often after a change")
			fs.DurationVar(&o.MaxInterval, "max-interval", 2*time.Second, "solve at least this often")
			fs.DurationVar(&o.Heartbeat, "heartbeat", 10*time.Second, "rewrite unchanged snapshots this often")
			fs.DurationVar(&o.LeaseTTL, "lease-ttl", 3*time.Second, "leadership lease TTL (must match provisioning)")
			fs.Float64Var(&o.Solver.ProximalMs, "proximal-ms", 1, "anti-churn price: ms per req/s of traffic moved")
			fs.Float64Var(&o.Solver.DeadBand, "dead-band", 0.01, "keep a cluster's weights unless they move by at least this total-variation distance")
			fs.Float64Var(&o.TargetUtilisation, "target-utilisation", 1, "plan engines up to this share of their effective capacity, in (0, 1] (headroom for bursts; below 1 sheds earlier)")
			fs.Func("engine-target-utilisation", "plan engine `NAME=U` up to U of its effective capacity instead of --target-utilisation, U in (0, 1] (headroom on a slower engine type; repeat for several engines)",
				func(v string) error {
					name, u, err := parseEngineTarget(v)
					if err != nil {
						return err
					}
					if o.EngineTargetUtilisation == nil {
						o.EngineTargetUtilisation = map[string]float64{}
					}
					o.EngineTargetUtilisation[name] = u
					return nil
				})
			fs.Func("cluster-region", "frontend cluster `NAME=REGION`, for the region default of the network latency (repeat; --stack gives them all)",
				func(v string) error {
					c, r, ok := strings.Cut(v, "=")
					if !ok || c == "" || r == "" {
						return fmt.Errorf("%q: want CLUSTER=REGION", v)
					}
					if o.ClusterRegions == nil {
						o.ClusterRegions = map[string]string{}
					}
					o.ClusterRegions[c] = r
					return nil
				})
			fs.Float64Var(&o.Regions.SameRegionMs, "same-region-ms", plan.DefaultSameRegionMs, "one-way network latency, ms, assumed between a cluster and an engine of its region until one is measured or configured")
			fs.Float64Var(&o.Regions.OtherRegionMs, "other-region-ms", plan.DefaultOtherRegionMs, "one-way network latency, ms, assumed between a cluster and an engine of another (or no) region until one is measured or configured")
			fs.Float64Var(&o.DemandBandSD, "demand-band-sd", plan.DefaultDemandBandSD, "plan a cluster's demand at a held rate while its fast window stays within this many of the window's standard deviations of it (negative: plan the fast window as it is)")
			fs.BoolVar(&o.NoRegionDefault, "no-region-default", false, "plan an engine for a cluster only with a measured or configured latency (no region default)")
			fs.BoolVar(&o.PreferConfiguredNetwork, "prefer-configured-network", false, "use the configured network latency even where RTTs are measured (for emulated networks on one host)")
			ef := addEndpointFlags(fs)
			metricsAddr := fs.String("metrics-addr", "127.0.0.1:9091", "serve the live dashboard (/) and /metrics on this `address` (empty: off)")
			replicas := fs.Int("replicas", 1, "provision streams and buckets with this replica count before starting (0: do not provision)")
			mkLog := logFlags(fs, e)
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected arguments %q", args)
				}
				switch {
				case *stackFile != "" && *networkFile != "":
					return usagef("give --stack or --network, not both")
				case *stackFile != "":
					f, err := stack.Load(*stackFile)
					if err != nil {
						return usageError{err}
					}
					o.NetworkMs = f.NetworkTable()
					for _, c := range f.Clusters {
						o.Clusters = append(o.Clusters, c.Name)
						if _, set := o.ClusterRegions[c.Name]; !set {
							if o.ClusterRegions == nil {
								o.ClusterRegions = map[string]string{}
							}
							o.ClusterRegions[c.Name] = c.Region
						}
					}
				case *networkFile != "":
					data, err := os.ReadFile(*networkFile)
					if err != nil {
						return usageError{err}
					}
					if err := yaml.Unmarshal(data, &o.NetworkMs); err != nil {
						return usagef("%s: %v (want {cluster: {engine: ms}})", *networkFile, err)
					}
					for c := range o.NetworkMs {
						o.Clusters = append(o.Clusters, c)
					}
				default:
					// Neither: clusters come from their demand, engines from
					// their signals, latency from --cluster-region and the
					// region defaults until routers measure RTTs.
				}
				log, err := mkLog()
				if err != nil {
					return err
				}
				o.Provision = streams.ProvisionOptions{LeaseTTL: o.LeaseTTL, Replicas: *replicas} // what a deleted stream or bucket comes back with
				if o.Endpoints, err = ef.policy(o.Names); err != nil {
					return err
				}
				if o.Endpoints == nil && !e.printOnly {
					log.Warn().Msg("no engine endpoint policy: the optimizer plans engines wherever their signals say they are; give one (--engine-endpoints, docs/security.md)")
				}
				if o, err = effective(o); err != nil {
					return err
				}
				dash, err := effective(dashboard.Options{})
				if err != nil {
					return err
				}
				if e.printOnly {
					return e.printConfig(section{"optimizer", o}, section{"dashboard", dash})
				}
				nc, err := connectService(ctx, url, "switchyard-optimizer", log, *replicas, streams.ProvisionOptions{LeaseTTL: o.LeaseTTL})
				if err != nil {
					return err
				}
				defer nc.Close()
				reg := newRegistry()
				o.Conn, o.Logger, o.Registerer = nc, log, reg
				svc, err := optimizersvc.New(o)
				if err != nil {
					return usageError{err}
				}
				// The live dashboard is served next to /metrics, as `up` does.
				dash.Conn, dash.Logger, dash.Registerer = nc, log, reg
				dashHandler, stopDash, err := startDashboard(ctx, dash)
				if err != nil {
					return err
				}
				defer stopDash()
				stopMetrics, err := serveHTTP(*metricsAddr, reg, reg, dashHandler, log)
				if err != nil {
					return err
				}
				defer stopMetrics()
				fmt.Fprintf(e.stderr, "optimizer %s: planning %d clusters\n", svc.Instance(), len(o.Clusters))
				return svc.Run(ctx)
			}
		},
	}
}

// parseEngineTarget parses NAME=U, an engine's own target utilisation.
func parseEngineTarget(v string) (string, float64, error) {
	name, us, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return "", 0, fmt.Errorf("%q: want NAME=U, an engine name and a share in (0, 1]", v)
	}
	u, err := strconv.ParseFloat(us, 64)
	if err != nil || !(u > 0 && u <= 1) {
		return "", 0, fmt.Errorf("%q: target utilisation %q is not a share in (0, 1]", v, us)
	}
	return name, u, nil
}
