package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-dev/switchyard/auth"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/streams/natsembed"
)

// defaultDataDir is where `up` and `nats` keep their JetStream store.
func defaultDataDir(sub string) string {
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "switchyard", sub)
}

func natsCommand() command {
	return command{
		name:         "nats",
		summary:      "run an embedded NATS server with JetStream (standalone, or one node of a cluster)",
		printsConfig: true,
		setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			dataDir := fs.String("data-dir", defaultDataDir("nats"), "JetStream store `directory`")
			host := fs.String("host", "127.0.0.1", "client listen address")
			port := fs.Int("port", 4222, "client port")
			name := fs.String("server-name", "", "server name (required in a cluster)")
			cluster := fs.String("cluster-name", "", "cluster name; set to run as one node of a cluster")
			clusterHost := fs.String("cluster-host", "", "cluster listen address (default: --host)")
			clusterPort := fs.Int("cluster-port", 6222, "cluster port (with --cluster-name)")
			routes := fs.String("routes", "", "other nodes' cluster `URLs`, comma-separated (nats-route://host:6222)")
			leafPort := fs.Int("leaf-port", 0, "accept leaf-node connections on this port (0: off), e.g. from routers run with --embed-nats --embed-nats-leaf nats-leaf://<host>:<port>")
			httpPort := fs.Int("http-port", 0, "NATS monitoring port (0: off); /healthz there serves health checks")
			provision := fs.Bool("provision", true, "create or update Switchyard's streams and buckets once JetStream is ready")
			replicas := fs.Int("replicas", 1, "replica count for provisioned streams and buckets (3 in a cluster)")
			authDir := fs.String("auth-dir", "", "serve the identities of this `directory` (switchyard auth --dir): operator mode, anonymous clients refused, TLS on client, cluster and leaf ports")
			mutual := fs.Bool("mutual-tls", false, "with --auth-dir, require client certificates on the client and leaf ports too")
			mkLog := logFlags(fs, e)
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected arguments %q", args)
				}
				log, err := mkLog()
				if err != nil {
					return err
				}
				log = log.With().Str("component", "nats").Logger()
				opts := natsembed.Options{DataDir: *dataDir, Host: *host, Port: *port, ServerName: *name, HTTPPort: *httpPort, LeafPort: *leafPort}
				if *cluster != "" {
					opts.ClusterName, opts.ClusterHost, opts.ClusterPort = *cluster, *clusterHost, *clusterPort
					for _, r := range strings.Split(*routes, ",") {
						if r = strings.TrimSpace(r); r != "" {
							opts.Routes = append(opts.Routes, r)
						}
					}
				}
				var material *auth.Material
				if *authDir != "" {
					if material, err = auth.Load(*authDir); err != nil {
						return usageError{err}
					}
					opts.Auth, opts.TLS = material.ServerAuth(), material.ServerTLS(*mutual)
				}
				if opts, err = effective(opts); err != nil {
					return err
				}
				prov := streams.ProvisionOptions{Replicas: *replicas}
				if *provision {
					if prov, err = effective(prov); err != nil {
						return err
					}
				}
				if e.printOnly {
					sections := []section{{"nats", opts}}
					if *provision {
						sections = append(sections, section{"provision", prov})
					}
					return e.printConfig(sections...)
				}
				opts.Logger = &log
				srv, err := natsembed.Start(opts)
				if err != nil {
					return err
				}
				defer srv.Shutdown()
				log.Info().Str("url", srv.ClientURL()).Str("data_dir", *dataDir).Str("cluster", *cluster).Str("leaf_url", srv.LeafURL()).Msg("NATS server running")
				if *provision {
					co := streams.ConnectOptions{URLs: []string{srv.ClientURL()}, Name: "switchyard-provision"}
					if material != nil {
						co = material.Connect("admin", *mutual, co)
					}
					go provisionWhenReady(ctx, co, prov, e)
				}
				<-ctx.Done()
				log.Info().Msg("shutting down")
				return nil
			}
		},
	}
}

// provisionWhenReady provisions the layout, retrying while a cluster forms.
func provisionWhenReady(ctx context.Context, co streams.ConnectOptions, prov streams.ProvisionOptions, e *env) {
	nc, err := streams.Connect(ctx, co)
	if err != nil {
		fmt.Fprintf(e.stderr, "provision: %v\n", err)
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Fprintf(e.stderr, "provision: %v\n", err)
		return
	}
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := streams.Provision(pctx, js, streams.DefaultNames(), prov)
		cancel()
		if err == nil || ctx.Err() != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}
