package streams

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// DefaultKeeperInterval is how often a Keeper checks the layout when
// KeeperOptions.Interval is zero. One check is one stream-names request, so
// a second costs the server nothing worth counting, and it brings a deleted
// stream back well within the aggregator's down-after (6 s) even when the
// deletion advisory is not seen.
const DefaultKeeperInterval = time.Second

// ErrKeeperOptions is wrapped by NewKeeper for invalid options.
var ErrKeeperOptions = errors.New("streams: invalid keeper options")

// KeeperOptions configures a Keeper.
type KeeperOptions struct {
	// JS is the JetStream context the layout lives in. Required.
	JS jetstream.JetStream
	// Conn, when set, is used to subscribe to JetStream's stream-deleted
	// advisories, so that a deletion is repaired at once rather than at the
	// next periodic check. Without it (or without permission to subscribe)
	// the periodic check alone repairs.
	Conn *nats.Conn
	// Names is the layout; the zero value means DefaultNames().
	Names Names
	// Provision is what a missing stream or bucket is created with (see
	// Repair for the replica count when its Replicas is zero).
	Provision ProvisionOptions
	// Interval is the time between periodic checks; zero means
	// DefaultKeeperInterval.
	Interval time.Duration
	// OnRepair, when set, is called after each repair with the names of the
	// streams it created (bucket streams as KV_<bucket>), from the Keeper's
	// goroutine: services re-create what lived on them (consumers,
	// watchers, records).
	OnRepair func(created []string)
	// Logger receives a line per repair and per failed check (at most one a
	// minute while checks keep failing).
	Logger zerolog.Logger
}

// Keeper keeps the layout provisioned: it re-creates, with Repair, any
// stream or bucket that was deleted while services run. Several keepers
// (one per service) may run at once: creating an identical stream twice is
// not an error.
type Keeper struct {
	opts    KeeperOptions
	log     zerolog.Logger
	repairs atomic.Uint64
	kick    chan struct{}
}

// NewKeeper validates opts and returns a Keeper ready to Run.
func NewKeeper(opts KeeperOptions) (*Keeper, error) {
	if opts.JS == nil {
		return nil, fmt.Errorf("%w: JS is nil", ErrKeeperOptions)
	}
	if opts.Names == (Names{}) {
		opts.Names = DefaultNames()
	}
	if err := opts.Names.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrKeeperOptions, err)
	}
	if opts.Interval < 0 {
		return nil, fmt.Errorf("%w: Interval is %s, want >= 0", ErrKeeperOptions, opts.Interval)
	}
	if opts.Interval == 0 {
		opts.Interval = DefaultKeeperInterval
	}
	return &Keeper{opts: opts, log: opts.Logger.With().Str("subsystem", "layout-keeper").Logger(), kick: make(chan struct{}, 1)}, nil
}

// Repairs returns how many streams and buckets the Keeper has re-created.
func (k *Keeper) Repairs() uint64 { return k.repairs.Load() }

// Kick asks for a check now (a service that sees a stream or consumer
// vanish calls it); it never blocks.
func (k *Keeper) Kick() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// Check re-creates what is missing now and returns what it created.
func (k *Keeper) Check(ctx context.Context) ([]string, error) {
	cctx, cancel := context.WithTimeout(ctx, max(k.opts.Interval, 5*time.Second))
	defer cancel()
	created, err := Repair(cctx, k.opts.JS, k.opts.Names, k.opts.Provision)
	if len(created) > 0 {
		k.repairs.Add(uint64(len(created)))
		k.log.Warn().Strs("streams", created).Msg("streams or buckets were missing; re-provisioned them")
		if k.opts.OnRepair != nil {
			k.opts.OnRepair(created)
		}
	}
	return created, err
}

// Run checks the layout every Interval, and at once on a stream-deleted
// advisory or a Kick, until ctx ends; it returns nil then.
func (k *Keeper) Run(ctx context.Context) error {
	if k.opts.Conn != nil {
		sub, err := k.opts.Conn.Subscribe("$JS.EVENT.ADVISORY.STREAM.DELETED.>", func(*nats.Msg) { k.Kick() })
		if err != nil {
			k.log.Debug().Err(err).Msg("no stream-deleted advisories; checking periodically only")
		} else {
			defer func() { _ = sub.Unsubscribe() }()
		}
	}
	t := time.NewTicker(k.opts.Interval)
	defer t.Stop()
	var lastWarn time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-k.kick:
		}
		if _, err := k.Check(ctx); err != nil && ctx.Err() == nil && time.Since(lastWarn) >= time.Minute {
			lastWarn = time.Now()
			k.log.Warn().Err(err).Msg("layout check failed; retrying (logged at most once a minute)")
		}
	}
}
