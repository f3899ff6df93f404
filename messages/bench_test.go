package messages

import "testing"

// BenchmarkDecodeInto measures DecodeIntoAt, the call services make on every
// signal and report, against the same decode without the structure pre-scan
// (the path before the scan existed), in one run, so that the scan's cost
// reads as a ratio: go test -run XXX -bench DecodeInto -count 10 ./messages/
func BenchmarkDecodeInto(b *testing.B) {
	for _, tc := range []struct {
		name string
		m    Message
	}{{"signal", goodSignal()}, {"report", goodReport()}, {"snapshot", snapshotWithSlots(MinSnapshotSlots)}} {
		data, err := EncodeAt(tc.m, testNow)
		if err != nil {
			b.Fatal(err)
		}
		k := tc.m.MessageKind()
		b.Run(tc.name+"/unscanned", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				m, _ := New(k)
				if err := checkSize(data, k); err != nil {
					b.Fatal(err)
				}
				if err := decodeScanned(data, m, testNow); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tc.name+"/checked", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				m, _ := New(k)
				if err := DecodeIntoAt(data, m, testNow); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tc.name+"/scan", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if err := scanMsgpack(data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
