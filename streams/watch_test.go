package streams_test

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/testenv"
)

// watchLog records what a BucketWatch hands its callbacks.
type watchLog struct {
	mu       sync.Mutex
	puts     map[string]string
	currents []map[string]bool
	downs    int
}

func (l *watchLog) watch(env *testenv.NATS, bucket string) *streams.BucketWatch {
	l.puts = map[string]string{}
	return &streams.BucketWatch{
		Conn: env.Conn, JS: env.JS, Bucket: bucket,
		Entry: func(e jetstream.KeyValueEntry) {
			l.mu.Lock()
			defer l.mu.Unlock()
			if e.Operation() == jetstream.KeyValuePut {
				l.puts[e.Key()] = string(e.Value())
			} else {
				delete(l.puts, e.Key())
			}
		},
		Current: func(seen map[string]bool) {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.currents = append(l.currents, maps.Clone(seen))
		},
		Down: func(error) {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.downs++
		},
		ReconnectCheck: 20 * time.Millisecond,
		MinBackoff:     10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
	}
}

func (l *watchLog) current(i int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i >= len(l.currents) {
		return nil
	}
	return slices.Sorted(maps.Keys(l.currents[i]))
}

func (l *watchLog) value(key string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.puts[key]
}

func put(t *testing.T, kv jetstream.KeyValue, key, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := kv.Put(ctx, key, []byte(value)); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

// TestBucketWatch: the watch delivers the current values and then the
// updates, reports the keys it found, and after the server restarts it
// re-creates its watcher by itself and reports the current keys again.
func TestBucketWatch(t *testing.T) {
	env := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := env.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "watch-test", Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	put(t, kv, "a", "1")
	put(t, kv, "b", "1")
	if _, err := kv.Put(ctx, "gone", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, "gone"); err != nil {
		t.Fatal(err)
	}

	var l watchLog
	w := l.watch(env, "watch-test")
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	testenv.WaitFor(t, 5*time.Second, "the first watcher's current values", func() bool { return l.current(0) != nil })
	if got := l.current(0); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("first watcher found keys %v, want [a b] (a deleted key is not current)", got)
	}
	put(t, kv, "c", "2")
	testenv.WaitFor(t, 5*time.Second, "the update of c", func() bool { return l.value("c") == "2" })

	env.StopServer()
	env.StartServer(t)
	testenv.WaitFor(t, 15*time.Second, "a new watcher's current values after the restart", func() bool { return l.current(1) != nil })
	if got := l.current(1); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("watcher after the restart found keys %v, want [a b c]", got)
	}
	l.mu.Lock()
	downs := l.downs
	l.mu.Unlock()
	if downs == 0 {
		t.Fatal("Down was not called when the first watcher ended")
	}
	var kv2 jetstream.KeyValue
	testenv.WaitFor(t, 10*time.Second, "the bucket opens after the restart", func() bool {
		octx, ocancel := context.WithTimeout(ctx, time.Second)
		defer ocancel()
		kv2, err = env.JS.KeyValue(octx, "watch-test")
		return err == nil
	})
	put(t, kv2, "d", "3")
	testenv.WaitFor(t, 5*time.Second, "an update after the restart", func() bool { return l.value("d") == "3" })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v after ctx ended, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after ctx ended")
	}
}

// TestBucketWatchLateBucket: a watch started before its bucket exists finds
// it once it is created.
func TestBucketWatchLateBucket(t *testing.T) {
	env := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var l watchLog
	w := l.watch(env, "late")
	go func() { _ = w.Run(ctx) }()
	testenv.WaitFor(t, 5*time.Second, "a failed attempt on the missing bucket", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.downs > 0
	})
	kv, err := env.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "late", Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	put(t, kv, "x", "1")
	testenv.WaitFor(t, 5*time.Second, "the value in the late bucket", func() bool { return l.value("x") == "1" })
}

func TestBucketWatchNeedsItsParts(t *testing.T) {
	if err := (&streams.BucketWatch{Bucket: "b"}).Run(context.Background()); err == nil {
		t.Fatal("Run of a BucketWatch without Conn, JS and Entry returned nil")
	}
}
