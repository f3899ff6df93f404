package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/internal/netem"
	"github.com/switchyard-dev/switchyard/internal/procruntime"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/httpfront"
	"github.com/switchyard-dev/switchyard/router/tenant"
	"github.com/switchyard-dev/switchyard/stack"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/streams/natsembed"
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
			fs.StringVar(&o.MetricsAddr, "metrics-addr", "127.0.0.1:9098", "serve /metrics on this `address`, off the inference port (which then answers 404 there); empty: on the inference port")
			fs.StringVar(&o.KeysFile, "keys", "", "API keys `file` of the front door (docs/deployment.md, \"The front door\"): requests need a key of it, run within its tenant's priority ceiling and rate, and the key is not forwarded to engines; re-read every 2 s. Empty: open")
			fs.BoolVar(&o.NoNATSFront, "no-nats-front", false, "do not take requests on sy.req.<cluster>.<model>")
			fs.BoolVar(&o.PreferNATS, "prefer-nats", false, "forward over NATS to engines that offer both HTTP and NATS")
			fs.BoolVar(&o.KVEvents, "kv-events", false, "read the engines' KV events (SY_KV, relayed by `switchyard agent --engine ...,kv_events=...`) and place requests with token ids (completions with a prompt of token ids) on the engines that report holding their prefix (docs/kv-events.md)")
			var tokSpecs []string
			fs.Func("tokenizer", "with --kv-events: load the engines' tokenizer from a model `[MODEL=]DIR` (tokenizer.json, tokenizer_config.json or chat_template.jinja, as the engine loads them; repeat per model; without MODEL= for every model) so that chat and text completions are placed by the engines' KV events too (docs/kv-events.md)",
				func(s string) error { tokSpecs = append(tokSpecs, s); return nil })
			fs.DurationVar(&o.StaleAfter, "stale-after", control.DefaultStaleAfter, "snapshot age past which the local policy takes over")
			fs.DurationVar(&o.ReportInterval, "report-interval", time.Second, "how often to publish reports")
			fs.StringVar(&o.RTTProbe, "rtt-probe", control.DefaultRTTProbe, "how to measure the RTT to HTTP engines: tcp (time a TCP connect: the network round trip alone, for any engine) or http:/path (time a GET of that path, e.g. http:/health; also times the engine's request handling; a 404 or 405 there measures nothing)")
			fs.IntVar(&o.Protection.Routers, "routers", 1, "routers serving this cluster: local admission control allots this router 1/N of the cluster's planned traffic")
			httpServer := fs.String("http-server", string(httpfront.DefaultServerKind), "HTTP front's server: fasthttp (github.com/valyala/fasthttp) or std (Go's net/http)")
			var rt procruntime.Options
			fs.IntVar(&rt.GCPercent, "gogc", procruntime.DefaultGCPercent, "garbage collector target percentage, as GOGC (0: keep GOGC from the environment or Go's 100; negative: off up to --memlimit)")
			memLimit := fs.String("memlimit", "", "soft memory limit, as GOMEMLIMIT, e.g. 512MiB (empty: keep GOMEMLIMIT from the environment, or none)")
			fs.IntVar(&rt.MaxProcs, "gomaxprocs", 0, "OS threads running Go code at once, as GOMAXPROCS (0: keep GOMAXPROCS from the environment or Go's default, the CPUs available)")
			emulate := fs.String("emulate-network", "", "emulate the network latency of this stack `file` (one-way, per engine region, from this router's cluster region)")
			ef := addEndpointFlags(fs)
			var em embedOptions
			fs.BoolVar(&em.on, "embed-nats", false, "run a NATS server inside this process and connect the router to it in-process (no socket between them); clients and engines connect to --embed-nats-listen. Excludes --nats-url")
			fs.StringVar(&em.listen, "embed-nats-listen", "127.0.0.1:4222", "with --embed-nats: the embedded server's client listen `address` (empty: in-process only)")
			fs.StringVar(&em.leaf, "embed-nats-leaf", "", "with --embed-nats: join the main NATS as a leaf node at these leaf-node `URLs`, comma-separated (nats-leaf://host:7422, see `switchyard nats --leaf-port`); the embedded server then has no JetStream and reads weights, and writes reports, through the main NATS; the leaf connection presents --creds (a leaf identity of switchyard auth) and checks the hub with --tls-ca (tls:// URLs or a hub with TLS), --tls-cert/--tls-key for mutual TLS. Empty: a standalone server with its own JetStream")
			fs.StringVar(&em.dataDir, "embed-nats-data-dir", "", "with --embed-nats and no --embed-nats-leaf: the JetStream store `directory` (default: the user cache dir's switchyard/router-<cluster>)")
			fs.Func("alias", "serve model `ALIAS=MODEL` also under the name ALIAS (repeat for several): requests for ALIAS route on MODEL and reach engines under the name they serve. The first = not escaped ends ALIAS (MODEL may hold = as it is); write = in ALIAS as \\= and a backslash before = as \\\\",
				func(s string) error {
					alias, model, err := parseAlias(s)
					if err != nil {
						return err
					}
					if o.Aliases == nil {
						o.Aliases = map[string]string{}
					}
					o.Aliases[alias] = model
					return nil
				})
			mkLog := logFlags(fs, e)
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected arguments %q", args)
				}
				if err := o.Validate(); err != nil {
					return usageError{err}
				}
				if len(tokSpecs) > 0 {
					if !o.KVEvents {
						return usagef("--tokenizer needs --kv-events: the token ids only meet the engines' KV events")
					}
					tk, err := router.LoadTokenizers(tokSpecs)
					if err != nil {
						return usageError{err}
					}
					o.Tokenizer = tk
				}
				if o.KeysFile != "" { // before a connection that may wait for NATS
					if _, _, err := tenant.LoadFile(o.KeysFile); err != nil {
						return usagef("--keys: %v", err)
					}
				}
				log, err := mkLog()
				if err != nil {
					return err
				}
				if o.Endpoints, err = ef.policy(o.Names); err != nil {
					return err
				}
				if o.Server.Kind, err = httpfront.ParseServerKind(*httpServer); err != nil {
					return usagef("--http-server: %v", err)
				}
				if *memLimit != "" {
					if rt.MemoryLimit, err = procruntime.ParseMemoryLimit(*memLimit); err != nil {
						return usagef("--memlimit %q: %v", *memLimit, err)
					}
				}
				if rt.GCPercent < 0 && rt.MemoryLimit == 0 && os.Getenv("GOMEMLIMIT") == "" {
					return usagef("--gogc %d turns the garbage collector off: it needs --memlimit (or GOMEMLIMIT) to bound the heap", rt.GCPercent)
				}
				if !flagSet(fs, "gogc") && os.Getenv("GOGC") != "" {
					rt.GCPercent = 0 // the environment's GOGC wins over the default
				}
				if e.printOnly {
					return e.printConfig(section{"router", o}, section{"runtime", rt})
				}
				rt.Apply()
				if *emulate != "" {
					f, err := stack.Load(*emulate)
					if err != nil {
						return usageError{err}
					}
					delay := f.DelayFrom(o.Cluster)
					if delay == nil {
						return usagef("--emulate-network %s: cluster %q is not in the stack file", *emulate, o.Cluster)
					}
					o.WrapTransport = netem.Wrap(delay)
				}
				var nc *nats.Conn
				if em.on {
					if flagSet(fs, "nats-url") {
						return usagef("--nats-url and --embed-nats exclude each other: with --embed-nats the router connects to its own server (use --embed-nats-leaf to join the main NATS)")
					}
					if em.leaf == "" {
						for _, f := range []string{"creds", "tls-ca", "tls-cert", "tls-key"} {
							if flagSet(fs, f) {
								return usagef("--%s with --embed-nats needs --embed-nats-leaf: the router connects to its own server in-process; with a hub, the leaf connection presents them", f)
							}
						}
					}
					em.remote = natsembed.TLS{CAFile: *url.ca, CertFile: *url.cert, KeyFile: *url.key}
					em.creds = *url.creds
					if em.dataDir == "" {
						em.dataDir = defaultDataDir("router-" + o.Cluster)
					}
					// The server is named after the router when it has a name
					// (nats-server's random ID otherwise): the leaf nodes of one
					// hub need distinct names.
					serverName := ""
					if o.Router != "" {
						serverName = "switchyard-router-" + o.Router
					}
					srv, err := startEmbeddedNATS(ctx, em, serverName, log)
					if err != nil {
						return err
					}
					defer srv.Shutdown()
					if nc, err = streams.Connect(ctx, streams.ConnectOptions{InProcess: srv.Server(), Name: "switchyard-router-" + o.Cluster, Logger: log}); err != nil {
						return err
					}
				} else {
					for _, f := range []string{"embed-nats-listen", "embed-nats-leaf", "embed-nats-data-dir"} {
						if flagSet(fs, f) {
							return usagef("--%s needs --embed-nats", f)
						}
					}
					// Routers never wait on the control plane: start even if NATS is not up yet.
					if nc, err = streams.Connect(ctx, withWait(url.options("switchyard-router-"+o.Cluster, log))); err != nil {
						return err
					}
				}
				defer nc.Close()
				o.Conn, o.Logger = nc, log // the service adds component, cluster and router
				svc, err := router.NewService(o)
				if err != nil {
					return usageError{err}
				}
				return svc.Run(ctx)
			}
		},
		printsConfig: true,
	}
}

// embedOptions are the router command's --embed-nats flags.
type embedOptions struct {
	on      bool
	listen  string // host:port, or "" for in-process only
	leaf    string // comma-separated leaf-node URLs of the main NATS
	dataDir string
	// creds and remote are what the leaf connection presents to the hub
	// and checks it with (--creds, --tls-ca, --tls-cert, --tls-key).
	creds  string
	remote natsembed.TLS
}

// startEmbeddedNATS starts the router's own NATS server (named name, if
// any): a leaf node of the main NATS without JetStream when em.leaf is set
// (it starts while the hub is down and joins it when it comes), else a
// standalone server with JetStream whose layout it provisions.
func startEmbeddedNATS(ctx context.Context, em embedOptions, name string, log zerolog.Logger) (*natsembed.Server, error) {
	so := natsembed.Options{Port: 0, ServerName: name}
	if name == "" {
		name = "switchyard-router"
	}
	if em.listen != "" {
		host, port, err := net.SplitHostPort(em.listen)
		if err != nil {
			return nil, usagef("--embed-nats-listen %q: %v", em.listen, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 {
			return nil, usagef("--embed-nats-listen %q: the port must be 1 to 65535", em.listen)
		}
		if host == "" {
			return nil, usagef("--embed-nats-listen %q: give the host (e.g. 127.0.0.1)", em.listen)
		}
		so.Host, so.Port = host, p
	}
	for _, u := range strings.Split(em.leaf, ",") {
		if u = strings.TrimSpace(u); u == "" {
			continue
		}
		if pu, err := neturl.Parse(u); err != nil || pu.Host == "" || (pu.Scheme != "nats-leaf" && pu.Scheme != "nats") {
			return nil, usagef("--embed-nats-leaf %q is not a URL like nats-leaf://host:7422", u)
		}
		so.LeafRemotes = append(so.LeafRemotes, u)
	}
	if len(so.LeafRemotes) > 0 {
		so.NoJetStream = true
		so.LeafCreds = em.creds
		if em.remote.CAFile != "" {
			so.LeafRemoteTLS = em.remote
		} else if em.remote.CertFile != "" {
			return nil, usagef("--tls-cert with --embed-nats-leaf needs --tls-ca, the authority of the hub's certificate")
		}
	} else {
		so.DataDir = em.dataDir
	}
	slog := log.With().Str("component", "nats").Logger()
	so.Logger = &slog
	srv, err := natsembed.Start(so)
	if err != nil {
		return nil, err
	}
	ev := log.Info().Str("url", srv.ClientURL()).Bool("in_process", true)
	if so.NoJetStream {
		ev = ev.Strs("leaf_of", so.LeafRemotes).Bool("leaf_creds", so.LeafCreds != "").Bool("leaf_tls", so.LeafRemoteTLS.CAFile != "")
	} else {
		ev = ev.Str("data_dir", so.DataDir)
	}
	ev.Msg("embedded NATS server running; the router is connected to it in-process")
	if so.NoJetStream {
		return srv, nil
	}
	nc, err := streams.Connect(ctx, streams.ConnectOptions{InProcess: srv.Server(), Name: name + "-provision", Logger: log})
	if err == nil {
		var js jetstream.JetStream
		if js, err = jetstream.New(nc); err == nil {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err = streams.Provision(pctx, js, streams.DefaultNames(), streams.ProvisionOptions{})
			cancel()
		}
		nc.Close()
	}
	if err != nil {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded NATS server: provision: %w", err)
	}
	return srv, nil
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

// parseAlias splits an --alias value, ALIAS=MODEL, at its first "=" not
// escaped by a backslash: both may be model ids with "=" in them
// (messages.ModelToken escapes it in subjects), and MODEL is taken as it is
// after the separator, so only an "=" in ALIAS needs writing "\=" (and a
// backslash that ends ALIAS "\\"); another backslash stands for itself.
func parseAlias(s string) (alias, model string, err error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && i+1 < len(s) && (s[i+1] == '=' || s[i+1] == '\\'):
			i++
			b.WriteByte(s[i])
		case c == '=':
			alias, model = b.String(), s[i+1:]
			if alias == "" || model == "" {
				return "", "", fmt.Errorf("%q is not ALIAS=MODEL: alias %q, model %q (neither may be empty)", s, alias, model)
			}
			return alias, model, nil
		default:
			b.WriteByte(c)
		}
	}
	return "", "", fmt.Errorf("%q is not ALIAS=MODEL: no = outside an escape (write = in ALIAS as \\=)", s)
}
