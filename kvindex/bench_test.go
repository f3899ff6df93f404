package kvindex

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/testenv"
)

// ingestBudget is the Done-when row: 100,000 block events/s on one core is
// at most 10 µs per event.
const ingestBudget = 10 * time.Microsecond

// BenchmarkIngest applies block events as the feed does: 20 engines, each
// storing 16-block sequences and removing old ones once it holds 50,000
// blocks (as vLLM evicts), so the index stays at a million blocks.
// One b.N is one block event. It fails when an event costs more than the
// budget.
func BenchmarkIngest(b *testing.B) {
	const engines, perEngine, seq = 20, 50_000, 16
	x, err := New(Options{MaxBlocksPerEngine: perEngine * 2})
	if err != nil {
		b.Fatal(err)
	}
	names := make([]string, engines)
	for i := range names {
		names[i] = "engine-" + strconv.Itoa(i)
	}
	keys := make([]uint64, seq)
	var next uint64
	batch := func(e int, remove bool) {
		for j := range keys {
			if remove {
				keys[j] = uint64(e)<<40 | (next - uint64(perEngine*engines) + uint64(j))
			} else {
				keys[j] = uint64(e)<<40 | (next + uint64(j))
			}
		}
		if remove {
			x.Remove(names[e], keys)
		} else if err := x.Store(names[e], keys); err != nil {
			b.Fatal(err)
		}
	}
	// Warm up to the steady state.
	for next < uint64(perEngine*engines) {
		batch(int(next/seq)%engines, false)
		next += seq
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	events := 0
	for events < b.N {
		e := int(next/seq) % engines
		batch(e, false)
		batch(e, true)
		next += seq
		events += 2 * seq
	}
	per := time.Since(start) / time.Duration(events)
	b.ReportMetric(float64(per.Nanoseconds()), "ns/event")
	b.ReportMetric(1e9/float64(max(per.Nanoseconds(), 1)), "events/s")
	if per > ingestBudget {
		b.Fatalf("%s per block event, over the %s budget (100,000 events/s)", per, ingestBudget)
	}
}

// Longest's budgets, the Done-when row of the prefix index: 2 µs a lookup
// with a million blocks over 1,000 engines, no allocation, 64 heap bytes a
// block.
const (
	longestBudget   = 2 * time.Microsecond
	bytesPerBlockAt = 64
)

// BenchmarkLongest asks for a 64-block request's longest prefix with one
// million blocks indexed over 1,000 engines, three of which hold the prefix
// (64, 40 and 10 blocks deep). It fails over the time, allocation or
// memory budget.
func BenchmarkLongest(b *testing.B) {
	const engines, blocks = 1000, 1_000_000
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	x, _ := New(Options{})
	keys := make([]uint64, 1)
	for i := range blocks {
		keys[0] = uint64(i) | 1<<63
		if err := x.Store("engine-"+strconv.Itoa(i%engines), keys); err != nil {
			b.Fatal(err)
		}
	}
	req := BlockKeys(nil, 0, make([]uint32, 64*16), 16)
	for e, depth := range []int{64, 40, 10} {
		if err := x.Store("engine-"+strconv.Itoa(e), req[:depth]); err != nil {
			b.Fatal(err)
		}
	}
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	perBlock := float64(ms.HeapInuse-before.HeapInuse) / float64(x.Blocks())
	dst := make([]Match, 0, 16)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		dst = x.Longest(dst[:0], req)
	}
	per := b.Elapsed() / time.Duration(b.N)
	b.ReportMetric(perBlock, "heap-bytes/block")
	if len(dst) != 3 || dst[0].Blocks != 64 || dst[1].Blocks != 40 || dst[2].Blocks != 10 {
		b.Fatalf("matches %v, want depths 64, 40, 10", dst)
	}
	if a := testing.AllocsPerRun(100, func() { dst = x.Longest(dst[:0], req) }); a != 0 {
		b.Fatalf("Longest allocates %v times a call, want 0", a)
	}
	if perBlock > bytesPerBlockAt {
		b.Fatalf("%.1f heap bytes a block, over the budget of %d", perBlock, bytesPerBlockAt)
	}
	// The budget is checked on CPU time, 100,000 lookups on one thread.
	const rounds = 100_000
	cpu := testenv.ThreadCPU(func() {
		for range rounds {
			dst = x.Longest(dst[:0], req)
		}
	}) / rounds
	b.ReportMetric(float64(cpu.Nanoseconds()), "cpu-ns/lookup")
	if cpu > longestBudget {
		b.Fatalf("%s CPU a lookup (%s wall), over the %s budget", cpu, per, longestBudget)
	}
	runtime.KeepAlive(x)
}
