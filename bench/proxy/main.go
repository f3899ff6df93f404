// Command proxy measures what the Switchyard router adds to a request, on
// 127.0.0.1, in one run:
//
//   - HTTP: the engine directly, through a minimal httputil.ReverseProxy,
//     through nginx (reverse proxy with upstream keep-alive) and through the
//     router's HTTP front (static table of the one engine); latency at a
//     fixed moderate rate (open loop) and peak requests per second (closed
//     loop), plus each proxy's CPU time per request;
//   - NATS: a raw request-reply to the engine's sy.infer.<model>.<engine>
//     subject against the same request through the router's NATS front
//     (sy.req.<cluster>.<model>) forwarding over NATS to the engine, in two
//     topologies: the router and the NATS server as separate processes, and
//     the router co-located with its NATS server (one process, the router
//     connected in-process), each against a raw request-reply through the
//     same server.
//
// Every server runs in its own process (this binary re-executed with
// -role, and nginx); the parent is the load generator. Targets are measured
// back to back in a rotating order, and the whole set is repeated -runs
// times; the tables give the median of the runs. See bench/README.md.
//
//	go run ./bench/proxy            # or bench/proxy.sh, which installs nginx
package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard-dev/switchyard/router/httpfront"
)

type config struct {
	runs       int
	rate       float64
	latN       int
	latMax     time.Duration
	workers    int
	peakConc   int
	peakN      int
	peakDur    time.Duration
	warmup     int
	engine     string
	nginxBin   string
	noNginx    bool
	nginxProcs int
	profileDir string
	reporter   bool
	timeout    time.Duration
	verbose    bool
	keep       bool
	syncQueue  int
	routerRT   string
	variant    string
	variantExe string
	coloc      bool
	groups     string
}

func main() {
	if len(os.Args) > 2 && os.Args[1] == "-role" {
		if err := runRole(os.Args[2], os.Args[3:]); err != nil {
			fmt.Fprintf(os.Stderr, "role %s: %v\n", os.Args[2], err)
			os.Exit(1)
		}
		return
	}
	var c config
	flag.IntVar(&c.runs, "runs", 3, "repetitions of the whole set; tables show medians")
	flag.Float64Var(&c.rate, "rate", 500, "open-loop rate of the latency phase, requests/s")
	flag.IntVar(&c.latN, "lat-n", 2500, "requests per latency phase")
	flag.DurationVar(&c.latMax, "lat-max", 6*time.Second, "bound on a latency phase")
	flag.IntVar(&c.workers, "workers", 32, "open-loop worker pool (most requests a phase has in flight)")
	flag.IntVar(&c.peakConc, "peak-conc", 64, "closed-loop concurrency of the peak phase")
	flag.IntVar(&c.peakN, "peak-n", 200000, "bound on the requests of a peak phase")
	flag.DurationVar(&c.peakDur, "peak-dur", 3*time.Second, "duration of a peak phase")
	flag.IntVar(&c.warmup, "warmup", 500, "unmeasured requests before each target's phases")
	flag.StringVar(&c.engine, "engine", "sim", "engine: sim (services/enginesim, one output token) or trivial (fixed answer)")
	flag.StringVar(&c.nginxBin, "nginx", "", "nginx binary (default: nginx on PATH, else /usr/sbin/nginx)")
	flag.BoolVar(&c.noNginx, "no-nginx", false, "skip nginx")
	flag.IntVar(&c.nginxProcs, "nginx-workers", 2, "nginx worker_processes")
	flag.StringVar(&c.profileDir, "profile", "", "write CPU profiles of the router processes into this directory")
	flag.BoolVar(&c.reporter, "reporter", true, "routers report to NATS every second, as the router service does")
	flag.DurationVar(&c.timeout, "timeout", 15*time.Minute, "bound on the whole run")
	flag.BoolVar(&c.verbose, "v", false, "print every run's table too")
	flag.BoolVar(&c.keep, "keep", false, "keep the temp dir with the servers' logs")
	flag.IntVar(&c.syncQueue, "router-sync-queue", 0, "experiment: nats.SyncQueueLen of the NATS router's connection (0: default)")
	flag.StringVar(&c.routerRT, "router-runtime", "", "runtime settings of the router processes and the HTTP router's server, e.g. gomaxprocs=1,gogc=100,server=std (empty: the router command's defaults)")
	flag.StringVar(&c.variant, "variant", "", "also measure, in the same run, a second pair of routers with these settings (as -router-runtime, e.g. server=std), named router′ and NATS via router′")
	flag.StringVar(&c.variantExe, "variant-exe", "", "run the -variant routers from this build of bench/proxy (e.g. one built from another commit), for a same-run A/B of router code; implies -variant")
	flag.BoolVar(&c.coloc, "coloc", true, "also measure the router co-located with its NATS server (one process, connected in-process), against raw NATS through that server")
	flag.StringVar(&c.groups, "groups", "http,nats", "which tables to measure: http, nats or both (comma-separated); the servers all start either way")
	flag.Parse()
	if c.variantExe != "" && c.variant == "" {
		c.variant = " "
	}
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "bench/proxy:", err)
		os.Exit(1)
	}
}

// target is one path a request can take.
type target struct {
	name   string
	do     doer
	closer func()
	pid    int    // the proxy's process (0: none)
	tree   bool   // count the proxy's child processes too (nginx workers)
	server int    // the NATS server's process (NATS targets)
	engine int    // the engine's process (0: the shared engine)
	base   string // NATS targets: the raw path the p50 ratio is taken against
}

// sample is one run's measurement of one target.
type sample struct {
	lat, peak result
	proxyCPU  time.Duration // during the peak phase
	proxyCS   int64         // the proxy's context switches during the latency phase
	engineCPU time.Duration
	serverCPU time.Duration // NATS server
}

func run(c config) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	dir, err := os.MkdirTemp("", "sy-bench-proxy-")
	if err != nil {
		return err
	}
	if c.keep {
		fmt.Printf("logs in %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	var children []*child
	defer func() {
		for i := len(children) - 1; i >= 0; i-- {
			children[i].stop()
		}
	}()
	start := func(role string, args ...string) (*child, error) {
		ch, err := startChild(ctx, dir, role, args...)
		if err != nil {
			return nil, err
		}
		children = append(children, ch)
		return ch, nil
	}
	natsC, err := start("nats", "-data", filepath.Join(dir, "nats"))
	if err != nil {
		return err
	}
	natsURL := natsC.fields[0]
	eng, err := start("engine", "-nats", natsURL, "-engine", c.engine)
	if err != nil {
		return err
	}
	engineURL, engineSubject := eng.fields[0], eng.fields[1]
	rp, err := start("revproxy", "-engine-url", engineURL)
	if err != nil {
		return err
	}
	prof := func(name string) []string {
		if c.profileDir == "" {
			return nil
		}
		p, _ := filepath.Abs(filepath.Join(c.profileDir, name))
		return []string{"-cpuprofile", p}
	}
	if c.profileDir != "" {
		if err := os.MkdirAll(c.profileDir, 0o755); err != nil {
			return err
		}
	}
	rep := fmt.Sprintf("-reporter=%t", c.reporter)
	mainRT, err := runtimeArgs(c.routerRT)
	if err != nil {
		return err
	}
	rh, err := start("router-http", append(append([]string{"-nats", natsURL, "-engine-url", engineURL, rep}, mainRT...), prof("router-http.pprof")...)...)
	if err != nil {
		return err
	}
	rn, err := start("router-nats", append(append([]string{"-nats", natsURL, "-subject", engineSubject, rep,
		fmt.Sprintf("-sync-queue=%d", c.syncQueue)}, mainRT...), prof("router-nats.pprof")...)...)
	if err != nil {
		return err
	}
	routerSubject := rn.fields[0]
	// Co-located topology: the router and its NATS server in one process
	// (the router connected in-process), and an engine of its own connected
	// to that server over TCP, as the load generator is.
	var co, coEng *child
	if c.coloc {
		if co, err = start("router-nats-coloc", append(append([]string{"-data", filepath.Join(dir, "nats-coloc"), "-subject", engineSubject, rep}, mainRT...), prof("router-nats-coloc.pprof")...)...); err != nil {
			return err
		}
		ch, err := startNamedChild(ctx, "", dir, "engine-coloc", "engine", "-nats", co.fields[0], "-engine", c.engine)
		if err != nil {
			return err
		}
		children = append(children, ch)
		coEng = ch
	}
	var vh, vn *child
	if c.variant != "" {
		vrt, err := runtimeArgs(c.variant)
		if err != nil {
			return err
		}
		named := func(name, role string, args ...string) (*child, error) {
			ch, err := startNamedChild(ctx, c.variantExe, dir, name, role, args...)
			if err == nil {
				children = append(children, ch)
			}
			return ch, err
		}
		if vh, err = named("router-http-variant", "router-http", append([]string{"-nats", natsURL, "-engine-url", engineURL, rep}, vrt...)...); err != nil {
			return err
		}
		if vn, err = named("router-nats-variant", "router-nats", append([]string{"-nats", natsURL, "-subject", engineSubject, rep,
			fmt.Sprintf("-sync-queue=%d", c.syncQueue), "-cluster", "B"}, vrt...)...); err != nil {
			return err
		}
	}

	var ngx *nginx
	nginxNote := ""
	if !c.noNginx {
		bin := c.nginxBin
		if bin == "" {
			if p, err := exec.LookPath("nginx"); err == nil {
				bin = p
			} else if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
				bin = "/usr/sbin/nginx"
			}
		}
		if bin == "" {
			nginxNote = "nginx not found (install Debian's nginx-light, or run bench/proxy.sh); skipped"
		} else {
			u, _ := url.Parse(engineURL)
			ngx, err = startNginx(bin, dir, u.Host, c.nginxProcs)
			if err != nil {
				return err
			}
			defer ngx.stop()
		}
	}

	const path = "/v1/chat/completions"
	conns := max(c.peakConc, c.workers)
	mk := func(name, base string, pid int, tree bool) target {
		d, cl := httpDoer(base+path, conns)
		return target{name: name, do: d, closer: cl, pid: pid, tree: tree}
	}
	httpTargets := []target{mk("direct", engineURL, 0, false), mk("ReverseProxy", rp.fields[0], rp.pid(), false)}
	if ngx != nil {
		httpTargets = append(httpTargets, mk("nginx", ngx.url, ngx.pid(), true))
	}
	httpTargets = append(httpTargets, mk("router", rh.fields[0], rh.pid(), false))
	if vh != nil {
		httpTargets = append(httpTargets, mk(variantName, vh.fields[0], vh.pid(), false))
	}
	defer func() {
		for _, t := range httpTargets {
			t.closer()
		}
	}()

	nc, err := connect(ctx, natsURL, "bench-load")
	if err != nil {
		return err
	}
	defer nc.Close()
	natsTargets := []target{
		{name: "NATS raw", do: natsDoer(nc, engineSubject), server: natsC.pid()},
		{name: "NATS via router", do: natsDoer(nc, routerSubject), pid: rn.pid(), server: natsC.pid(), base: "NATS raw"},
	}
	if vn != nil {
		natsTargets = append(natsTargets, target{name: "NATS via " + variantName, do: natsDoer(nc, vn.fields[0]), pid: vn.pid(), server: natsC.pid(), base: "NATS raw"})
	}
	if co != nil {
		cnc, err := connect(ctx, co.fields[0], "bench-load-coloc")
		if err != nil {
			return err
		}
		defer cnc.Close()
		// The router's process is the server's: its CPU and context
		// switches are the server's and the router's together.
		natsTargets = append(natsTargets,
			target{name: colocRaw, do: natsDoer(cnc, engineSubject), server: co.pid(), engine: coEng.pid()},
			target{name: colocRouter, do: natsDoer(cnc, co.fields[1]), pid: co.pid(), server: co.pid(), engine: coEng.pid(), base: colocRaw})
	}
	for _, t := range append(slices.Clone(httpTargets), natsTargets...) {
		if err := waitServing(ctx, t); err != nil {
			return err
		}
	}

	if c.routerRT != "" {
		fmt.Printf("router runtime: %s\n", c.routerRT)
	}
	if c.variant != "" {
		fmt.Printf("%s: the router with runtime %q", variantName, strings.TrimSpace(c.variant))
		if c.variantExe != "" {
			fmt.Printf(", run from %s", c.variantExe)
		}
		fmt.Println()
	}
	fmt.Printf("engine %s; open loop %.0f req/s × %d requests (pool %d); peak: closed loop, %d clients, %s; %d runs\n",
		c.engine, c.rate, c.latN, c.workers, c.peakConc, c.peakDur, c.runs)
	if nginxNote != "" {
		fmt.Println(nginxNote)
	}
	samples := make(map[string][]sample)
	var groups [][]target
	for g := range strings.SplitSeq(c.groups, ",") {
		switch strings.TrimSpace(g) {
		case "http":
			groups = append(groups, httpTargets)
		case "nats":
			groups = append(groups, natsTargets)
		default:
			return fmt.Errorf("-groups: %q is not http or nats", g)
		}
	}
	for r := range c.runs {
		for _, group := range groups {
			order := slices.Clone(group)
			k := r % len(order) // rotate: no target is always first or last
			order = append(order[k:], order[:k]...)
			for _, t := range order {
				if err := ctx.Err(); err != nil {
					return err
				}
				ep := eng.pid()
				if t.engine != 0 {
					ep = t.engine
				}
				s := measure(ctx, c, t, ep)
				samples[t.name] = append(samples[t.name], s)
				fmt.Fprintf(os.Stderr, "run %d %-16s p50 %7.1f µs  p99 %7.1f µs  peak %7.0f req/s  errors %d/%d\n",
					r+1, t.name, us(s.lat.pct(0.5)), us(s.lat.pct(0.99)), s.peak.rps(), s.lat.errs, s.peak.errs)
				for _, e := range []error{s.lat.firstErr, s.peak.firstErr} {
					if e != nil {
						fmt.Fprintf(os.Stderr, "    first error: %v\n", e)
					}
				}
			}
		}
		if c.verbose {
			fmt.Printf("\nrun %d\n", r+1)
			report(runOf(samples, r), httpTargets, natsTargets)
		}
	}
	fmt.Printf("\nmedians of %d runs\n", c.runs)
	report(samples, httpTargets, natsTargets)
	return nil
}

// runOf returns run r's sample of every target measured in that run. A
// target of a group that -groups leaves out has no samples at all, so the
// targets are those of samples, not every target started.
func runOf(samples map[string][]sample, r int) map[string][]sample {
	one := make(map[string][]sample, len(samples))
	for name, ss := range samples {
		if r < len(ss) {
			one[name] = ss[r : r+1]
		}
	}
	return one
}

// waitServing sends requests to t until one succeeds (a front may need a
// moment to subscribe) or 10 s pass.
func waitServing(ctx context.Context, t target) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := t.do(ctx)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s does not answer: %w", t.name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func measure(ctx context.Context, c config, t target, enginePID int) sample {
	closedLoop(ctx, t.do, c.peakConc, c.warmup, 5*time.Second)
	var s sample
	var cs0 int64
	if t.pid != 0 {
		cs0 = ctxSwitches(t.pid, t.tree)
	}
	s.lat = openLoop(ctx, t.do, c.rate, c.workers, c.latN, c.latMax)
	if t.pid != 0 {
		s.proxyCS = ctxSwitches(t.pid, t.tree) - cs0
	}
	closedLoop(ctx, t.do, c.peakConc, c.warmup, 5*time.Second)
	var p0 time.Duration
	if t.pid != 0 {
		p0 = cpuTime(t.pid, t.tree)
	}
	e0 := cpuTime(enginePID, false)
	var n0 time.Duration
	if t.server != 0 {
		n0 = cpuTime(t.server, false)
	}
	s.peak = closedLoop(ctx, t.do, c.peakConc, c.peakN, c.peakDur)
	if t.server != 0 {
		s.serverCPU = cpuTime(t.server, false) - n0
	}
	if t.pid != 0 {
		s.proxyCPU = cpuTime(t.pid, t.tree) - p0
	}
	s.engineCPU = cpuTime(enginePID, false) - e0
	return s
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// median returns the median of f over ss.
func median(ss []sample, f func(sample) float64) float64 {
	v := make([]float64, len(ss))
	for i, s := range ss {
		v[i] = f(s)
	}
	return medianOf(v)
}

// medianPaired returns the median over runs of f(a's sample, b's sample of
// the same run): ratios and differences are taken within a run.
func medianPaired(a, b []sample, f func(a, b sample) float64) float64 {
	n := min(len(a), len(b))
	v := make([]float64, n)
	for i := range n {
		v[i] = f(a[i], b[i])
	}
	return medianOf(v)
}

func medianOf(v []float64) float64 {
	slices.Sort(v)
	switch n := len(v); {
	case n == 0:
		return 0
	case n%2 == 1:
		return v[n/2]
	default:
		return (v[n/2-1] + v[n/2]) / 2
	}
}

func cpuPerReq(cpu time.Duration, r result) float64 {
	if r.n == 0 {
		return 0
	}
	return us(cpu) / float64(r.n)
}

// csPerReq is the proxy's context switches per request of the latency
// phase: how many times its threads went to sleep and were woken.
func csPerReq(s sample) float64 {
	if s.lat.n == 0 {
		return 0
	}
	return float64(s.proxyCS) / float64(s.lat.n)
}

func report(samples map[string][]sample, httpTargets, natsTargets []target) {
	direct := samples["direct"]
	ngx, haveNginx := samples["nginx"]
	if len(direct) > 0 {
		reportHTTP(samples, httpTargets)
	}
	if len(samples["NATS raw"]) > 0 {
		reportNATS(samples, natsTargets)
	}
	fmt.Println()
	for _, name := range []string{"router", variantName} {
		if rt, ok := samples[name]; ok && haveNginx {
			ra := medianPaired(rt, direct, func(a, b sample) float64 { return us(a.lat.pct(0.5) - b.lat.pct(0.5)) })
			na := medianPaired(ngx, direct, func(a, b sample) float64 { return us(a.lat.pct(0.5) - b.lat.pct(0.5)) })
			tr := medianPaired(rt, ngx, func(a, b sample) float64 { return a.peak.rps() / b.peak.rps() })
			fmt.Printf("goal: %s added p50 ≤ nginx's: %.1f µs vs %.1f µs: %s\n", name, ra, na, verdict(ra <= na))
			fmt.Printf("goal: %s peak ≥ 0.8 × nginx's: %.2f×: %s\n", name, tr, verdict(tr >= 0.8))
		}
		if rn, ok := samples["NATS via "+name]; ok {
			nr := medianPaired(rn, samples["NATS raw"], p50Ratio)
			fmt.Printf("goal: NATS via %s p50 ≤ 1.5 × raw: %.2f×: %s\n", name, nr, verdict(nr <= 1.5))
		}
	}
	if cr, ok := samples[colocRouter]; ok {
		nr := medianPaired(cr, samples[colocRaw], p50Ratio)
		fmt.Printf("goal: %s p50 ≤ 1.5 × raw through that server: %.2f×: %s\n", colocRouter, nr, verdict(nr <= 1.5))
		fmt.Println("(co-located router: its process is the NATS server's, so its router CPU, context switches and NATS server CPU are all that one process's: server and router together)")
		sep, sepRaw, coRaw := samples["NATS via router"], samples["NATS raw"], samples[colocRaw]
		n := min(len(cr), len(coRaw), len(sep), len(sepRaw))
		var rel []float64
		var perRun []string
		metSep, metCo := 0, 0
		for i := range n {
			a, b := p50Ratio(sep[i], sepRaw[i]), p50Ratio(cr[i], coRaw[i])
			rel = append(rel, b/a)
			perRun = append(perRun, fmt.Sprintf("%.2f/%.2f", a, b))
			if a <= 1.5 {
				metSep++
			}
			if b <= 1.5 {
				metCo++
			}
		}
		fmt.Printf("p50 ratio to raw per run, separate/co-located: %s; ≤ 1.5× in %d/%d runs separate, %d/%d co-located; co-located ratio ÷ separate ratio, median over runs: %.2f\n",
			strings.Join(perRun, " "), metSep, n, metCo, n, medianOf(rel))
	}
	reportVariant(samples)
	reportLate(samples, append(slices.Clone(httpTargets), natsTargets...))
}

// p50Ratio is a's latency-phase p50 over b's.
func p50Ratio(a, b sample) float64 { return float64(a.lat.pct(0.5)) / float64(b.lat.pct(0.5)) }

func reportHTTP(samples map[string][]sample, httpTargets []target) {
	direct := samples["direct"]
	ngx, haveNginx := samples["nginx"]
	fmt.Println()
	fmt.Println("| path | p50 µs | p99 µs | added p50 µs | added p99 µs | peak req/s | peak vs nginx | proxy CPU µs/req | proxy ctx switches/req | errors |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for _, t := range httpTargets {
		ss := samples[t.name]
		added50, added99, vsNginx, cpu, cs := "—", "—", "—", "—", "—"
		if t.name != "direct" {
			cs = fmt.Sprintf("%.2f", median(ss, csPerReq))
			added50 = fmt.Sprintf("%.1f", medianPaired(ss, direct, func(a, b sample) float64 { return us(a.lat.pct(0.5) - b.lat.pct(0.5)) }))
			added99 = fmt.Sprintf("%.1f", medianPaired(ss, direct, func(a, b sample) float64 { return us(a.lat.pct(0.99) - b.lat.pct(0.99)) }))
			cpu = fmt.Sprintf("%.1f", median(ss, func(s sample) float64 { return cpuPerReq(s.proxyCPU, s.peak) }))
		}
		if haveNginx {
			vsNginx = fmt.Sprintf("%.2f×", medianPaired(ss, ngx, func(a, b sample) float64 { return a.peak.rps() / b.peak.rps() }))
		}
		errs, total := 0, 0
		for _, s := range ss {
			errs += s.lat.errs + s.peak.errs
			total += s.lat.n + s.peak.n + s.lat.errs + s.peak.errs
		}
		fmt.Printf("| %s | %.1f | %.1f | %s | %s | %.0f | %s | %s | %s | %d/%d |\n", t.name,
			median(ss, func(s sample) float64 { return us(s.lat.pct(0.5)) }),
			median(ss, func(s sample) float64 { return us(s.lat.pct(0.99)) }),
			added50, added99,
			median(ss, func(s sample) float64 { return s.peak.rps() }),
			vsNginx, cpu, cs, errs, total)
	}
	engCPU := median(direct, func(s sample) float64 { return cpuPerReq(s.engineCPU, s.peak) })
	fmt.Printf("\nengine CPU per request (direct, peak phase): %.1f µs\n", engCPU)
}

func reportNATS(samples map[string][]sample, natsTargets []target) {
	fmt.Println()
	fmt.Println("| path | p50 µs | p99 µs | p50 ratio | p99 ratio | peak req/s | router CPU µs/req | router ctx switches/req | NATS server CPU µs/req | errors |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for _, t := range natsTargets {
		ss := samples[t.name]
		r50, r99, cpu, cs := "—", "—", "—", "—"
		if t.base != "" {
			raw := samples[t.base]
			r50 = fmt.Sprintf("%.2f×", medianPaired(ss, raw, func(a, b sample) float64 { return float64(a.lat.pct(0.5)) / float64(b.lat.pct(0.5)) }))
			r99 = fmt.Sprintf("%.2f×", medianPaired(ss, raw, func(a, b sample) float64 { return float64(a.lat.pct(0.99)) / float64(b.lat.pct(0.99)) }))
		}
		if t.pid != 0 {
			cs = fmt.Sprintf("%.2f", median(ss, csPerReq))
			cpu = fmt.Sprintf("%.1f", median(ss, func(s sample) float64 { return cpuPerReq(s.proxyCPU, s.peak) }))
		}
		errs, total := 0, 0
		for _, s := range ss {
			errs += s.lat.errs + s.peak.errs
			total += s.lat.n + s.peak.n + s.lat.errs + s.peak.errs
		}
		fmt.Printf("| %s | %.1f | %.1f | %s | %s | %.0f | %s | %s | %.1f | %d/%d |\n", t.name,
			median(ss, func(s sample) float64 { return us(s.lat.pct(0.5)) }),
			median(ss, func(s sample) float64 { return us(s.lat.pct(0.99)) }),
			r50, r99, median(ss, func(s sample) float64 { return s.peak.rps() }), cpu, cs,
			median(ss, func(s sample) float64 { return cpuPerReq(s.serverCPU, s.peak) }), errs, total)
	}
}

// reportVariant compares the -variant routers with the main ones.
func reportVariant(samples map[string][]sample) {
	if v, ok := samples[variantName]; ok {
		rt, direct := samples["router"], samples["direct"]
		n := min(len(v), len(rt), len(direct))
		var added, peak, cpu []float64
		for i := range n {
			added = append(added, us(v[i].lat.pct(0.5)-direct[i].lat.pct(0.5))/us(rt[i].lat.pct(0.5)-direct[i].lat.pct(0.5)))
			peak = append(peak, v[i].peak.rps()/rt[i].peak.rps())
			cpu = append(cpu, cpuPerReq(v[i].proxyCPU, v[i].peak)/cpuPerReq(rt[i].proxyCPU, rt[i].peak))
		}
		fmt.Printf("%s vs router, within each run (medians): added p50 %.2f×, peak %.2f×, CPU/req %.2f×; NATS p50 %.2f×\n", variantName,
			medianOf(added), medianOf(peak), medianOf(cpu),
			medianPaired(samples["NATS via "+variantName], samples["NATS via router"], func(a, b sample) float64 {
				return float64(a.lat.pct(0.5)) / float64(b.lat.pct(0.5))
			}))
	}
}

// reportLate notes the open-loop requests that had to wait for a sender.
func reportLate(samples map[string][]sample, targets []target) {
	var late []string
	for _, t := range targets {
		n := 0
		for _, s := range samples[t.name] {
			n += s.lat.late
		}
		if n > 0 {
			late = append(late, fmt.Sprintf("%s %d", t.name, n))
		}
	}
	if len(late) > 0 {
		fmt.Printf("note: open-loop requests that found the worker pool busy (the rate is not moderate for them): %s\n", strings.Join(late, ", "))
	}
}

// Names of the co-located topology's targets.
const (
	colocRaw    = "NATS raw, co-located server"
	colocRouter = "NATS via co-located router"
)

// variantName names the routers started by -variant.
const variantName = "router′"

// runtimeArgs turns "gomaxprocs=1,gogc=400" into the router roles' flags.
func runtimeArgs(spec string) ([]string, error) {
	var args []string
	for f := range strings.SplitSeq(spec, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		k, v, ok := strings.Cut(f, "=")
		if ok && k == "server" {
			if _, err := httpfront.ParseServerKind(v); err != nil {
				return nil, fmt.Errorf("router setting %q: %w", f, err)
			}
			args = append(args, "-http-server="+v)
			continue
		}
		if !ok || (k != "gomaxprocs" && k != "gogc" && k != "natswbuf") {
			return nil, fmt.Errorf("router setting %q is not gomaxprocs=N, gogc=N, natswbuf=N or server=std|fasthttp", f)
		}
		if _, err := strconv.Atoi(v); err != nil {
			return nil, fmt.Errorf("runtime setting %q: %w", f, err)
		}
		args = append(args, "-"+k+"="+v)
	}
	return args, nil
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}
