package streams_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestProvisionLimits: every stream and bucket has a byte limit, the streams
// a per-subject limit, and the state buckets per-key TTLs with markers; a
// layout provisioned before the limits existed gets them from Provision.
func TestProvisionLimits(t *testing.T) {
	env := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// An older layout: the same streams without limits.
	for _, name := range streams.LayoutStreams(env.Names) {
		if err := env.JS.DeleteStream(ctx, name); err != nil {
			t.Fatalf("delete %s: %v", name, err)
		}
	}
	for _, cfg := range streams.Streams(env.Names, streams.ProvisionOptions{}) {
		cfg.MaxBytes, cfg.MaxMsgsPerSubject = 0, 0
		if _, err := env.JS.CreateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	for _, cfg := range streams.Buckets(env.Names, streams.ProvisionOptions{}) {
		cfg.MaxBytes, cfg.LimitMarkerTTL = 0, 0
		if _, err := env.JS.CreateKeyValue(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	old, err := env.JS.KeyValue(ctx, env.Names.EnginesBucket)
	if err != nil {
		t.Fatal(err)
	}
	put(t, old, "operator.engine-a", "kept")
	if err := streams.Provision(ctx, env.JS, env.Names, streams.ProvisionOptions{}); err != nil {
		t.Fatalf("provision over the older layout: %v", err)
	}
	want := map[string]struct {
		maxBytes int64
		perSubj  int64
		marker   time.Duration
	}{
		env.Names.SignalStream:                        {streams.DefaultStreamMaxBytes, streams.DefaultSignalMaxPerSubject, 0},
		env.Names.ReportStream:                        {streams.DefaultStreamMaxBytes, streams.ReportMaxPerSubject, 0},
		streams.BucketStream(env.Names.EnginesBucket): {streams.DefaultStateMaxBytes, 1, streams.StateMarkerTTL},
		streams.BucketStream(env.Names.DemandBucket):  {streams.DefaultStateMaxBytes, 1, streams.StateMarkerTTL},
		streams.BucketStream(env.Names.WeightsBucket): {streams.DefaultWeightsMaxBytes, 16, 0},
		streams.BucketStream(env.Names.LeasesBucket):  {streams.LeasesMaxBytes, 1, 0},
	}
	for name, w := range want {
		s, err := env.JS.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		c := s.CachedInfo().Config
		if c.MaxBytes != w.maxBytes || c.MaxMsgsPerSubject != w.perSubj || c.SubjectDeleteMarkerTTL != w.marker || c.AllowMsgTTL != (w.marker > 0) {
			t.Errorf("stream %s: max_bytes %d, max_msgs_per_subject %d, marker TTL %s, allow TTL %v; want %d, %d, %s",
				name, c.MaxBytes, c.MaxMsgsPerSubject, c.SubjectDeleteMarkerTTL, c.AllowMsgTTL, w.maxBytes, w.perSubj, w.marker)
		}
	}
	kv, err := env.JS.KeyValue(ctx, env.Names.EnginesBucket)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(ctx, "operator.engine-a"); err != nil || string(e.Value()) != "kept" {
		t.Fatalf("operator record after the update: %v", err)
	}

	// A value written with a TTL expires, and a watcher sees it go; a value
	// without one stays.
	var l watchLog
	w := l.watch(env, env.Names.EnginesBucket)
	go func() { _ = w.Run(ctx) }()
	msg := nats.NewMsg("$KV." + env.Names.EnginesBucket + ".llama.invented")
	msg.Data = []byte("state")
	if _, err := env.JS.PublishMsg(ctx, msg, jetstream.WithMsgTTL(time.Second)); err != nil {
		t.Fatalf("put with a TTL: %v", err)
	}
	testenv.WaitFor(t, 5*time.Second, "the watcher sees the value", func() bool { return l.value("llama.invented") == "state" })
	testenv.WaitFor(t, 10*time.Second, "the value expires and the watcher sees it go", func() bool { return l.value("llama.invented") == "" })
	if _, err := kv.Get(ctx, "llama.invented"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("expired key: Get = %v, want ErrKeyNotFound", err)
	}
	if l.value("operator.engine-a") != "kept" {
		t.Fatal("the record without a TTL went too")
	}
}

// TestKeeperRepairsDeletedLayout: each stream and bucket deleted while a
// Keeper runs is re-created, OnRepair names it, and a bucket watch opened on
// the deleted bucket follows it to the new one.
func TestKeeperRepairsDeletedLayout(t *testing.T) {
	env := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var mu sync.Mutex
	var repaired []string
	k, err := streams.NewKeeper(streams.KeeperOptions{JS: env.JS, Conn: env.Conn, Names: env.Names,
		Interval: 5 * time.Second, // long: the advisory must do it sooner
		OnRepair: func(c []string) { mu.Lock(); repaired = append(repaired, c...); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = k.Run(ctx) }()
	kv, err := env.JS.KeyValue(ctx, env.Names.DemandBucket)
	if err != nil {
		t.Fatal(err)
	}
	put(t, kv, "before", "deletion")
	var l watchLog
	w := l.watch(env, env.Names.DemandBucket)
	w.LayoutCheck = 100 * time.Millisecond
	go func() { _ = w.Run(ctx) }()
	testenv.WaitFor(t, 5*time.Second, "the watch loads", func() bool { return l.current(0) != nil })

	for i, name := range streams.LayoutStreams(env.Names) {
		if err := env.JS.DeleteStream(ctx, name); err != nil {
			t.Fatalf("delete %s: %v", name, err)
		}
		start := time.Now()
		testenv.WaitFor(t, 4*time.Second, name+" re-created", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return slices.Contains(repaired, name)
		})
		if _, err := env.JS.Stream(ctx, name); err != nil {
			t.Fatalf("after repair: %s: %v", name, err)
		}
		t.Logf("%s back in %s", name, time.Since(start).Round(time.Millisecond))
		if name == streams.BucketStream(env.Names.DemandBucket) {
			kv, err := env.JS.KeyValue(ctx, env.Names.DemandBucket)
			if err != nil {
				t.Fatal(err)
			}
			put(t, kv, "after", "repair")
			testenv.WaitFor(t, 5*time.Second, "a new watcher on the re-created bucket", func() bool {
				l.mu.Lock()
				defer l.mu.Unlock()
				return len(l.currents) > 1
			})
			if slices.Contains(l.current(1), "before") {
				t.Fatalf("the new watcher found %v, a key of the deleted bucket among them", l.current(1))
			}
			testenv.WaitFor(t, 5*time.Second, "the watch follows the re-created bucket", func() bool { return l.value("after") == "repair" })
		}
		if got := k.Repairs(); got != uint64(i+1) {
			t.Fatalf("Repairs = %d after %d deletions", got, i+1)
		}
	}
	// Nothing missing: a check creates nothing.
	if c, err := k.Check(ctx); err != nil || len(c) != 0 {
		t.Fatalf("Check on a whole layout = %v, %v; want nothing", c, err)
	}
}

// TestRepairKeepsReplicasAndSettings: Repair creates only what is missing and
// leaves a surviving stream's settings alone.
func TestRepairKeepsSettings(t *testing.T) {
	env := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := streams.Provision(ctx, env.JS, env.Names, streams.ProvisionOptions{ReportMaxAge: 3 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := env.JS.DeleteStream(ctx, env.Names.SignalStream); err != nil {
		t.Fatal(err)
	}
	created, err := streams.Repair(ctx, env.JS, env.Names, streams.ProvisionOptions{})
	if err != nil || !slices.Equal(created, []string{env.Names.SignalStream}) {
		t.Fatalf("Repair = %v, %v; want [%s]", created, err, env.Names.SignalStream)
	}
	s, err := env.JS.Stream(ctx, env.Names.ReportStream)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.MaxAge; got != 3*time.Hour {
		t.Fatalf("report stream MaxAge %s after Repair, want the provisioned 3h kept", got)
	}
}
