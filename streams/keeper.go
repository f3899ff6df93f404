package streams

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
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
	// Skip names layout streams (bucket streams as KV_<bucket>) this Keeper
	// leaves to others: a service that does not know how a stream is
	// configured (the aggregator, the leases bucket's TTL) should not be the
	// one to re-create it.
	Skip []string
	// Interval is the time between periodic checks; zero means
	// DefaultKeeperInterval.
	Interval time.Duration
	// OnRepair, when set, is called from the Keeper's goroutine with the
	// names of layout streams (bucket streams as KV_<bucket>) that were
	// deleted and exist again, re-created by this Keeper or by another one
	// (whose deletion this Keeper saw, by advisory or by finding it
	// missing): services re-create what lived on them (consumers, records).
	OnRepair func(restored []string)
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

	mu   sync.Mutex
	gone map[string]bool // layout streams seen deleted and not seen back yet
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
	return &Keeper{opts: opts, log: opts.Logger.With().Str("subsystem", "layout-keeper").Logger(), kick: make(chan struct{}, 1),
		gone: map[string]bool{}}, nil
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
	created, have, err := repair(cctx, k.opts.JS, k.opts.Names, k.opts.Provision, k.opts.Skip)
	if len(created) > 0 {
		k.repairs.Add(uint64(len(created)))
		k.log.Warn().Strs("streams", created).Msg("streams or buckets were missing; re-provisioned them")
	}
	k.mu.Lock()
	for _, n := range created {
		k.gone[n] = true
	}
	if have != nil {
		for _, n := range LayoutStreams(k.opts.Names) {
			if !have[n] {
				k.gone[n] = true // missing, and not re-created (yet)
			}
		}
	}
	var restored []string
	if err == nil {
		for n := range k.gone {
			if have[n] || slices.Contains(created, n) {
				restored = append(restored, n)
				delete(k.gone, n)
			}
		}
	}
	k.mu.Unlock()
	if len(restored) > 0 && k.opts.OnRepair != nil {
		slices.Sort(restored)
		k.opts.OnRepair(restored)
	}
	return created, err
}

// deleted notes a stream-deleted advisory for a layout stream.
func (k *Keeper) deleted(m *nats.Msg) {
	name := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	if !slices.Contains(LayoutStreams(k.opts.Names), name) {
		return
	}
	k.mu.Lock()
	k.gone[name] = true
	k.mu.Unlock()
	k.Kick()
}

// Run checks the layout every Interval, and at once on a stream-deleted
// advisory or a Kick, until ctx ends; it returns nil then.
func (k *Keeper) Run(ctx context.Context) error {
	if k.opts.Conn != nil {
		sub, err := k.opts.Conn.Subscribe("$JS.EVENT.ADVISORY.STREAM.DELETED.*", k.deleted)
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
