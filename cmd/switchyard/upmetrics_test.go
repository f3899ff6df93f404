package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/testenv"
)

// TestUpServesEveryComponentsMetrics runs `switchyard up`, sends a request
// through each router, and scrapes up's one /metrics: it must hold the
// routers' request histograms labelled by cluster, the aggregator's, the
// optimizer's, the engines', the embedded NATS server's and the Go
// runtime's series. Then Ctrl-C must stop it without a warning.
func TestUpServesEveryComponentsMetrics(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"up", "--nats-port", fmt.Sprint(freePort(t)), "--data-dir", t.TempDir(), "--metrics-addr", metricsAddr,
			"--router-addr", "127.0.0.1:0", "--log-level", "warn"}, strings.NewReader(""), &stdout, &stderr)
	}()
	defer func() {
		cancel()
		select {
		case code := <-done:
			// Logging at warn, a clean Ctrl-C prints nothing after "stopping...".
			if _, after, _ := strings.Cut(stderr.String(), "stopping...\n"); code != 0 || after != "" {
				t.Errorf("up exited %d; logged at warn or above while stopping:\n%s", code, after)
			}
		case <-time.After(15 * time.Second):
			t.Error("up did not stop within 15s")
		}
		if t.Failed() {
			t.Logf("up's stdout:\n%s\nup's stderr:\n%s", stdout.String(), stderr.String())
		}
	}()
	routerLine := regexp.MustCompile(`(?m)^\s+router (\w+)\s+(http://\S+)`)
	var routers [][]string
	testenv.WaitFor(t, 20*time.Second, "up prints its routers", func() bool {
		routers = routerLine.FindAllStringSubmatch(stdout.String(), -1)
		return len(routers) == 3
	})
	for _, r := range routers {
		testenv.WaitFor(t, 20*time.Second, "a chat request through router "+r[1]+" answers 200", func() bool { return testenv.ChatStatus(r[2], "llama") == http.StatusOK })
	}
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d, %v\n%s", resp.StatusCode, err, body)
	}
	cases := []struct {
		what   string
		series string // metric name with the labels it must carry
	}{
		{"a router histogram, cluster A", `switchyard_router_request_duration_seconds_count{cluster="A",model="llama"}`},
		{"a router histogram, cluster C", `switchyard_router_ttft_seconds_count{cluster="C",model="llama"}`},
		{"a router gauge without labels of its own", `switchyard_router_retry_budget_tokens{cluster="B"}`},
		{"the aggregator", `switchyard_aggregator_signals_total`},
		{"the optimizer", `switchyard_optimizer_generations_written_total`},
		{"an engine", `switchyard_enginesim_capacity_rps{engine="engine-a",model="llama"}`},
		{"the embedded NATS server", `switchyard_nats_in_messages_total`},
		{"its JetStream store", `switchyard_nats_jetstream_storage_bytes`},
		{"the Go runtime", `go_goroutines`},
	}
	for _, c := range cases {
		v, ok := sample(string(body), c.series)
		if !ok || v <= 0 {
			t.Errorf("%s: no sample %s above 0 in up's /metrics (found %v, value %v)", c.what, c.series, ok, v)
		}
	}
}

// sample returns the value of the series written exactly as series (name
// and labels in exposition order) in a text exposition.
func sample(text, series string) (float64, bool) {
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
			return v, err == nil
		}
	}
	return 0, false
}
