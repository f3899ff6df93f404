package streams

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/switchyard-dev/switchyard/messages"
)

// ProvisionOptions sets how streams and buckets are created. The zero value
// gives single-replica, file-backed streams with the defaults below.
type ProvisionOptions struct {
	// Replicas is the replica count of every stream and bucket (1 on one
	// server, 3 in a cluster). Zero means 1 to Provision and, to Repair, the
	// replica count of the layout's surviving streams; WithDefaults leaves it
	// zero for that reason.
	Replicas int
	// SignalMaxAge is how long engine signals are kept. Zero means 5 minutes.
	SignalMaxAge time.Duration
	// ReportMaxAge is how long router reports are kept. Zero means 1 hour.
	ReportMaxAge time.Duration
	// DedupWindow is the Nats-Msg-Id duplicate window. Zero means 2 minutes.
	DedupWindow time.Duration
	// WeightsHistory is how many snapshots per key the weights bucket keeps. Zero means 16.
	WeightsHistory int
	// LeaseTTL is how long a lease lives without renewal. Zero means 3 seconds.
	LeaseTTL time.Duration
	// SignalMaxBytes and ReportMaxBytes cap the signal and report streams.
	// Zero means DefaultStreamMaxBytes; when full, the oldest messages go.
	SignalMaxBytes int64
	ReportMaxBytes int64
	// StateMaxBytes caps each of the state buckets (engines, demand). Zero
	// means DefaultStateMaxBytes.
	StateMaxBytes int64
	// WeightsMaxBytes caps the weights bucket. Zero means DefaultWeightsMaxBytes.
	WeightsMaxBytes int64
	// SignalMaxPerSubject is how many signals per engine subject SY_SIGNALS
	// keeps. Zero means DefaultSignalMaxPerSubject.
	SignalMaxPerSubject int64
	// NoSignalMaxPerSubject sets no per-subject limit on SY_SIGNALS (the
	// byte limit and MaxAge still bound it); SignalMaxPerSubject is then
	// ignored.
	NoSignalMaxPerSubject bool
	// Memory stores everything in memory instead of files (tests, benchmarks).
	Memory bool
}

// Limits of the layout. Every stream and bucket has a byte limit, so that
// no publisher, careless or hostile, can fill the server's store, and the
// streams a per-subject limit, so that one subject cannot hold a stream.
const (
	// DefaultStreamMaxBytes caps SY_SIGNALS and SY_REPORTS. A signal is
	// stored in about 400 bytes: 256 MiB hold the full 5-minute signal
	// window of about 450 engines signalling five times a second, and a
	// larger fleet only keeps a shorter window (the oldest go first), which
	// costs nothing: the aggregator reads the stream live and routers not at
	// all.
	DefaultStreamMaxBytes = 256 << 20
	// DefaultStateMaxBytes caps sy_engines and sy_demand. A state value is
	// about 1 KiB, so 128 MiB is a hundred thousand keys: far above any
	// fleet, and bounded when invented names flood the aggregator. Values
	// the aggregator writes expire by themselves (see the aggregator's
	// ForgetAfter); the cap is the backstop for what else gets written.
	DefaultStateMaxBytes = 128 << 20
	// DefaultWeightsMaxBytes caps sy_weights: up to 16 snapshots of at most
	// 1 MiB per key, for some 16 (model, cluster) keys of that size, or
	// thousands of ordinary ones.
	DefaultWeightsMaxBytes = 256 << 20
	// KVMaxBytes caps SY_KV. A block event is stored in about 9 bytes, so
	// 256 MiB hold tens of millions of them: the KV stream is read live by
	// routers, and one starting late rebuilds from what the window still
	// holds, so a smaller window only costs it some early misses.
	KVMaxBytes = 256 << 20
	// KVMaxAge is how long KV events are kept: a block older than that is
	// likely evicted or re-announced since, and the stream stays small.
	KVMaxAge = 10 * time.Minute
	// LeasesMaxBytes caps sy_leases, which holds a handful of small keys.
	LeasesMaxBytes = 1 << 20
	// DefaultSignalMaxPerSubject is how many signals per engine subject
	// SY_SIGNALS keeps: 2048 is about 7 minutes at the default 200 ms
	// interval, more than the 5-minute MaxAge holds, so it binds only a
	// subject published faster than engines publish, which then cannot
	// crowd the other engines' signals out of the byte limit.
	DefaultSignalMaxPerSubject = 2048
	// ReportMaxPerSubject is how many reports per router subject SY_REPORTS
	// keeps: 600 is 10 minutes at the default 1 s report interval.
	ReportMaxPerSubject = 600
	// StateMarkerTTL is how long the state buckets keep the marker the
	// server leaves where a key expired or was purged with a TTL: watchers
	// connected at the time see the marker at once, and one re-created later
	// drops the keys it no longer finds, so the markers need not stay long.
	StateMarkerTTL = time.Minute
)

// ErrOptions is wrapped by every error of ProvisionOptions.Validate and
// ConnectOptions.Validate.
var ErrOptions = errors.New("streams: invalid options")

// WithDefaults returns a copy of o with every zero field set to its default.
func (o ProvisionOptions) WithDefaults() ProvisionOptions {
	if o.SignalMaxAge == 0 {
		o.SignalMaxAge = 5 * time.Minute
	}
	if o.ReportMaxAge == 0 {
		o.ReportMaxAge = time.Hour
	}
	if o.DedupWindow == 0 {
		o.DedupWindow = 2 * time.Minute
	}
	if o.WeightsHistory == 0 {
		o.WeightsHistory = 16
	}
	if o.LeaseTTL == 0 {
		o.LeaseTTL = 3 * time.Second
	}
	if o.SignalMaxBytes == 0 {
		o.SignalMaxBytes = DefaultStreamMaxBytes
	}
	if o.ReportMaxBytes == 0 {
		o.ReportMaxBytes = DefaultStreamMaxBytes
	}
	if o.StateMaxBytes == 0 {
		o.StateMaxBytes = DefaultStateMaxBytes
	}
	if o.WeightsMaxBytes == 0 {
		o.WeightsMaxBytes = DefaultWeightsMaxBytes
	}
	if o.SignalMaxPerSubject == 0 {
		o.SignalMaxPerSubject = DefaultSignalMaxPerSubject
	}
	return o
}

// maxReplicas is the largest replica count JetStream accepts.
const maxReplicas = 5

// Validate reports the first field of o (after defaults) that is not
// usable, naming it and its value; the error wraps ErrOptions.
func (o ProvisionOptions) Validate() error {
	o = o.WithDefaults()
	if o.Replicas < 0 || o.Replicas > maxReplicas {
		return fmt.Errorf("%w: Replicas is %d, want 1 to %d (0: see the field)", ErrOptions, o.Replicas, maxReplicas)
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"SignalMaxAge", o.SignalMaxAge}, {"ReportMaxAge", o.ReportMaxAge}, {"DedupWindow", o.DedupWindow}, {"LeaseTTL", o.LeaseTTL}} {
		if d.v <= 0 {
			return fmt.Errorf("%w: %s is %s, want > 0", ErrOptions, d.field, d.v)
		}
	}
	if o.LeaseTTL < time.Second {
		// The server checks TTLs at most every 250 ms, and leaders renew at a third of it.
		return fmt.Errorf("%w: LeaseTTL is %s, want at least 1s", ErrOptions, o.LeaseTTL)
	}
	if o.WeightsHistory < 1 || o.WeightsHistory > 64 {
		return fmt.Errorf("%w: WeightsHistory is %d, want 1 to 64 (a KV bucket's limit)", ErrOptions, o.WeightsHistory)
	}
	for _, n := range []struct {
		field string
		v     int64
	}{{"SignalMaxBytes", o.SignalMaxBytes}, {"ReportMaxBytes", o.ReportMaxBytes}, {"StateMaxBytes", o.StateMaxBytes},
		{"WeightsMaxBytes", o.WeightsMaxBytes}, {"SignalMaxPerSubject", o.SignalMaxPerSubject}} {
		if n.v < 1 {
			return fmt.Errorf("%w: %s is %d, want > 0", ErrOptions, n.field, n.v)
		}
	}
	return nil
}

// signalMaxPerSubject is the stream's MaxMsgsPerSubject: -1 is JetStream's "no limit".
func (o ProvisionOptions) signalMaxPerSubject() int64 {
	if o.NoSignalMaxPerSubject {
		return -1
	}
	return o.SignalMaxPerSubject
}

// Streams returns the stream definitions for names and opts.
func Streams(names Names, opts ProvisionOptions) []jetstream.StreamConfig {
	opts = opts.WithDefaults()
	storage := jetstream.FileStorage
	if opts.Memory {
		storage = jetstream.MemoryStorage
	}
	dedup := opts.DedupWindow
	if dedup > opts.SignalMaxAge {
		dedup = opts.SignalMaxAge
	}
	return []jetstream.StreamConfig{
		{
			Name:              names.SignalStream,
			Description:       "Switchyard engine signals",
			Subjects:          []string{names.SignalFilter()},
			Retention:         jetstream.LimitsPolicy,
			MaxAge:            opts.SignalMaxAge,
			MaxBytes:          opts.SignalMaxBytes,
			MaxMsgsPerSubject: opts.signalMaxPerSubject(),
			Duplicates:        dedup,
			MaxMsgSize:        messages.MaxSnapshotSize, // larger than a valid message, so that oversize ones reach consumers and are counted
			Storage:           storage,
			Replicas:          max(opts.Replicas, 1),
			Discard:           jetstream.DiscardOld,
		},
		{
			Name:              names.ReportStream,
			Description:       "Switchyard router reports",
			Subjects:          []string{names.ReportFilter()},
			Retention:         jetstream.LimitsPolicy,
			MaxAge:            opts.ReportMaxAge,
			MaxBytes:          opts.ReportMaxBytes,
			MaxMsgsPerSubject: ReportMaxPerSubject,
			Duplicates:        opts.DedupWindow,
			MaxMsgSize:        messages.MaxSnapshotSize, // larger than a valid message, so that oversize ones reach consumers and are counted
			Storage:           storage,
			Replicas:          max(opts.Replicas, 1),
			Discard:           jetstream.DiscardOld,
		},
		{
			Name:        names.KVStream,
			Description: "Switchyard engine KV-cache events",
			Subjects:    []string{names.KVFilter()},
			Retention:   jetstream.LimitsPolicy,
			MaxAge:      KVMaxAge,
			MaxBytes:    KVMaxBytes,
			Duplicates:  min(opts.DedupWindow, KVMaxAge),
			MaxMsgSize:  messages.MaxSnapshotSize, // larger than a valid message, so that oversize ones reach consumers and are counted
			Storage:     storage,
			Replicas:    opts.Replicas,
			Discard:     jetstream.DiscardOld,
		},
	}
}

// Buckets returns the KV bucket definitions for names and opts.
func Buckets(names Names, opts ProvisionOptions) []jetstream.KeyValueConfig {
	opts = opts.WithDefaults()
	storage := jetstream.FileStorage
	if opts.Memory {
		storage = jetstream.MemoryStorage
	}
	// The state buckets allow per-key TTLs (LimitMarkerTTL): the aggregator
	// writes its values with one, so that the state of engines, clusters and
	// RTT pairs that went silent expires, while the operator and penalty
	// records sharing sy_engines, written without one, stay. They have no
	// bucket-wide TTL for that reason.
	return []jetstream.KeyValueConfig{
		{Bucket: names.EnginesBucket, Description: "Switchyard engine state (aggregator)", History: 1,
			MaxValueSize: messages.MaxMessageSize, MaxBytes: opts.StateMaxBytes, LimitMarkerTTL: StateMarkerTTL,
			Storage: storage, Replicas: max(opts.Replicas, 1)},
		{Bucket: names.DemandBucket, Description: "Switchyard demand and RTT state (aggregator)", History: 1,
			MaxValueSize: messages.MaxMessageSize, MaxBytes: opts.StateMaxBytes, LimitMarkerTTL: StateMarkerTTL,
			Storage: storage, Replicas: max(opts.Replicas, 1)},
		{Bucket: names.WeightsBucket, Description: "Switchyard weight snapshots (optimizer)", History: uint8(min(opts.WeightsHistory, 64)),
			MaxValueSize: messages.MaxSnapshotSize, MaxBytes: opts.WeightsMaxBytes, Storage: storage, Replicas: max(opts.Replicas, 1)},
		{Bucket: names.LeasesBucket, Description: "Switchyard control-plane leases", History: 1,
			TTL: opts.LeaseTTL, MaxBytes: LeasesMaxBytes, Storage: storage, Replicas: max(opts.Replicas, 1)},
	}
}

// Provision creates or updates every stream and bucket. It is idempotent: run
// twice, it succeeds both times, and changed settings are applied.
func Provision(ctx context.Context, js jetstream.JetStream, names Names, opts ProvisionOptions) error {
	if err := names.Validate(); err != nil {
		return err
	}
	if err := opts.Validate(); err != nil {
		return err
	}
	for _, cfg := range Streams(names, opts) {
		if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("streams: provision stream %s (replicas %d): %w", cfg.Name, cfg.Replicas, err)
		}
	}
	for _, cfg := range Buckets(names, opts) {
		if _, err := js.CreateOrUpdateKeyValue(ctx, cfg); err != nil {
			return fmt.Errorf("streams: provision bucket %s (replicas %d): %w", cfg.Bucket, cfg.Replicas, err)
		}
	}
	return nil
}

// repairSettle is how long Repair waits between finding a stream missing
// and re-creating it (see repair): long enough for the server to finish a
// deletion it has announced, short beside the aggregator's down-after.
const repairSettle = 250 * time.Millisecond

// BucketStream is the name of the stream that holds KV bucket bucket.
func BucketStream(bucket string) string { return "KV_" + bucket }

// LayoutStreams returns the names of every stream of the layout, the
// buckets' streams included, in Provision's order.
func LayoutStreams(names Names) []string {
	out := []string{names.SignalStream, names.ReportStream, names.KVStream}
	for _, b := range []string{names.EnginesBucket, names.DemandBucket, names.WeightsBucket, names.LeasesBucket} {
		out = append(out, BucketStream(b))
	}
	return out
}

// Repair creates the streams and buckets of the layout that are missing,
// with Provision's definitions, and leaves those that exist as they are (so
// that it never undoes settings an operator provisioned). It returns the
// stream names it created, nil when nothing was missing. When
// opts.Replicas is zero, what it creates gets the replica count of the
// layout's surviving streams, so that a deleted stream comes back on a
// cluster as it was. One check costs one stream-names request.
func Repair(ctx context.Context, js jetstream.JetStream, names Names, opts ProvisionOptions) ([]string, error) {
	created, _, err := repair(ctx, js, names, opts, nil)
	return created, err
}

// repair is Repair, leaving the streams in skip alone and also returning
// the stream names that existed.
func repair(ctx context.Context, js jetstream.JetStream, names Names, opts ProvisionOptions, skip []string) (created []string, have map[string]bool, err error) {
	if err := names.Validate(); err != nil {
		return nil, nil, err
	}
	list := func() (map[string]bool, []string, error) {
		have := map[string]bool{}
		lister := js.StreamNames(ctx)
		for n := range lister.Name() {
			have[n] = true
		}
		if err := lister.Err(); err != nil {
			return nil, nil, fmt.Errorf("streams: list streams: %w", err)
		}
		var missing []string
		for _, n := range LayoutStreams(names) {
			if !have[n] && !slices.Contains(skip, n) {
				missing = append(missing, n)
			}
		}
		return have, missing, nil
	}
	have, missing, err := list()
	if err != nil || len(missing) == 0 {
		return nil, have, err
	}
	// Look again after a pause before creating anything: the server
	// announces a deletion, and drops the stream from its listings, before
	// it has moved the stream's files away, and a file stream created in
	// that window loses its files to the deletion (nats-server 2.15 then
	// fails every write with "Critical write error ... no such file").
	t := time.NewTimer(repairSettle)
	select {
	case <-ctx.Done():
		t.Stop()
		return nil, have, ctx.Err()
	case <-t.C:
	}
	if have, missing, err = list(); err != nil || len(missing) == 0 {
		return nil, have, err
	}
	if opts.Replicas == 0 {
		for _, n := range LayoutStreams(names) {
			if !have[n] {
				continue
			}
			if s, err := js.Stream(ctx, n); err == nil {
				opts.Replicas = max(opts.Replicas, s.CachedInfo().Config.Replicas)
			}
		}
	}
	want := map[string]bool{}
	for _, n := range missing {
		want[n] = true
	}
	for _, cfg := range Streams(names, opts) {
		if !want[cfg.Name] {
			continue
		}
		if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
			return created, have, fmt.Errorf("streams: re-provision stream %s (replicas %d): %w", cfg.Name, cfg.Replicas, err)
		}
		created = append(created, cfg.Name)
	}
	for _, cfg := range Buckets(names, opts) {
		if !want[BucketStream(cfg.Bucket)] {
			continue
		}
		if _, err := js.CreateOrUpdateKeyValue(ctx, cfg); err != nil {
			return created, have, fmt.Errorf("streams: re-provision bucket %s (replicas %d): %w", cfg.Bucket, cfg.Replicas, err)
		}
		created = append(created, BucketStream(cfg.Bucket))
	}
	return created, have, nil
}
