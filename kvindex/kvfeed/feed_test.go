package kvfeed

import (
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestApply feeds messages straight to Apply and checks what the index
// believes after each: order within a message, sequence gaps and epochs,
// clears, and messages that must be dropped.
func TestApply(t *testing.T) {
	n := testenv.StartNATS(t)
	now := time.Now().UnixMilli()
	msg := func(engine string, epoch int64, seq uint64, cleared bool, removed, stored []uint64) messages.KVEvents {
		return messages.KVEvents{Model: "llama", Engine: engine, Time: now, Epoch: epoch, Seq: seq, Cleared: cleared,
			BlockSize: 16, Removed: removed, Stored: stored}
	}
	type step struct {
		name    string
		subject string // empty: the message's own
		data    []byte // nil: the encoded message
		m       messages.KVEvents
		want    map[string]int // engine -> blocks of [1 2 3] held
		bad     uint64
		gaps    uint64
	}
	f, err := New(Options{JS: n.JS, Names: n.Names})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []step{
		{name: "first message of an epoch", m: msg("a", now, 1, true, nil, []uint64{1, 2}), want: map[string]int{"a": 2}},
		{name: "removed applies before stored", m: msg("a", now, 2, false, []uint64{3}, []uint64{3}), want: map[string]int{"a": 3}},
		{name: "another engine", m: msg("b", now, 1, true, nil, []uint64{1}), want: map[string]int{"a": 3, "b": 1}},
		{name: "a skipped sequence clears the engine first", m: msg("a", now, 4, false, nil, []uint64{1}),
			want: map[string]int{"a": 1, "b": 1}, gaps: 1},
		{name: "cleared", m: msg("b", now, 2, true, nil, nil), want: map[string]int{"a": 1}, gaps: 1},
		{name: "a new epoch need not start at 1", m: msg("b", now+1, 5, false, nil, []uint64{1, 2}),
			want: map[string]int{"a": 1, "b": 2}, gaps: 1},
		{name: "a message on another engine's subject is dropped", subject: "sy.kv.llama.b", m: msg("a", now, 5, true, nil, nil),
			want: map[string]int{"a": 1, "b": 2}, bad: 1, gaps: 1},
		{name: "undecodable bytes are dropped", subject: "sy.kv.llama.a", data: []byte{0xc1},
			want: map[string]int{"a": 1, "b": 2}, bad: 2, gaps: 1},
		{name: "a signal on a KV subject is dropped", subject: "sy.kv.llama.a",
			data: mustEncode(t, &messages.EngineSignal{Model: "llama", Engine: "a", Time: now, Seq: 1, Replicas: 1, Health: 1}),
			want: map[string]int{"a": 1, "b": 2}, bad: 3, gaps: 1},
	} {
		subject := s.subject
		if subject == "" {
			subject = "sy.kv." + s.m.Model + "." + s.m.Engine
		}
		data := s.data
		if data == nil {
			data = mustEncode(t, &s.m)
		}
		f.Apply(subject, data)
		got := map[string]int{}
		for _, m := range f.Index("llama").Longest(nil, []uint64{1, 2, 3}) {
			got[m.Engine] = m.Blocks
		}
		if len(got) != len(s.want) {
			t.Fatalf("%s: index holds %v, want %v", s.name, got, s.want)
		}
		for e, b := range s.want {
			if got[e] != b {
				t.Fatalf("%s: index holds %v, want %v", s.name, got, s.want)
			}
		}
		if st := f.Stats(); st.Bad != s.bad || st.Gaps != s.gaps {
			t.Fatalf("%s: stats %+v, want %d bad, %d gaps", s.name, st, s.bad, s.gaps)
		}
	}
}

func mustEncode(t *testing.T, m messages.Message) []byte {
	t.Helper()
	data, err := messages.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// FuzzApply checks that no message on the KV stream crashes the feed, and
// that after a valid one every block it stores is held by its engine.
func FuzzApply(f *testing.F) {
	now := time.Now().UnixMilli()
	for _, m := range []messages.KVEvents{
		{Model: "llama", Engine: "a", Time: now, Epoch: now, Seq: 1, Cleared: true, Stored: []uint64{1, 2}},
		{Model: "llama", Engine: "a", Time: now, Epoch: now, Seq: 3, Removed: []uint64{2}, Stored: []uint64{2, 3}},
	} {
		data, err := messages.Encode(&m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add("sy.kv.llama.a", data)
		f.Add("sy.kv.llama.b", data[:len(data)/2])
	}
	n := testenv.StartNATS(f)
	feed, err := New(Options{JS: n.JS, Names: n.Names})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, subject string, data []byte) {
		feed.Apply(subject, data)
		var m messages.KVEvents
		if messages.DecodeIntoAt(data, &m, time.Now()) != nil || subject != "sy.kv."+m.Model+"."+m.Engine {
			return
		}
		x := feed.Index(m.Model)
		for _, k := range m.Stored {
			held := false
			for _, got := range x.Longest(nil, []uint64{k}) {
				held = held || got.Engine == m.Engine
			}
			if !held {
				t.Fatalf("block %d stored by %s is not in the index", k, m.Engine)
			}
		}
	})
}
