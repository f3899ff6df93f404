package tokenize

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/testenv"
)

// benchChat is a 3 KB chat request's messages: a 1.5 KB system prompt and
// three turns.
func benchChat(tb testing.TB) []byte {
	system := strings.Repeat("You are a careful assistant for a logistics company. Answer in short sentences, cite order numbers like #48213 exactly, and never invent prices. ", 12)
	msgs := []map[string]string{
		{"role": "system", "content": system[:1500]},
		{"role": "user", "content": "Where is order #48213? It was due on 2026-11-28 and the tracking page says \"in transit\" since Monday."},
		{"role": "assistant", "content": "Order #48213 left the Rotterdam hub on 2026-11-27 and is with the regional carrier; the new estimate is 2026-12-03. I have flagged the delay."},
		{"role": "user", "content": strings.Repeat("Can you also check orders #48214 and #48215, and tell me whether they ship together? ", 12)},
	}
	data, err := json.Marshal(msgs)
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

// benchModel writes a model directory whose merges are trained on the
// benchmark's own text until every word is one token, without
// ignore_merges: each word takes all its merges, the most work BPE does
// for a word (a real vocabulary leaves a rare word in a few pieces).
//
// The merge table is padded to Llama-3's size (280,147 merges) with pairs of
// tokens made of control bytes' characters that the text never has, so that
// its lookups cost what a real model's do.
func benchModel(tb testing.TB, text string) string {
	vocab, merges := trainBPE(text, 1<<20)
	const llama3Merges = 280147
	runes := byteRunes()
	fake := func(lead byte, i int) string {
		var sb strings.Builder
		sb.WriteRune(runes[lead])
		for k := 0; k < 7; k++ {
			sb.WriteRune(runes[1+i%8])
			i /= 8
		}
		return sb.String()
	}
	for i := 0; len(merges) < llama3Merges; i++ {
		l, r := fake(1, i), fake(2, i)
		for _, tok := range []string{l, r, l + r} {
			vocab[tok] = uint32(len(vocab))
		}
		merges = append(merges, [2]string{l, r})
	}
	data, err := os.ReadFile(filepath.Join(fixtureDir, TokenizerFile))
	if err != nil {
		tb.Fatal(err)
	}
	var f map[string]any
	if err := json.Unmarshal(data, &f); err != nil {
		tb.Fatal(err)
	}
	m := f["model"].(map[string]any)
	m["vocab"], m["merges"], m["ignore_merges"] = vocab, merges, false
	added := f["added_tokens"].([]any)
	for i, a := range added {
		a.(map[string]any)["id"] = len(vocab) + i
	}
	out, err := json.Marshal(f)
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	for name, content := range map[string][]byte{TokenizerFile: out} {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	cfg, err := os.ReadFile(filepath.Join(fixtureDir, TokenizerConfigFile))
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, TokenizerConfigFile), cfg, 0o644); err != nil {
		tb.Fatal(err)
	}
	return dir
}

// The budgets of a 3 KB chat request on the request path, in CPU time on
// one thread: with the segment cache (the default; the system prompt and
// earlier turns cached, the last message new) and without it (every word
// merged through a Llama-3-sized merge table).
const (
	chatBudgetCached = 200 * time.Microsecond
	chatBudgetCold   = 500 * time.Microsecond
)

func BenchmarkEncodeChat(b *testing.B) {
	msgs := benchChat(b)
	fixture := loadFixture(b)
	rendered, err := fixture.RenderChat(msgs)
	if err != nil {
		b.Fatal(err)
	}
	dir := benchModel(b, rendered)
	merged, err := New(Options{Dir: dir, NoCache: true})
	if err != nil {
		b.Fatal(err)
	}
	cached, err := New(Options{Dir: dir})
	if err != nil {
		b.Fatal(err)
	}
	// Each request's last message is new (it misses the cache); the
	// system prompt and the earlier turns are the previous request's.
	var reqs [64][]byte
	for i := range reqs {
		reqs[i] = []byte(strings.Replace(string(msgs), "ship together?", fmt.Sprintf("ship together (%d)?", i), 1))
	}
	for _, c := range []struct {
		name   string
		tok    *Tokenizer
		budget time.Duration
	}{{"fixture", fixture, chatBudgetCached}, {"merged-nocache", merged, chatBudgetCold}, {"merged-cache", cached, chatBudgetCached}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(msgs)))
			var n, i int
			encode := func() {
				ids, err := c.tok.EncodeChat(reqs[i%len(reqs)])
				if err != nil {
					b.Fatal(err)
				}
				n = len(ids)
				i++
			}
			for b.Loop() {
				encode()
			}
			b.ReportMetric(float64(n), "tokens")
			const rounds = 2000
			cpu := testenv.ThreadCPU(func() {
				for range rounds {
					encode()
				}
			}) / rounds
			b.ReportMetric(float64(cpu.Microseconds()), "cpu-µs/request")
			if cpu > c.budget {
				b.Errorf("%s CPU a %d-byte chat request, over the %s budget", cpu, len(msgs), c.budget)
			}
		})
	}
	b.Run("render", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := fixture.RenderChat(msgs); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encode-merged", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(rendered)))
		for b.Loop() {
			if _, err := merged.AppendEncode(nil, rendered, false); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// loadBudget bounds loading a Llama-3-sized tokenizer.json (a router's
// start, once per model), in CPU time.
const loadBudget = 3 * time.Second

func BenchmarkLoad(b *testing.B) {
	fixture := loadFixture(b)
	rendered, err := fixture.RenderChat(benchChat(b))
	if err != nil {
		b.Fatal(err)
	}
	dir := benchModel(b, rendered)
	info, err := os.Stat(filepath.Join(dir, TokenizerFile))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(info.Size())
	var cpu time.Duration
	for b.Loop() {
		cpu += testenv.ThreadCPU(func() {
			if _, err := New(Options{Dir: dir}); err != nil {
				b.Fatal(err)
			}
		})
	}
	per := cpu / time.Duration(b.N)
	b.ReportMetric(float64(per.Milliseconds()), "cpu-ms/load")
	if per > loadBudget {
		b.Errorf("%s CPU to load a %d-byte tokenizer.json, over the %s budget", per, info.Size(), loadBudget)
	}
}
