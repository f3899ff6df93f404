// Package loadgen sends OpenAI requests to a Switchyard router (or any
// OpenAI-compatible endpoint) on a schedule taken from a workload — Poisson
// arrivals or a replayed trace — with a mix of streaming and non-streaming
// requests, session ids and shared prefixes, and summarises what came back:
// successes, errors, shed requests, TTFT and end-to-end percentiles, and the
// share of each engine (from the x-switchyard-engine response header).
//
// Every run is bounded: by the workload's length, by Options.Duration and by
// Options.MaxInFlight.
package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/switchyard-dev/switchyard/workload"
)

// Options configures a load run.
type Options struct {
	// URL is the router's base URL, such as http://127.0.0.1:8081. Required.
	URL string
	// Model is the model named in every request. Required.
	Model string
	// Requests is the schedule. Required.
	Requests []workload.Request
	// Duration stops the run early; zero means the schedule's length.
	Duration time.Duration
	// StreamFraction is the share of streaming requests, 0..1.
	StreamFraction float64
	// MaxPromptBytes caps the prompt text sent per request; zero means DefaultMaxPromptBytes.
	MaxPromptBytes int
	// MaxOutputTokens caps max_tokens per request; zero means no cap.
	MaxOutputTokens int
	// MaxInFlight bounds concurrent requests; arrivals beyond it count as
	// dropped by the generator. Zero means DefaultMaxInFlight.
	MaxInFlight int
	// Priority, when set, is sent as x-switchyard-priority.
	Priority string
	// Seed makes the choice of streaming requests reproducible.
	Seed uint64
	// Client is the HTTP client; nil means a pooled client with a 2-minute timeout.
	Client *http.Client
	// Progress, when set, receives a progress line every second.
	Progress io.Writer
}

// Summary is what a run measured.
type Summary struct {
	Sent, OK, Errors, Shed, Dropped int
	// Duration is the wall time of the run.
	Duration time.Duration
	// TTFT and E2E hold the percentiles of successful requests.
	TTFTP50, TTFTP99, E2EP50, E2EP99 time.Duration
	// EngineShare is each engine's share of successful requests.
	EngineShare map[string]float64
	// EngineCount is each engine's count of successful requests.
	EngineCount map[string]int
	// ErrorSamples holds up to 5 distinct error texts.
	ErrorSamples []string
}

type result struct {
	ok, shed  bool
	err       string
	engine    string
	ttft, e2e time.Duration
}

// Defaults of zero Options fields.
const (
	// DefaultMaxPromptBytes keeps a replayed trace's long prompts from
	// making the generator, not the router, the bottleneck.
	DefaultMaxPromptBytes = 8192
	// DefaultMaxInFlight bounds the generator's sockets and goroutines; a
	// router holding more requests than this is overloaded anyway.
	DefaultMaxInFlight = 2000
)

// ErrOptions is wrapped by every error of Validate and of Run for invalid options.
var ErrOptions = errors.New("loadgen: invalid options")

// WithDefaults returns a copy of o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	if o.MaxPromptBytes == 0 {
		o.MaxPromptBytes = DefaultMaxPromptBytes
	}
	if o.MaxInFlight == 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	return o
}

// Validate reports the first field of o (after defaults) that is not
// usable, naming it and its value; the error wraps ErrOptions.
func (o Options) Validate() error {
	o = o.WithDefaults()
	if u, err := url.Parse(o.URL); err != nil || o.URL == "" || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: URL %q, want a base URL such as http://127.0.0.1:8081", ErrOptions, o.URL)
	}
	if o.Model == "" {
		return fmt.Errorf("%w: Model is empty", ErrOptions)
	}
	if !(o.StreamFraction >= 0 && o.StreamFraction <= 1) {
		return fmt.Errorf("%w: StreamFraction is %v, want 0..1", ErrOptions, o.StreamFraction)
	}
	for _, f := range []struct {
		field string
		v     int
	}{{"MaxPromptBytes", o.MaxPromptBytes}, {"MaxInFlight", o.MaxInFlight}} {
		if f.v < 1 {
			return fmt.Errorf("%w: %s is %d, want > 0", ErrOptions, f.field, f.v)
		}
	}
	if o.MaxOutputTokens < 0 {
		return fmt.Errorf("%w: MaxOutputTokens is %d, want >= 0 (0: no cap)", ErrOptions, o.MaxOutputTokens)
	}
	if o.Duration < 0 {
		return fmt.Errorf("%w: Duration is %s, want >= 0 (0: the schedule's length)", ErrOptions, o.Duration)
	}
	return nil
}

// Run sends the schedule and returns the summary once every request has ended.
func Run(ctx context.Context, o Options) (*Summary, error) {
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	client := o.Client
	if client == nil {
		client = &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 512, IdleConnTimeout: 30 * time.Second}}
		defer client.CloseIdleConnections()
	}
	endpoint := strings.TrimSuffix(o.URL, "/") + "/v1/chat/completions"
	rng := rand.New(rand.NewPCG(o.Seed, 0x10ad))
	slots := make(chan struct{}, o.MaxInFlight)
	results := make(chan result, 1024)
	var mu sync.Mutex
	var collected []result
	var sent, dropped int
	done := make(chan struct{})
	go func() {
		for r := range results {
			mu.Lock()
			collected = append(collected, r)
			mu.Unlock()
		}
		close(done)
	}()
	stopProgress := progress(o.Progress, func() string {
		mu.Lock()
		defer mu.Unlock()
		ok, errs, shed := 0, 0, 0
		for _, r := range collected {
			switch {
			case r.ok:
				ok++
			case r.shed:
				shed++
			default:
				errs++
			}
		}
		return fmt.Sprintf("sent %d  ok %d  errors %d  shed %d  dropped %d", sent, ok, errs, shed, dropped)
	})

	start := time.Now()
	var wg sync.WaitGroup
	for i, req := range o.Requests {
		if o.Duration > 0 && req.At > o.Duration {
			break
		}
		if wait := time.Until(start.Add(req.At)); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
		}
		if ctx.Err() != nil {
			break
		}
		stream := rng.Float64() < o.StreamFraction
		body := requestBody(o, req, stream)
		select {
		case slots <- struct{}{}:
		default:
			mu.Lock()
			dropped++
			mu.Unlock()
			continue
		}
		mu.Lock()
		sent++
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			results <- send(ctx, client, endpoint, body, stream, req, o.Priority, i)
		}()
	}
	wg.Wait()
	close(results)
	<-done
	stopProgress()
	s := summarise(collected, dropped)
	s.Duration = time.Since(start)
	return s, nil
}

func requestBody(o Options, r workload.Request, stream bool) []byte {
	// The system prompt carries the shared prefix (the leading blocks), so that
	// the router's prefix affinity sees requests that share it.
	var sys strings.Builder
	for _, b := range r.Blocks {
		if sys.Len() >= o.MaxPromptBytes/2 {
			break
		}
		fmt.Fprintf(&sys, "block-%d ", b)
	}
	userBytes := min(max(r.PromptTokens*4-sys.Len(), 16), o.MaxPromptBytes-sys.Len())
	out := r.OutputTokens
	if o.MaxOutputTokens > 0 {
		out = min(out, o.MaxOutputTokens)
	}
	msgs := []map[string]string{}
	if sys.Len() > 0 {
		msgs = append(msgs, map[string]string{"role": "system", "content": sys.String()})
	}
	msgs = append(msgs, map[string]string{"role": "user", "content": strings.Repeat("x", max(userBytes, 1))})
	body := map[string]any{"model": o.Model, "messages": msgs, "max_tokens": max(out, 1), "stream": stream}
	data, _ := json.Marshal(body)
	return data
}

func send(ctx context.Context, client *http.Client, endpoint string, body []byte, stream bool, r workload.Request, priority string, i int) result {
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return result{err: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	if r.Session != 0 {
		req.Header.Set("x-session-id", "s"+strconv.FormatUint(r.Session, 10))
	}
	if priority != "" {
		req.Header.Set("x-switchyard-priority", priority)
	}
	resp, err := client.Do(req)
	if err != nil {
		return result{err: err.Error()}
	}
	defer resp.Body.Close()
	res := result{engine: resp.Header.Get("x-switchyard-engine")}
	if resp.StatusCode == http.StatusTooManyRequests {
		_, _ = io.Copy(io.Discard, resp.Body)
		res.shed = true
		return res
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		res.err = fmt.Sprintf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
		return res
	}
	if stream {
		br := bufio.NewReader(resp.Body)
		first := true
		for {
			line, err := br.ReadBytes('\n')
			if first && bytes.HasPrefix(line, []byte("data:")) {
				res.ttft = time.Since(start)
				first = false
			}
			if err != nil {
				if err != io.EOF {
					res.err = "stream: " + err.Error()
					return res
				}
				break
			}
		}
	} else {
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			res.err = err.Error()
			return res
		}
		res.ttft = time.Since(start)
	}
	res.e2e = time.Since(start)
	res.ok = true
	return res
}

func summarise(rs []result, dropped int) *Summary {
	s := &Summary{Sent: len(rs), Dropped: dropped, EngineShare: map[string]float64{}, EngineCount: map[string]int{}}
	var ttft, e2e []time.Duration
	seen := map[string]bool{}
	for _, r := range rs {
		switch {
		case r.ok:
			s.OK++
			ttft = append(ttft, r.ttft)
			e2e = append(e2e, r.e2e)
			if r.engine != "" {
				s.EngineCount[r.engine]++
			}
		case r.shed:
			s.Shed++
		default:
			s.Errors++
			if !seen[r.err] && len(s.ErrorSamples) < 5 {
				seen[r.err] = true
				s.ErrorSamples = append(s.ErrorSamples, r.err)
			}
		}
	}
	for e, n := range s.EngineCount {
		s.EngineShare[e] = float64(n) / float64(s.OK)
	}
	s.TTFTP50, s.TTFTP99 = percentile(ttft, 0.5), percentile(ttft, 0.99)
	s.E2EP50, s.E2EP99 = percentile(e2e, 0.5), percentile(e2e, 0.99)
	return s
}

func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, int(q*float64(len(d))))]
}

// progress prints line() every second on w until the returned function is called.
func progress(w io.Writer, line func() string) func() {
	if w == nil {
		return func() {}
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				fmt.Fprintf(w, "\r[%5.1fs] %s\n", time.Since(start).Seconds(), line())
				return
			case <-t.C:
				fmt.Fprintf(w, "\r[%5.1fs] %s", time.Since(start).Seconds(), line())
			}
		}
	}()
	return func() { close(stop); <-done }
}

// WriteSummary prints a summary for people.
func WriteSummary(w io.Writer, s *Summary) {
	fmt.Fprintf(w, "requests %d in %s: ok %d, errors %d, shed %d, dropped by the generator %d\n",
		s.Sent, s.Duration.Round(time.Millisecond), s.OK, s.Errors, s.Shed, s.Dropped)
	fmt.Fprintf(w, "TTFT p50 %s p99 %s; end-to-end p50 %s p99 %s\n",
		s.TTFTP50.Round(time.Microsecond*100), s.TTFTP99.Round(time.Microsecond*100), s.E2EP50.Round(time.Microsecond*100), s.E2EP99.Round(time.Microsecond*100))
	engines := make([]string, 0, len(s.EngineShare))
	for e := range s.EngineShare {
		engines = append(engines, e)
	}
	slices.Sort(engines)
	for _, e := range engines {
		fmt.Fprintf(w, "  %-16s %6.1f%%  (%d)\n", e, 100*s.EngineShare[e], s.EngineCount[e])
	}
	for _, e := range s.ErrorSamples {
		fmt.Fprintf(w, "  error: %s\n", e)
	}
}
