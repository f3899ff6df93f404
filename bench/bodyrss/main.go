// Command bodyrss measures what pathological request bodies cost a router
// process: it starts a router front (router.NewHandler over a static table
// of one engine, served by router.NewServer) as a child process on
// 127.0.0.1, sends it rounds of concurrent bodies of the largest size the
// router accepts (8 MiB) whose content makes a careless parser allocate many
// times their size, and reports the child's peak resident set (VmHWM) before
// and after. Every body is rejected before any engine is asked, so no
// engine runs.
//
//	go run ./bench/bodyrss                 # fasthttp and net/http, every shape
//	go run ./bench/bodyrss -server std -shape numbers -conc 12 -rounds 3
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/httpfront"
	"github.com/switchyard-dev/switchyard/router/selection"
)

const bodySize = 8 << 20 // the router's default MaxBodyBytes

// shapes are the pathological bodies, by name.
var shapes = map[string]func() []byte{
	// The shape: a messages array of numbers.
	"numbers": func() []byte { return fill(`{"model":"llama","messages":[`, `1`, `]}`) },
	// Valid messages, one role each: a parser that keeps every message pays per element.
	"objects": func() []byte { return fill(`{"model":"llama","messages":[`, `{"role":"u"}`, `]}`) },
	// A completions prompt of empty strings.
	"prompts": func() []byte { return fill(`{"model":"llama","prompt":[`, `""`, `]}`) },
}

func fill(head, item, tail string) []byte {
	var b bytes.Buffer
	b.Grow(bodySize)
	b.WriteString(head)
	for b.Len()+2*len(item)+len(tail)+1 <= bodySize {
		b.WriteString(item)
		b.WriteByte(',')
	}
	b.WriteString(item)
	b.WriteString(tail)
	return b.Bytes()
}

func main() {
	serve := flag.String("serve", "", "internal: run the router front of this kind and print its address")
	server := flag.String("server", "fasthttp,std", "router HTTP servers to measure, comma-separated (fasthttp, std)")
	shape := flag.String("shape", "numbers,objects,prompts", "body shapes, comma-separated (numbers, objects, prompts)")
	conc := flag.Int("conc", 12, "bodies in flight at once")
	rounds := flag.Int("rounds", 3, "rounds of conc bodies per measurement")
	timeout := flag.Duration("timeout", 5*time.Minute, "bound on the whole run")
	flag.Parse()
	if *serve != "" {
		if err := runFront(httpfront.ServerKind(*serve)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	fmt.Printf("%-9s %-8s %5s %7s %12s %12s %9s %s\n", "server", "shape", "conc", "rounds", "rss_idle_mb", "rss_peak_mb", "secs", "answers")
	for _, kind := range strings.Split(*server, ",") {
		for _, sh := range strings.Split(*shape, ",") {
			mk, ok := shapes[sh]
			if !ok {
				fmt.Fprintf(os.Stderr, "unknown shape %q\n", sh)
				os.Exit(2)
			}
			if err := measure(ctx, kind, sh, mk(), *conc, *rounds); err != nil {
				fmt.Fprintf(os.Stderr, "%s %s: %v\n", kind, sh, err)
				os.Exit(1)
			}
		}
	}
}

// runFront serves a router front on 127.0.0.1 and prints its address.
func runFront(kind httpfront.ServerKind) error {
	tables := router.NewStaticTables()
	t, err := selection.NewTable([]selection.Engine{{Name: "e1", URL: "http://127.0.0.1:1", Weight: 1}}, selection.TableOptions{})
	if err != nil {
		return err
	}
	tables.Set("llama", t, control.Info{Generation: 1, Mode: control.ModeSnapshot, Created: time.Now()})
	h, err := router.NewHandler(router.Options{Tables: tables, Cluster: "A", Logger: zerolog.Nop()})
	if err != nil {
		return err
	}
	srv, err := router.NewServer(h, httpfront.ServerOptions{Kind: kind})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Println(ln.Addr().String())
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); os.Exit(0) }() // the parent closes stdin to stop us
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// measure starts a front of kind, sends rounds of conc bodies and prints
// the child's peak RSS.
func measure(ctx context.Context, kind, shape string, body []byte, conc, rounds int) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, self, "-serve", kind)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { _ = stdin.Close(); _ = cmd.Wait() }()
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		return fmt.Errorf("child address: %w", err)
	}
	addr = strings.TrimSpace(addr)
	idle, err := peakRSS(cmd.Process.Pid)
	if err != nil {
		return err
	}
	path := "/v1/chat/completions"
	if bytes.Contains(body[:min(len(body), 64)], []byte(`"prompt"`)) {
		path = "/v1/completions"
	}
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxConnsPerHost: conc, MaxIdleConnsPerHost: conc}}
	answers := map[int]int{}
	var mu sync.Mutex
	start := time.Now()
	for r := 0; r < rounds; r++ {
		var wg sync.WaitGroup
		for i := 0; i < conc; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				st := -1
				if resp, err := client.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					st = resp.StatusCode
				}
				mu.Lock()
				answers[st]++
				mu.Unlock()
			}()
		}
		wg.Wait()
	}
	secs := time.Since(start).Seconds()
	peak, err := peakRSS(cmd.Process.Pid)
	if err != nil {
		return err
	}
	fmt.Printf("%-9s %-8s %5d %7d %12.1f %12.1f %9.2f %v\n", kind, shape, conc, rounds, idle, peak, secs, answers)
	return nil
}

// peakRSS returns the process's VmHWM in MB.
func peakRSS(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("peak RSS (Linux /proc only): %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024, err
		}
	}
	return 0, errors.New("no VmHWM in /proc status")
}
