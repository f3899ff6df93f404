package streams

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/switchyard-dev/switchyard/messages"
)

// ProvisionOptions sets how streams and buckets are created. The zero value
// gives single-replica, file-backed streams with the defaults below.
type ProvisionOptions struct {
	// Replicas is the replica count of every stream and bucket (1 on one
	// server, 3 in a cluster). Zero means 1.
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
	// Memory stores everything in memory instead of files (tests, benchmarks).
	Memory bool
}

func (o ProvisionOptions) withDefaults() ProvisionOptions {
	if o.Replicas == 0 {
		o.Replicas = 1
	}
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
	return o
}

// Streams returns the stream definitions for names and opts.
func Streams(names Names, opts ProvisionOptions) []jetstream.StreamConfig {
	opts = opts.withDefaults()
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
			Name:        names.SignalStream,
			Description: "Switchyard engine signals",
			Subjects:    []string{names.SignalFilter()},
			Retention:   jetstream.LimitsPolicy,
			MaxAge:      opts.SignalMaxAge,
			Duplicates:  dedup,
			MaxMsgSize:  messages.MaxSnapshotSize, // larger than a valid message, so that oversize ones reach consumers and are counted
			Storage:     storage,
			Replicas:    opts.Replicas,
			Discard:     jetstream.DiscardOld,
		},
		{
			Name:        names.ReportStream,
			Description: "Switchyard router reports",
			Subjects:    []string{names.ReportFilter()},
			Retention:   jetstream.LimitsPolicy,
			MaxAge:      opts.ReportMaxAge,
			Duplicates:  opts.DedupWindow,
			MaxMsgSize:  messages.MaxSnapshotSize, // larger than a valid message, so that oversize ones reach consumers and are counted
			Storage:     storage,
			Replicas:    opts.Replicas,
			Discard:     jetstream.DiscardOld,
		},
	}
}

// Buckets returns the KV bucket definitions for names and opts.
func Buckets(names Names, opts ProvisionOptions) []jetstream.KeyValueConfig {
	opts = opts.withDefaults()
	storage := jetstream.FileStorage
	if opts.Memory {
		storage = jetstream.MemoryStorage
	}
	return []jetstream.KeyValueConfig{
		{Bucket: names.EnginesBucket, Description: "Switchyard engine state (aggregator)", History: 1,
			MaxValueSize: messages.MaxMessageSize, Storage: storage, Replicas: opts.Replicas},
		{Bucket: names.DemandBucket, Description: "Switchyard demand and RTT state (aggregator)", History: 1,
			MaxValueSize: messages.MaxMessageSize, Storage: storage, Replicas: opts.Replicas},
		{Bucket: names.WeightsBucket, Description: "Switchyard weight snapshots (optimizer)", History: uint8(min(opts.WeightsHistory, 64)),
			MaxValueSize: messages.MaxSnapshotSize, Storage: storage, Replicas: opts.Replicas},
		{Bucket: names.LeasesBucket, Description: "Switchyard control-plane leases", History: 1,
			TTL: opts.LeaseTTL, Storage: storage, Replicas: opts.Replicas},
	}
}

// Provision creates or updates every stream and bucket. It is idempotent: run
// twice, it succeeds both times, and changed settings are applied.
func Provision(ctx context.Context, js jetstream.JetStream, names Names, opts ProvisionOptions) error {
	if err := names.Validate(); err != nil {
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
