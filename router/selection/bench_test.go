package selection

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkAssignSlots measures the optimizer's step: a new slot table from
// the previous one after every weight changed a little (SlotCount slots).
func BenchmarkAssignSlots(b *testing.B) {
	for _, n := range []int{10, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("engines=%d", n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(uint64(n), 3))
			es := engineSet(randomWeights(r, n, 1))
			prev := assign(b, slotState{}, es)
			next := 0
			es2 := perturb(r, es, 0, &next)
			names := make([]string, len(es2))
			ws := make([]float64, len(es2))
			for i, e := range es2 {
				names[i], ws[i] = e.Name, e.Weight
			}
			m := SlotCount(n)
			b.ReportAllocs()
			for b.Loop() {
				if AssignSlots(prev.idx, prev.names, names, ws, m) == nil {
					b.Fatal("nil")
				}
			}
		})
	}
}
