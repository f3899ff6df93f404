package router

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/live"
	"github.com/switchyard-dev/switchyard/router/selection"
)

var benchSizes = []int{10, 100, 1000, 10000}

// BenchmarkPick measures one guarded pick (down check, bounded load) on a
// table of n engines with random weights.
func BenchmarkPick(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("engines=%d", n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(uint64(n), 1))
			tbl := mustTable(b, engineSet(randomWeights(r, n, 0.95)), selection.TableOptions{})
			g := live.NewLiveSet(nil).Bind(tbl)
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

// BenchmarkPickSlots is BenchmarkPick on a table built from snapshot slots
// (selection.AssignSlots with SlotCount's slot count, NewTableFromSlots).
func BenchmarkPickSlots(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("engines=%d", n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(uint64(n), 1))
			es := engineSet(randomWeights(r, n, 0.95))
			tbl := slotTable(b, es)
			g := live.NewLiveSet(nil).Bind(tbl)
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

// BenchmarkPickLive measures the live router's picks through a real Bound
// whose engines have reported load signals: PickTwo for a keyless request,
// PickRecent for a keyed one (mostly seen before) and for keys never seen,
// on a table of n engines.
func BenchmarkPickLive(b *testing.B) {
	for _, n := range benchSizes {
		r := rand.New(rand.NewPCG(uint64(n), 1))
		tbl := mustTable(b, engineSet(randomWeights(r, n, 0.95)), selection.TableOptions{})
		set := live.NewLiveSet(nil)
		for i := 0; i < n; i++ {
			set.ObserveSignal(&messages.EngineSignal{Engine: tbl.Engine(i).Name, Queue: r.IntN(8), Running: r.IntN(16), MaxRunning: 16})
		}
		g := set.Bind(tbl)
		keys := keyHashes(8192)
		b.Run(fmt.Sprintf("two/engines=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, ok := tbl.PickTwo(selection.SpreadKey(uint64(i)), g); !ok {
					b.Fatal("no engine")
				}
			}
		})
		b.Run(fmt.Sprintf("recent/engines=%d", n), func(b *testing.B) {
			rk := mustRecent(b, selection.DefaultRecentKeys)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, ok := tbl.PickRecent(keys[(i*4099)&8191], g, rk); !ok {
					b.Fatal("no engine")
				}
			}
		})
		// Keys never seen before: PickRecent places each among
		// NewKeyChoices weighted candidates, its slowest path.
		b.Run(fmt.Sprintf("newkey/engines=%d", n), func(b *testing.B) {
			rk := mustRecent(b, selection.DefaultRecentKeys)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, ok := tbl.PickRecent(selection.Mix64(uint64(i)+0x5eed), g, rk); !ok {
					b.Fatal("no engine")
				}
			}
		})
	}
}
