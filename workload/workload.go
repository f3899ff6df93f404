// Package workload reads request traces and generates synthetic workloads: a
// sequence of requests, each with an arrival time, prompt and output lengths in
// tokens, and the prompt's prefix blocks, for the load generator and the
// simulator. It reads the Azure LLM inference trace (CSV) and the Mooncake
// trace (JSONL) as published, strictly, naming the line and field of any error.
package workload

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// BlockTokens is the number of prompt tokens one prefix block stands for (Mooncake's 512).
const BlockTokens = 512

// Request is one request of a workload.
type Request struct {
	// At is the arrival time from the start of the workload.
	At time.Duration
	// PromptTokens and OutputTokens are the request's lengths in tokens.
	PromptTokens, OutputTokens int
	// Blocks names the prompt's 512-token blocks; equal leading blocks are a shared prefix.
	// Empty when the trace has no prefix information.
	Blocks []uint64
	// Session groups requests of one conversation (0: none known).
	Session uint64
}

// ErrTrace is wrapped by every trace parsing error.
var ErrTrace = errors.New("workload: bad trace")

// Load reads a trace file, choosing the format by extension: .csv (Azure) or
// .jsonl (Mooncake).
func Load(path string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTrace, err)
	}
	defer f.Close()
	switch strings.ToLower(filepath.Ext(path)) {
	case ".csv":
		return ReadAzure(path, f)
	case ".jsonl", ".json":
		return ReadMooncake(path, f)
	}
	return nil, fmt.Errorf("%w: %s: unknown trace format %q (want .csv for Azure or .jsonl for Mooncake)", ErrTrace, path, filepath.Ext(path))
}

const azureTime = "2006-01-02 15:04:05.9999999"

// ReadAzure reads the Azure LLM inference trace: a header
// TIMESTAMP,ContextTokens,GeneratedTokens, then one request per row. Arrival
// times are relative to the first row; rows must not go back in time.
func ReadAzure(name string, r io.Reader) ([]Request, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = 3
	cr.ReuseRecord = true
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: header: %v", ErrTrace, name, err)
	}
	if strings.TrimPrefix(head[0], "\ufeff") != "TIMESTAMP" || head[1] != "ContextTokens" || head[2] != "GeneratedTokens" {
		return nil, fmt.Errorf("%w: %s: header %q, want TIMESTAMP,ContextTokens,GeneratedTokens", ErrTrace, name, strings.Join(head, ","))
	}
	var out []Request
	var start, prev time.Time
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrTrace, name, err)
		}
		ts, err := time.Parse(azureTime, rec[0])
		if err != nil {
			return nil, fmt.Errorf("%w: %s:%d: TIMESTAMP %q: %v", ErrTrace, name, line, rec[0], err)
		}
		in, err := tokens(rec[1])
		if err != nil {
			return nil, fmt.Errorf("%w: %s:%d: ContextTokens %q: %v", ErrTrace, name, line, rec[1], err)
		}
		gen, err := tokens(rec[2])
		if err != nil {
			return nil, fmt.Errorf("%w: %s:%d: GeneratedTokens %q: %v", ErrTrace, name, line, rec[2], err)
		}
		if len(out) == 0 {
			start, prev = ts, ts
		}
		if ts.Before(prev) {
			return nil, fmt.Errorf("%w: %s:%d: TIMESTAMP %s is before the previous row's %s", ErrTrace, name, line, rec[0], prev.Format(azureTime))
		}
		prev = ts
		out = append(out, Request{At: ts.Sub(start), PromptTokens: in, OutputTokens: max(1, gen)})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s: no requests", ErrTrace, name)
	}
	return out, nil
}

func tokens(s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return 0, err
	}
	if n < 0 || n > 10_000_000 {
		return 0, fmt.Errorf("%d tokens, want 0..10000000", n)
	}
	return n, nil
}

type mooncakeRow struct {
	Timestamp    *float64  `json:"timestamp"`
	InputLength  *int      `json:"input_length"`
	OutputLength *int      `json:"output_length"`
	HashIDs      *[]uint64 `json:"hash_ids"`
}

// ReadMooncake reads the Mooncake trace: one JSON object per line with
// timestamp (ms from the start), input_length, output_length and hash_ids (one
// id per 512-token block; equal leading ids are a shared prefix).
func ReadMooncake(name string, r io.Reader) ([]Request, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	var out []Request
	var prev float64
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		var row mooncakeRow
		dec := json.NewDecoder(strings.NewReader(text))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&row); err != nil {
			return nil, fmt.Errorf("%w: %s:%d: %v", ErrTrace, name, line, err)
		}
		switch {
		case row.Timestamp == nil:
			return nil, fmt.Errorf("%w: %s:%d: timestamp missing", ErrTrace, name, line)
		case row.InputLength == nil:
			return nil, fmt.Errorf("%w: %s:%d: input_length missing", ErrTrace, name, line)
		case row.OutputLength == nil:
			return nil, fmt.Errorf("%w: %s:%d: output_length missing", ErrTrace, name, line)
		case row.HashIDs == nil:
			return nil, fmt.Errorf("%w: %s:%d: hash_ids missing", ErrTrace, name, line)
		}
		ts := *row.Timestamp
		if math.IsNaN(ts) || ts < 0 || ts > 1e12 {
			return nil, fmt.Errorf("%w: %s:%d: timestamp %v, want 0..1e12 ms", ErrTrace, name, line, ts)
		}
		if ts < prev {
			return nil, fmt.Errorf("%w: %s:%d: timestamp %v is before the previous line's %v", ErrTrace, name, line, ts, prev)
		}
		prev = ts
		in, outLen := *row.InputLength, *row.OutputLength
		if in < 0 || in > 10_000_000 {
			return nil, fmt.Errorf("%w: %s:%d: input_length %d, want 0..10000000", ErrTrace, name, line, in)
		}
		if outLen < 0 || outLen > 10_000_000 {
			return nil, fmt.Errorf("%w: %s:%d: output_length %d, want 0..10000000", ErrTrace, name, line, outLen)
		}
		ids := *row.HashIDs
		if want := (in + BlockTokens - 1) / BlockTokens; len(ids) != want {
			return nil, fmt.Errorf("%w: %s:%d: %d hash_ids for input_length %d, want %d (one per %d-token block)", ErrTrace, name, line, len(ids), in, want, BlockTokens)
		}
		out = append(out, Request{At: time.Duration(ts * float64(time.Millisecond)), PromptTokens: in, OutputTokens: max(1, outLen), Blocks: ids})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrTrace, name, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s: no requests", ErrTrace, name)
	}
	return out, nil
}

// Scale returns the requests with arrival times divided by factor: factor 2
// replays the trace at twice its rate.
func Scale(reqs []Request, factor float64) []Request {
	out := make([]Request, len(reqs))
	for i, r := range reqs {
		r.At = time.Duration(float64(r.At) / factor)
		out[i] = r
	}
	return out
}

// Rate returns the mean arrival rate of the requests, req/s.
func Rate(reqs []Request) float64 {
	if len(reqs) < 2 {
		return 0
	}
	span := reqs[len(reqs)-1].At - reqs[0].At
	if span <= 0 {
		return math.Inf(1)
	}
	return float64(len(reqs)-1) / span.Seconds()
}

// PoissonOptions describes a synthetic workload.
type PoissonOptions struct {
	// Rate is the mean arrival rate, req/s.
	Rate float64
	// Duration bounds the arrivals.
	Duration time.Duration
	// PromptTokens and OutputTokens are each request's lengths.
	PromptTokens, OutputTokens int
	// Sessions is the number of conversations requests are spread over (0: none);
	// requests of one session share its prefix blocks.
	Sessions int
	// Seed makes the workload reproducible.
	Seed uint64
}

// Poisson generates Poisson arrivals at a constant rate.
func Poisson(o PoissonOptions) []Request {
	if o.Rate <= 0 || o.Duration <= 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x5157))
	var out []Request
	var t float64
	end := o.Duration.Seconds()
	for {
		t += rng.ExpFloat64() / o.Rate
		if t >= end {
			return out
		}
		r := Request{At: time.Duration(t * float64(time.Second)), PromptTokens: o.PromptTokens, OutputTokens: max(1, o.OutputTokens)}
		if o.Sessions > 0 {
			s := uint64(rng.IntN(o.Sessions)) + 1
			r.Session = s
			n := (o.PromptTokens + BlockTokens - 1) / BlockTokens
			r.Blocks = make([]uint64, n)
			for b := range r.Blocks {
				r.Blocks[b] = s<<20 | uint64(b)
			}
		}
		out = append(out, r)
	}
}
