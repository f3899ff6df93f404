package main

import (
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// fakeSample is a measured run with latencies around p50 and a peak of
// rps requests per second.
func fakeSample(p50 time.Duration, rps int) sample {
	lat := make([]time.Duration, 100)
	for i := range lat {
		lat[i] = p50 + time.Duration(i-50)*time.Microsecond
	}
	return sample{
		lat:       result{n: len(lat), elapsed: time.Second, lat: lat},
		peak:      result{n: rps, elapsed: time.Second, lat: lat},
		proxyCPU:  time.Duration(rps) * 50 * time.Microsecond,
		engineCPU: time.Duration(rps) * 20 * time.Microsecond,
	}
}

// captureReport runs report with its standard output captured.
func captureReport(t *testing.T, samples map[string][]sample, httpTargets, natsTargets []target) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	out := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		out <- string(b)
	}()
	func() {
		defer func() { os.Stdout = stdout }()
		report(samples, httpTargets, natsTargets)
	}()
	_ = w.Close()
	return <-out
}

// TestReportOfOneGroup: with -groups naming one group, the other group's
// targets have no samples; the per-run report (-v) and the medians report
// only the measured group, and neither panics.
func TestReportOfOneGroup(t *testing.T) {
	httpTargets := []target{{name: "direct"}, {name: "ReverseProxy"}, {name: "nginx"}, {name: "router"}, {name: variantName}}
	natsTargets := []target{{name: "NATS raw"}, {name: "NATS via router", base: "NATS raw"}, {name: "NATS via " + variantName, base: "NATS raw"},
		{name: colocRaw}, {name: colocRouter, base: colocRaw}}
	const runs = 3
	measured := func(targets []target) map[string][]sample {
		samples := make(map[string][]sample)
		for r := range runs {
			for i, tg := range targets {
				samples[tg.name] = append(samples[tg.name], fakeSample(time.Duration(100+10*i+r)*time.Microsecond, 10000-100*i))
			}
		}
		return samples
	}
	for _, c := range []struct {
		group          string
		samples        map[string][]sample
		want, wantNone string
	}{
		{"http", measured(httpTargets), "| path | p50 µs | p99 µs | added p50 µs", "| path | p50 µs | p99 µs | p50 ratio"},
		{"nats", measured(natsTargets), "| path | p50 µs | p99 µs | p50 ratio", "| path | p50 µs | p99 µs | added p50 µs"},
	} {
		for r := range runs {
			one := runOf(c.samples, r)
			if len(one) != len(c.samples) {
				t.Fatalf("-groups %s, run %d: %d targets, want the %d measured", c.group, r+1, len(one), len(c.samples))
			}
			for name, ss := range one {
				if len(ss) != 1 || ss[0].lat.lat[50] != c.samples[name][r].lat.lat[50] {
					t.Fatalf("-groups %s, run %d: %s has %d samples, want that run's one", c.group, r+1, name, len(ss))
				}
			}
			out := captureReport(t, one, httpTargets, natsTargets)
			if !strings.Contains(out, c.want) || strings.Contains(out, c.wantNone) {
				t.Fatalf("-groups %s, run %d: report\n%s\nwant the %s table only", c.group, r+1, out, c.group)
			}
		}
		out := captureReport(t, c.samples, httpTargets, natsTargets)
		if !strings.Contains(out, c.want) || !strings.Contains(out, "goal: ") {
			t.Fatalf("-groups %s, medians: report\n%s\nwant the %s table and its goals", c.group, out, c.group)
		}
	}
	if one := runOf(measured(httpTargets), runs); len(one) != 0 {
		t.Fatalf("a run past the last: %d targets, want none", len(one))
	}
}
