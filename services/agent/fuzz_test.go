package agent

import (
	"math"
	"testing"
	"time"
)

// FuzzParse feeds arbitrary text to the parse path the agent runs on every
// scrape (Parser.Parse, then Estimator.Update) for every format: it must
// never panic, and every value it derives must be one a signal accepts.
// The seed corpus in testdata/fuzz/FuzzParse holds the fixtures and broken
// shapes (truncated lines, NaN and negative values, huge counts, duplicate
// TYPE lines, counters going backwards).
func FuzzParse(f *testing.F) {
	for _, name := range []string{"vllm.txt", "vllm_old.txt", "sglang.txt", "tgi.txt", "llamacpp.txt"} {
		f.Add(readFixture(f, name))
	}
	parsers := make([]*Parser, 0, len(Formats()))
	for _, format := range Formats() {
		p, err := NewParser(format, "")
		if err != nil {
			f.Fatal(err)
		}
		parsers = append(parsers, p)
	}
	f.Fuzz(func(t *testing.T, text []byte) {
		for _, p := range parsers {
			s, err := p.Parse(text)
			if err != nil {
				continue
			}
			e := NewEstimator(Known{DefaultCapacityRPS: 1})
			t0 := time.Unix(1000, 0)
			e.Update(Sample{}, t0)
			v := e.Update(s, t0.Add(time.Second))
			v = e.Update(Sample{}, t0.Add(2*time.Second)) // a reset after it
			for name, x := range map[string]float64{"ttft": v.TTFTMs, "tbt": v.TBTMs, "kv": v.KVUse,
				"cap": v.CapacityRPS, "rps": v.LoadRPS, "otok": v.OutputTokens, "base": v.BaseLatencyMs} {
				if math.IsNaN(x) || math.IsInf(x, 0) || x < 0 {
					t.Fatalf("%s: %s = %v from %q", p.format, name, x, text)
				}
			}
			if v.KVUse > 1 || v.Running < 0 || v.Queue < 0 || v.MaxRunning < 0 {
				t.Fatalf("%s: out of range %+v", p.format, v)
			}
		}
	})
}
