package router

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

var benchSizes = []int{10, 100, 1000, 10000}

// BenchmarkPick measures one guarded pick (down check, bounded load) on a
// table of n engines with random weights.
func BenchmarkPick(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("engines=%d", n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(uint64(n), 1))
			tbl := mustTable(b, engineSet(randomWeights(r, n, 0.95)), TableOptions{})
			g := NewLiveSet().Bind(tbl)
			keys := keyHashes(4096)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if _, ok := tbl.Pick(keys[i&4095], g); !ok {
					b.Fatal("no engine")
				}
			}
		})
	}
}

// BenchmarkNewTable measures building a table of n engines (DefaultSlots).
func BenchmarkNewTable(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("engines=%d", n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(uint64(n), 2))
			es := engineSet(randomWeights(r, n, 1))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := NewTable(es, TableOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAffinityKey measures key extraction from a parsed chat request
// with a long system prompt.
func BenchmarkAffinityKey(b *testing.B) {
	req := mustParse(b, EndpointChat, `{"model":"m","messages":[{"role":"system","content":"`+
		fmt.Sprintf("%0900d", 0)+`"},{"role":"user","content":"`+fmt.Sprintf("%01500d", 1)+`"}]}`)
	b.ReportAllocs()
	for b.Loop() {
		AffinityKey("", req)
	}
}
