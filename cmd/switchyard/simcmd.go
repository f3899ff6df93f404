package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/switchyard-dev/switchyard/sim"
	"github.com/switchyard-dev/switchyard/sim/livecheck"
	"github.com/switchyard-dev/switchyard/sim/scenario"
	"github.com/switchyard-dev/switchyard/sim/simplot"
	"github.com/switchyard-dev/switchyard/sim/suite"
)

func simCommand() command {
	return command{
		name:    "sim",
		summary: "simulate routing policies on a scenario (deterministic, discrete-event) and compare them",
		usage:   "--scenario FILE [--trace FILE] [--policies a,b,...] [--seed N] [--json OUT] [--plots DIR] | --suite DIR|FILE,... [--policies a,b,...] [--seed N] [--json OUT] | --live [--scenario FILE] [--seed N] [--json OUT]",
		setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			scenarioPath := fs.String("scenario", "", "scenario YAML `file` (see examples/sim/)")
			trace := fs.String("trace", "", "replace the scenario's trace with this `file` (same format: Azure CSV or Mooncake JSONL)")
			policies := fs.String("policies", "all", "comma-separated `policies`: "+strings.Join(sim.PolicyNames(), ","))
			seed := fs.Uint64("seed", 0, "random seed (default: the scenario's)")
			jsonOut := fs.String("json", "", "write the results as JSON to this `file` (- for stdout)")
			plots := fs.String("plots", "", "write PNG plots to this `directory`")
			parallel := fs.Int("parallel", runtime.GOMAXPROCS(0), "policies simulated at once")
			quiet := fs.Bool("quiet", false, "no progress bar")
			suitePaths := fs.String("suite", "", "run every scenario of these comma-separated `directories or files` (a directory: its *.yaml) with every policy, "+
				"one run per scenario, and print one table of the suite with the switchyard policy's criteria per scenario")
			live := fs.Bool("live", false, "live check: run the scenario (default: a built-in small case study) through the real services "+
				"in this process and through the simulator, compare, and fail when they disagree beyond the stated tolerances")
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected arguments %q", args)
				}
				if *live {
					var bad []string
					fs.Visit(func(f *flag.Flag) {
						if f.Name == "trace" || f.Name == "policies" || f.Name == "plots" || f.Name == "parallel" {
							bad = append(bad, "--"+f.Name)
						}
					})
					if len(bad) > 0 {
						return usagef("--live takes --scenario, --seed, --json and --quiet, not %s", strings.Join(bad, ", "))
					}
					opts := livecheck.LiveOptions{}
					fs.Visit(func(f *flag.Flag) {
						if f.Name == "seed" {
							opts.Seed, opts.SeedSet = *seed, true
						}
					})
					return runLiveCheck(ctx, e, *scenarioPath, *jsonOut, *quiet, opts)
				}
				if *parallel < 1 || *parallel > 64 {
					return usagef("--parallel %d: want 1..64", *parallel)
				}
				names, err := sim.ParsePolicies(*policies)
				if err != nil {
					return usagef("--policies: %v", err)
				}
				if *suitePaths != "" {
					var bad []string
					fs.Visit(func(f *flag.Flag) {
						if f.Name == "scenario" || f.Name == "trace" || f.Name == "plots" {
							bad = append(bad, "--"+f.Name)
						}
					})
					if len(bad) > 0 {
						return usagef("--suite takes --policies, --seed, --parallel, --json and --quiet, not %s", strings.Join(bad, ", "))
					}
					opts := sim.Options{Policies: names, Parallel: *parallel}
					fs.Visit(func(f *flag.Flag) {
						if f.Name == "seed" {
							opts.Seed, opts.SeedSet = *seed, true
						}
					})
					return runSuite(ctx, e, strings.Split(*suitePaths, ","), opts, *jsonOut, *quiet)
				}
				if *scenarioPath == "" {
					return usagef("--scenario or --suite is required")
				}
				sc, err := scenario.LoadScenario(*scenarioPath)
				if err != nil {
					return usageError{err}
				}
				if *trace != "" {
					abs, err := filepath.Abs(*trace)
					if err != nil {
						return usagef("--trace %s: %v", *trace, err)
					}
					if err := sc.SetTrace(abs); err != nil {
						return usageError{err}
					}
				}
				opts := sim.Options{Policies: names, Parallel: *parallel, Context: ctx}
				fs.Visit(func(f *flag.Flag) {
					if f.Name == "seed" {
						opts.Seed, opts.SeedSet = *seed, true
					}
				})
				var bar *progressBar
				if !*quiet {
					bar = newProgressBar(e.stderr, names)
					opts.Progress = bar.set
				}
				start := time.Now()
				rep, err := sim.Run(sc, opts)
				if bar != nil {
					bar.finish()
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stderr, "simulated %d policies in %s\n", len(names), time.Since(start).Round(time.Millisecond))
				if err := suite.WriteReport(e.stdout, rep); err != nil {
					return err
				}
				if *jsonOut != "" {
					if err := writeJSONReport(*jsonOut, e.stdout, rep); err != nil {
						return err
					}
				}
				if *plots != "" {
					files, err := simplot.Write(*plots, rep)
					if err != nil {
						return err
					}
					fmt.Fprintf(e.stderr, "wrote %s\n", strings.Join(files, ", "))
				}
				return nil
			}
		},
	}
}

// runSuite runs `switchyard sim --suite`: every scenario of paths, one
// after another, with a progress line per scenario, then the suite's table.
func runSuite(ctx context.Context, e *env, paths []string, opts sim.Options, jsonOut string, quiet bool) error {
	files, err := suite.Files(paths)
	if err != nil {
		return usageError{err}
	}
	scs := make([]*scenario.Scenario, len(files))
	for k, f := range files {
		if scs[k], err = scenario.LoadScenario(f); err != nil {
			return usageError{err}
		}
	}
	names := opts.Policies
	var (
		mu  sync.Mutex // Progress runs on the policies' goroutines
		bar *progressBar
	)
	so := suite.Options{Sim: opts}
	start := time.Now()
	if !quiet {
		so.Progress = func(k, n int, sc, policy string, x float64) {
			mu.Lock()
			defer mu.Unlock()
			if label := fmt.Sprintf("%d/%d %s", k+1, n, sc); bar == nil || bar.label != label {
				bar = newProgressBar(e.stderr, names)
				bar.label = label
			}
			bar.set(policy, x)
		}
	}
	so.Done = func(k, n int, o *suite.Outcome) {
		mu.Lock()
		defer mu.Unlock()
		if bar != nil {
			bar.finish()
			bar = nil
		}
		verdict := "FAIL"
		if suite.Passed(o.Verdicts) {
			verdict = "PASS"
		}
		fmt.Fprintf(e.stderr, "%d/%d %s: %s (%s)\n", k+1, n, o.Report.Scenario, verdict, time.Since(start).Round(time.Second))
	}
	outs, err := suite.Run(ctx, scs, so)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "simulated %d scenarios with %d policies in %s\n", len(outs), len(names), time.Since(start).Round(time.Millisecond))
	if err := suite.WriteSuite(e.stdout, outs); err != nil {
		return err
	}
	if jsonOut != "" {
		return writeJSON(jsonOut, e.stdout, func(w io.Writer) error {
			if _, err := io.WriteString(w, "[\n"); err != nil {
				return err
			}
			for k := range outs {
				var rep bytes.Buffer
				if err := outs[k].Report.WriteJSON(&rep); err != nil {
					return err
				}
				vs, err := json.Marshal(outs[k].Verdicts)
				if err != nil {
					return err
				}
				sep := ",\n"
				if k == len(outs)-1 {
					sep = "\n"
				}
				if _, err := fmt.Fprintf(w, "{\"report\": %s, \"verdicts\": %s}%s", bytes.TrimSpace(rep.Bytes()), vs, sep); err != nil {
					return err
				}
			}
			_, err := io.WriteString(w, "]\n")
			return err
		})
	}
	return nil
}

// runLiveCheck runs `switchyard sim --live`.
func runLiveCheck(ctx context.Context, e *env, scenarioPath, jsonOut string, quiet bool, opts livecheck.LiveOptions) error {
	sc := livecheck.LiveScenario()
	if scenarioPath != "" {
		var err error
		if sc, err = scenario.LoadScenario(scenarioPath); err != nil {
			return usageError{err}
		}
	}
	if _, err := livecheck.LiveStackFile(sc); err != nil {
		return usageError{err}
	}
	if !quiet {
		opts.Progress = e.stderr
		fmt.Fprintf(e.stderr, "live check of scenario %s: simulating, then %g s through the real services\n", sc.Name, sc.DurationS)
	}
	cmp, err := livecheck.RunLive(ctx, sc, opts)
	if err != nil {
		return err
	}
	if err := cmp.WriteTable(e.stdout); err != nil {
		return err
	}
	if jsonOut != "" {
		w, closeFn := e.stdout, func() error { return nil }
		if jsonOut != "-" {
			f, err := os.Create(jsonOut)
			if err != nil {
				return fmt.Errorf("--json: %w", err)
			}
			w, closeFn = f, f.Close
		}
		err := cmp.WriteJSON(w)
		if cerr := closeFn(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("--json %s: %w", jsonOut, err)
		}
	}
	if !cmp.OK {
		return fmt.Errorf("live check: the live stack and the simulator disagree beyond tolerance: %s", strings.Join(cmp.Failures(), ", "))
	}
	return nil
}

func writeJSONReport(path string, stdout io.Writer, rep *sim.Report) error {
	return writeJSON(path, stdout, rep.WriteJSON)
}

// writeJSON runs write on the --json file (- for stdout).
func writeJSON(path string, stdout io.Writer, write func(io.Writer) error) error {
	if path == "-" {
		return write(stdout)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--json: %w", err)
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("--json %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--json %s: %w", path, err)
	}
	return nil
}

// progressBar draws the overall progress of the policy runs on one line.
type progressBar struct {
	label string // shown before the bar
	mu    sync.Mutex
	w     io.Writer
	names []string
	done  map[string]float64
	last  time.Time
}

func newProgressBar(w io.Writer, names []string) *progressBar {
	return &progressBar{w: w, names: names, done: map[string]float64{}}
}

func (b *progressBar) set(policy string, x float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done[policy] = x
	if time.Since(b.last) < 200*time.Millisecond && x < 1 {
		return
	}
	b.last = time.Now()
	b.draw()
}

func (b *progressBar) draw() {
	total := 0.0
	var running []string
	for _, n := range b.names {
		x := b.done[n]
		total += x
		if x > 0 && x < 1 {
			running = append(running, n)
		}
	}
	total /= float64(len(b.names))
	const width = 30
	fill := int(total * width)
	fmt.Fprintf(b.w, "\r%s[%s%s] %3.0f%% %-40s", b.prefix(), strings.Repeat("#", fill), strings.Repeat(".", width-fill), 100*total, strings.Join(running, ","))
}

func (b *progressBar) prefix() string {
	if b.label == "" {
		return ""
	}
	return b.label + " "
}

func (b *progressBar) finish() {
	b.mu.Lock()
	defer b.mu.Unlock()
	fmt.Fprintf(b.w, "\r%s\r", strings.Repeat(" ", 80))
}
