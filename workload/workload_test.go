package workload

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestReadAzure(t *testing.T) {
	in := "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
	reqs, err := ReadAzure("a.csv", strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 2 || reqs[0].At != 0 || reqs[1].PromptTokens != 396 || reqs[1].OutputTokens != 109 {
		t.Fatalf("%+v", reqs)
	}
	if d := reqs[1].At - 4314579*time.Microsecond; d < -time.Microsecond || d > time.Microsecond {
		t.Fatalf("second arrival at %s", reqs[1].At)
	}
}

func TestReadMooncake(t *testing.T) {
	in := `{"timestamp": 0, "input_length": 600, "output_length": 6, "hash_ids": [0, 1]}
{"timestamp": 12.5, "input_length": 100, "output_length": 0, "hash_ids": [0]}
`
	reqs, err := ReadMooncake("m.jsonl", strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 2 || reqs[1].At != 12500*time.Microsecond || reqs[1].OutputTokens != 1 || reqs[0].Blocks[1] != 1 {
		t.Fatalf("%+v", reqs)
	}
}

func TestTraceErrorsNameLineAndField(t *testing.T) {
	cases := []struct {
		name, in, want string
		mooncake       bool
	}{
		{"azure header", "A,B,C\n", "header", false},
		{"azure tokens", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,x,1\n", ":2: ContextTokens", false},
		{"azure negative", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,-4,1\n", "ContextTokens", false},
		{"azure time", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n", "TIMESTAMP", false},
		{"azure backwards", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,1\n2023-11-16 18:15:40.00,1,1\n", "before", false},
		{"azure empty", "TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests", false},
		{"mooncake json", "{\n", ":1:", true},
		{"mooncake missing", `{"timestamp": 0, "input_length": 1, "output_length": 1}`, "hash_ids missing", true},
		{"mooncake blocks", `{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1]}`, "want 2", true},
		{"mooncake unknown", `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1], "x": 1}`, "unknown field", true},
		{"mooncake NaN-ish", `{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}`, "timestamp", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var err error
			if c.mooncake {
				_, err = ReadMooncake("t", strings.NewReader(c.in))
			} else {
				_, err = ReadAzure("t", strings.NewReader(c.in))
			}
			if !errors.Is(err, ErrTrace) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want ErrTrace mentioning %q", err, c.want)
			}
		})
	}
}

func TestSharedTracesLoad(t *testing.T) {
	for _, c := range []struct {
		path string
		n    int
	}{{"../../shared/data/azure_llm_conv_2023.csv", 19366}, {"../../shared/data/mooncake_synthetic_trace.jsonl", 3993}} {
		reqs, err := Load(c.path)
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		if len(reqs) != c.n {
			t.Fatalf("%s: %d requests, want %d", c.path, len(reqs), c.n)
		}
		scaled := Scale(reqs, 2)
		if r1, r2 := Rate(reqs), Rate(scaled); math.Abs(r2/r1-2) > 1e-6 {
			t.Fatalf("scaling by 2 changed the rate from %v to %v", r1, r2)
		}
	}
}

func TestPoisson(t *testing.T) {
	reqs := Poisson(PoissonOptions{Rate: 100, Duration: 100 * time.Second, PromptTokens: 600, OutputTokens: 8, Sessions: 10, Seed: 1})
	if r := Rate(reqs); math.Abs(r-100) > 3 {
		t.Fatalf("rate %v, want about 100", r)
	}
	again := Poisson(PoissonOptions{Rate: 100, Duration: 100 * time.Second, PromptTokens: 600, OutputTokens: 8, Sessions: 10, Seed: 1})
	if len(again) != len(reqs) || again[500].At != reqs[500].At || again[500].Session != reqs[500].Session {
		t.Fatal("same seed, different workload")
	}
	if len(reqs[0].Blocks) != 2 || reqs[0].Session == 0 {
		t.Fatalf("%+v", reqs[0])
	}
}
