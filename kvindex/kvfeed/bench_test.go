package kvfeed

import (
	"strconv"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/testenv"
)

// BenchmarkApply is the consumer's whole ingest path per block event: a
// KVEvents message of 32 stored and 32 removed keys decoded (pre-scan,
// msgpack, validation) and applied to the index, over 20 engines holding
// some 10,000 blocks each. It fails over the 10 µs per block event budget
// (100,000 events/s on one core).
func BenchmarkApply(b *testing.B) {
	n := testenv.StartNATS(b)
	f, err := New(Options{JS: n.JS, Names: n.Names})
	if err != nil {
		b.Fatal(err)
	}
	const engines, perMsg, held = 20, 32, 10_000
	now := time.Now().UnixMilli()
	msgs := make([][]byte, 0, 64)
	subjects := make([]string, 0, 64)
	seq := make([]uint64, engines)
	var next uint64
	build := func(e int) {
		seq[e]++
		m := messages.KVEvents{Model: "llama", Engine: "engine-" + strconv.Itoa(e), Time: now, Epoch: now, Seq: seq[e], BlockSize: 16}
		for i := range perMsg {
			m.Stored = append(m.Stored, uint64(e)<<40|(next+uint64(i)))
			if next >= held*engines {
				m.Removed = append(m.Removed, uint64(e)<<40|(next-held*engines+uint64(i)))
			}
		}
		next += perMsg
		data, err := messages.Encode(&m)
		if err != nil {
			b.Fatal(err)
		}
		msgs, subjects = append(msgs, data), append(subjects, "sy.kv.llama."+m.Engine)
	}
	// Warm the index to its steady state, then time pre-built messages.
	for next < 2*held*engines {
		build(int(next/perMsg) % engines)
		f.Apply(subjects[0], msgs[0])
		msgs, subjects = msgs[:0], subjects[:0]
	}
	for range cap(msgs) {
		build(int(next/perMsg) % engines)
	}
	events := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; events < b.N; i++ {
		if i == len(msgs) {
			// Messages repeat: their sequence no longer follows, so each
			// repeat clears its engine first; rebuild instead.
			b.StopTimer()
			msgs, subjects = msgs[:0], subjects[:0]
			for range cap(msgs) {
				build(int(next/perMsg) % engines)
			}
			i = 0
			b.StartTimer()
		}
		f.Apply(subjects[i], msgs[i])
		events += 2 * perMsg
	}
	per := b.Elapsed() / time.Duration(max(events, 1)) // rebuilds excluded
	b.ReportMetric(float64(per.Nanoseconds()), "ns/event")
	if st := f.Stats(); st.Bad != 0 || st.Gaps != 0 {
		b.Fatalf("feed stats %+v: the benchmark's messages must all apply in order", st)
	}
	if per > 10*time.Microsecond {
		b.Fatalf("%s per block event, over the 10 µs budget", per)
	}
}
