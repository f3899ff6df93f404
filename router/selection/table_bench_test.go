package selection

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

var benchSizes = []int{10, 100, 1000, 10000}

// BenchmarkPickTwo measures one guarded two-choice pick for a keyless
// request on a table of n engines with random weights and loads.
func BenchmarkPickTwo(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("engines=%d", n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(uint64(n), 1))
			tbl := mustTable(b, engineSet(randomWeights(r, n, 0.95)), TableOptions{})
			g := &fakeLoadGuard{fakeGuard: newFakeGuard(n), load: make([]float64, n)}
			for j := range g.load {
				g.load[j] = r.Float64()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if _, ok := tbl.PickTwo(SpreadKey(uint64(i)), g); !ok {
					b.Fatal("no engine")
				}
			}
		})
	}
}

// BenchmarkPickRecent measures one pick for a request with an affinity key
// through RecentKeys (half the keys seen before) on a table of n engines.
func BenchmarkPickRecent(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("engines=%d", n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(uint64(n), 1))
			tbl := mustTable(b, engineSet(randomWeights(r, n, 0.95)), TableOptions{})
			g := &fakeLoadGuard{fakeGuard: newFakeGuard(n), load: make([]float64, n)}
			for j := range g.load {
				g.load[j] = r.Float64()
			}
			rk := mustRecent(b, DefaultRecentKeys)
			keys := keyHashes(8192)
			for _, k := range keys[:4096] {
				tbl.PickRecent(k, g, rk)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if _, ok := tbl.PickRecent(keys[(i*4099)&8191], g, rk); !ok {
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
