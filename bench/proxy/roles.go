package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/internal/procruntime"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/httpfront"
	"github.com/switchyard-dev/switchyard/router/natsfront"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/router/upstream"
	"github.com/switchyard-dev/switchyard/services/enginesim"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/streams/natsembed"
)

// The benchmark runs every server in its own process, as in production and
// as nginx runs anyway: the parent (load generator and orchestrator)
// re-executes its own binary with -role. A child prints one line
// "ready <addr> [<subject>]" on stdout once it serves, and stops on SIGTERM
// or when its stdin (a pipe from the parent) closes.

// Names used throughout.
const (
	benchModel   = "bench"
	benchEngine  = "e1"
	benchCluster = "A"
)

// roleFlags are the flags children understand.
type roleFlags struct {
	natsURL    string
	engineURL  string
	subject    string
	engineKind string
	cpuProfile string
	reporter   bool
	dataDir    string
	syncQueue  int
	runtime    procruntime.Options
	cluster    string
	writeBuf   int
	httpServer string
}

func runRole(role string, args []string) error {
	fs := flag.NewFlagSet(role, flag.ContinueOnError)
	var rf roleFlags
	fs.StringVar(&rf.natsURL, "nats", "", "NATS URL")
	fs.StringVar(&rf.engineURL, "engine-url", "", "engine base URL")
	fs.StringVar(&rf.subject, "subject", "", "engine NATS inference subject")
	fs.StringVar(&rf.engineKind, "engine", "sim", "engine kind: sim or trivial")
	fs.StringVar(&rf.cpuProfile, "cpuprofile", "", "write a CPU profile of this process here")
	fs.BoolVar(&rf.reporter, "reporter", true, "router: report to NATS as the router service does")
	fs.StringVar(&rf.dataDir, "data", "", "NATS data directory")
	fs.IntVar(&rf.syncQueue, "sync-queue", 0, "router-nats: nats.SyncQueueLen of the router's connection (0: the nats.go default, 65536)")
	fs.StringVar(&rf.cluster, "cluster", benchCluster, "router: frontend cluster (the NATS front's subject and queue group)")
	fs.IntVar(&rf.writeBuf, "natswbuf", 0, "router-nats: nats.WriteBufferSize of the router's connection, the size at which a publish flushes in the publisher's goroutine (0: the nats.go default)")
	fs.IntVar(&rf.runtime.MaxProcs, "gomaxprocs", 0, "router: GOMAXPROCS (0: the runtime's default)")
	fs.StringVar(&rf.httpServer, "http-server", string(httpfront.DefaultServerKind), "router-http: the HTTP server, fasthttp or std (net/http), as the router command's --http-server")
	fs.IntVar(&rf.runtime.GCPercent, "gogc", procruntime.DefaultGCPercent, "router: GOGC, as the router command's --gogc (0: the runtime's default)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if role == "router-http" || role == "router-nats" || role == "router-nats-coloc" {
		rf.runtime.Apply()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // the parent went away: stop
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	if rf.cpuProfile != "" {
		f, err := os.Create(rf.cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		}()
	}
	switch role {
	case "nats":
		return roleNATS(ctx, rf)
	case "engine":
		return roleEngine(ctx, rf)
	case "revproxy":
		return roleRevProxy(ctx, rf)
	case "router-http":
		return roleRouterHTTP(ctx, rf)
	case "router-nats":
		return roleRouterNATS(ctx, rf)
	case "router-nats-coloc":
		return roleRouterNATSColoc(ctx, rf)
	}
	return fmt.Errorf("unknown role %q", role)
}

func ready(fields ...string) {
	w := bufio.NewWriter(os.Stdout)
	_, _ = w.WriteString("ready")
	for _, f := range fields {
		_, _ = w.WriteString(" " + f)
	}
	_, _ = w.WriteString("\n")
	_ = w.Flush()
}

func connect(ctx context.Context, url, name string) (*nats.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return streams.Connect(cctx, streams.ConnectOptions{URLs: []string{url}, Name: name, Logger: zerolog.Nop()})
}

// roleNATS runs an embedded NATS server (JetStream in memory, the layout
// provisioned so that router reports have their stream).
func roleNATS(ctx context.Context, rf roleFlags) error {
	srv, err := natsembed.Start(natsembed.Options{DataDir: rf.dataDir, Port: -1})
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	nc, err := connect(ctx, srv.ClientURL(), "bench-provision")
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = streams.Provision(pctx, js, streams.DefaultNames(), streams.ProvisionOptions{Memory: true})
	cancel()
	nc.Close()
	if err != nil {
		return err
	}
	ready(srv.ClientURL())
	<-ctx.Done()
	return nil
}

// trivialBody is what the trivial engine answers: the shape of the
// simulator's non-streamed answer to the benchmark request.
const trivialBody = `{"id":"chatcmpl-e1-1","object":"chat.completion","created":1700000000,"model":"bench",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"The "},"finish_reason":"length"}],` +
	`"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`

// roleEngine runs the engine: the simulator configured to answer at once
// (one output token, prefill of a few microseconds, batches up to 1024), or
// a trivial fixed answer; over HTTP and NATS.
func roleEngine(ctx context.Context, rf roleFlags) error {
	nc, err := connect(ctx, rf.natsURL, "bench-engine")
	if err != nil {
		return err
	}
	defer nc.Close()
	subject, err := streams.DefaultNames().InferSubject(benchModel, benchEngine)
	if err != nil {
		return err
	}
	if rf.engineKind == "trivial" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		body := []byte(trivialBody)
		h := func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Switchyard-Engine", benchEngine)
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			_, _ = w.Write(body)
		}
		srv := &http.Server{Handler: http.HandlerFunc(h), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
			out := nats.NewMsg(m.Reply)
			out.Header.Set(messages.HeaderStatus, "200")
			out.Header.Set(messages.HeaderLast, "true")
			out.Header.Set("x-switchyard-engine", benchEngine)
			out.Data = body
			_ = nc.PublishMsg(out)
		})
		if err != nil {
			return err
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := nc.Flush(); err != nil {
			return err
		}
		ready("http://"+ln.Addr().String(), subject)
		<-ctx.Done()
		return nil
	}
	e, err := enginesim.New(enginesim.Options{
		Name: benchEngine, Model: benchModel,
		MaxBatch:          1024,
		PrefillMsPerToken: 0.0001, // 3 prompt tokens: a 0.3 µs prefill step
		BaseTBTMs:         0.001,
		TBTGrowthMs:       0.0001,
		OutputTokens:      1,
		PromptTokens:      4,
		KVTokens:          1 << 20,
		Conn:              nc,
		NoSignals:         true,
		Seed:              1,
		Listen:            "127.0.0.1:0",
	})
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = e.Start(sctx)
	cancel()
	if err != nil {
		return err
	}
	defer e.Close()
	ready(e.URL(), e.InferSubject())
	<-ctx.Done()
	return nil
}

// roleRevProxy is the minimal Go reverse proxy: httputil.ReverseProxy with
// a keep-alive pool as large as the router's.
func roleRevProxy(ctx context.Context, rf roleFlags) error {
	u, err := url.Parse(rf.engineURL)
	if err != nil {
		return err
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	// The limits of the router's std server (httpfront.ServerOptions' defaults).
	return serveHTTP(ctx, &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second,
		MaxHeaderBytes: 64 << 10})
}

// serveHTTP serves srv on a free loopback port until ctx ends.
func serveHTTP(ctx context.Context, srv httpfront.Server) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	ready("http://" + ln.Addr().String())
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}

// routerParts builds a router handler over a static table of the one
// engine, with the Reporter as observer as the router service wires it.
func routerParts(ctx context.Context, rf roleFlags, engine selection.Engine, tr upstream.Transport, nc *nats.Conn) (*router.Handler, error) {
	table, err := selection.NewTable([]selection.Engine{engine}, selection.TableOptions{})
	if err != nil {
		return nil, err
	}
	tables := router.NewStaticTables()
	tables.Set(benchModel, table, control.Info{Generation: 1, Mode: control.ModeSnapshot, Created: time.Now()})
	name := rf.cluster + "-bench"
	opts := router.Options{Tables: tables, Transport: tr, Cluster: rf.cluster, Router: name}
	if rf.reporter {
		rep, err := control.NewReporter(control.ReporterOptions{Conn: nc, Cluster: rf.cluster, Router: name, Tables: tables})
		if err != nil {
			return nil, err
		}
		go func() { _ = rep.Run(ctx) }()
		opts.Observer = rep
	}
	return router.NewHandler(opts)
}

// roleRouterHTTP is the Switchyard router's HTTP front forwarding over HTTP.
func roleRouterHTTP(ctx context.Context, rf roleFlags) error {
	nc, err := connect(ctx, rf.natsURL, "bench-router-http")
	if err != nil {
		return err
	}
	defer nc.Close()
	h, err := routerParts(ctx, rf, selection.Engine{Name: benchEngine, URL: rf.engineURL, Weight: 1},
		upstream.NewHTTPTransport(upstream.HTTPTransportOptions{}), nc)
	if err != nil {
		return err
	}
	kind, err := httpfront.ParseServerKind(rf.httpServer)
	if err != nil {
		return err
	}
	srv, err := router.NewServer(h, httpfront.ServerOptions{Kind: kind})
	if err != nil {
		return err
	}
	return serveHTTP(ctx, srv)
}

// roleRouterNATS is the router's NATS front (sy.req.A.bench) forwarding
// over NATS request-reply to the engine's subject.
func roleRouterNATS(ctx context.Context, rf roleFlags) error {
	var nc *nats.Conn
	var err error
	if rf.syncQueue > 0 || rf.writeBuf > 0 {
		// Experiments: nats.SyncQueueLen sizes the channels of synchronous
		// subscriptions; nats.WriteBufferSize is the buffered size at which
		// a publish writes to the socket itself rather than waking the
		// connection's flusher goroutine.
		opts := []nats.Option{nats.Name("bench-router-nats")}
		if rf.syncQueue > 0 {
			opts = append(opts, nats.SyncQueueLen(rf.syncQueue))
		}
		if rf.writeBuf > 0 {
			opts = append(opts, nats.WriteBufferSize(rf.writeBuf))
		}
		nc, err = nats.Connect(rf.natsURL, opts...)
	} else {
		nc, err = connect(ctx, rf.natsURL, "bench-router-nats")
	}
	if err != nil {
		return err
	}
	defer nc.Close()
	return serveNATSFront(ctx, rf, nc)
}

// serveNATSFront runs the router's NATS front on nc (sy.req.<cluster>.bench)
// forwarding over nc to the engine's subject, and prints the ready line
// with the front's subject after extra.
func serveNATSFront(ctx context.Context, rf roleFlags, nc *nats.Conn, extra ...string) error {
	nt, err := upstream.NewNATSTransport(upstream.NATSTransportOptions{Conn: nc})
	if err != nil {
		return err
	}
	h, err := routerParts(ctx, rf, selection.Engine{Name: benchEngine, Subject: rf.subject, Weight: 1}, nt, nc)
	if err != nil {
		return err
	}
	front, err := natsfront.New(natsfront.Options{Conn: nc, Cluster: rf.cluster, Pipeline: h})
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- front.Run(ctx) }()
	subj, err := streams.DefaultNames().RequestSubject(rf.cluster, benchModel)
	if err != nil {
		return err
	}
	// The front subscribes in Run: wait until the server has that interest,
	// so that the parent's first request finds it.
	if err := nc.Flush(); err != nil {
		return err
	}
	ready(append(extra, subj)...)
	return <-errc
}

// roleRouterNATSColoc is the router co-located with its NATS server, as
// `switchyard router --embed-nats` runs it: an embedded NATS server (its
// own JetStream in memory, provisioned, with a client listener for the
// engine and the load generator) in the router's process, the router
// connected to it in-process (nats.InProcessServer: no socket between
// server and router). Ready line: the server's client URL and the front's
// subject. The engine connects to that URL over TCP as to any server.
func roleRouterNATSColoc(ctx context.Context, rf roleFlags) error {
	srv, err := natsembed.Start(natsembed.Options{DataDir: rf.dataDir, Port: -1})
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	nc, err := streams.Connect(cctx, streams.ConnectOptions{InProcess: srv.Server(), Name: "bench-router-nats-coloc", Logger: zerolog.Nop()})
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if err := streams.Provision(cctx, js, streams.DefaultNames(), streams.ProvisionOptions{Memory: true}); err != nil {
		return err
	}
	if rf.subject == "" {
		if rf.subject, err = streams.DefaultNames().InferSubject(benchModel, benchEngine); err != nil {
			return err
		}
	}
	return serveNATSFront(ctx, rf, nc, srv.ClientURL())
}
