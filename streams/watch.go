package streams

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Defaults of BucketWatch.
const (
	// DefaultReconnectCheck is how often a watch checks whether the
	// connection reconnected since its watcher started.
	DefaultReconnectCheck = 250 * time.Millisecond
	// DefaultWatchMinBackoff is the pause before re-creating a watcher that
	// ended; it doubles on each failure up to DefaultWatchMaxBackoff.
	DefaultWatchMinBackoff = 50 * time.Millisecond
	// DefaultWatchMaxBackoff caps the pause between watcher attempts.
	DefaultWatchMaxBackoff = 2 * time.Second
	// DefaultLayoutCheck is how often a watch checks that its bucket is
	// still the one it opened: a bucket deleted and re-created (by a Keeper)
	// is a new stream whose sequences start again, on which the old
	// watcher would wait for ever. One stream-info request a second.
	DefaultLayoutCheck = time.Second
	// bucketOpenTimeout bounds looking a bucket up on each attempt.
	bucketOpenTimeout = 5 * time.Second
)

// errReconnected ends one watcher after a NATS reconnect, so that it is
// re-created.
var errReconnected = errors.New("NATS reconnected")

// ErrBucketReplaced is what a BucketWatch hands Down when its watcher ended
// because the bucket was deleted or re-created: the next watcher's current
// values are those of a new bucket, not a resumption.
var ErrBucketReplaced = errors.New("bucket deleted or re-created")

// BucketWatch keeps an in-memory view of one KV bucket current through NATS
// trouble: it watches every key of the bucket and hands each entry to Entry.
// When the watcher ends while the context is live — the connection went away,
// the server restarted and lost the watcher's consumer (seen as a reconnect),
// the bucket does not exist yet — it starts a new one after a pause that grows
// with each failure. Every watcher first delivers the bucket's current values;
// after them Current is called with the keys they held, so that the caller can
// drop the keys that were deleted while nobody watched.
//
// The optimizer service and the dashboard keep their views of the state
// buckets with it. (The router watches sy_weights with an ordered consumer of
// its own; see control.SnapshotStore.)
type BucketWatch struct {
	// Conn is the connection; its reconnect count tells when to re-create the
	// watcher. Required.
	Conn *nats.Conn
	// JS is the JetStream context the bucket is looked up in on every attempt
	// (so a bucket provisioned after the watch started is found). Required.
	JS jetstream.JetStream
	// Bucket is the bucket's name. Required.
	Bucket string
	// Entry receives every entry, puts and deletes, in order, from the watch's
	// goroutine. Required.
	Entry func(e jetstream.KeyValueEntry)
	// Current, when set, is called after each watcher has delivered the
	// bucket's current values, with the keys of the values it delivered.
	Current func(seen map[string]bool)
	// Down, when set, is called each time a watcher ends, before the pause.
	Down func(err error)
	// Logger receives a line for each watcher that fails or is re-created.
	Logger zerolog.Logger
	// ReconnectCheck is how often the reconnect count is read; 0 means
	// DefaultReconnectCheck.
	ReconnectCheck time.Duration
	// LayoutCheck is how often the bucket's stream is looked up to tell
	// whether it was deleted or re-created; 0 means DefaultLayoutCheck.
	LayoutCheck time.Duration
	// MinBackoff and MaxBackoff bound the pause between attempts; 0 means
	// DefaultWatchMinBackoff and DefaultWatchMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
}

// Run watches until ctx ends. It returns an error only when the watch is
// misconfigured; NATS trouble is retried, not returned.
func (w *BucketWatch) Run(ctx context.Context) error {
	if w.Conn == nil || w.JS == nil || w.Bucket == "" || w.Entry == nil {
		return fmt.Errorf("streams: BucketWatch of bucket %q needs Conn, JS, Bucket and Entry", w.Bucket)
	}
	check, minB, maxB := w.ReconnectCheck, w.MinBackoff, w.MaxBackoff
	if check <= 0 {
		check = DefaultReconnectCheck
	}
	if minB <= 0 {
		minB = DefaultWatchMinBackoff
	}
	if maxB < minB {
		maxB = max(minB, DefaultWatchMaxBackoff)
	}
	log := w.Logger.With().Str("bucket", w.Bucket).Logger()
	backoff := minB
	for ctx.Err() == nil {
		loaded, err := w.once(ctx, check)
		if ctx.Err() != nil {
			return nil
		}
		if w.Down != nil {
			w.Down(err)
		}
		if loaded {
			backoff = minB
		}
		switch {
		case errors.Is(err, ErrBucketReplaced):
			log.Warn().Err(err).Msg("bucket deleted or re-created; re-creating the bucket watcher")
		case errors.Is(err, errReconnected):
			log.Info().Msg("reconnected to NATS; restarting the bucket watcher")
		default:
			log.Warn().Err(err).Dur("retry_in", backoff).Msg("bucket watcher ended; re-creating it")
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		if !loaded {
			backoff = min(2*backoff, maxB)
		}
	}
	return nil
}

// once runs one watcher until it ends, the connection reconnects or ctx ends;
// loaded says whether it delivered the bucket's current values.
func (w *BucketWatch) once(ctx context.Context, check time.Duration) (loaded bool, err error) {
	reconnects := w.Conn.Stats().Reconnects
	octx, cancel := context.WithTimeout(ctx, bucketOpenTimeout)
	kv, err := w.JS.KeyValue(octx, w.Bucket)
	cancel()
	if err != nil {
		return false, fmt.Errorf("open bucket %s: %w", w.Bucket, err)
	}
	created, err := w.created(ctx)
	if err != nil {
		return false, err
	}
	layoutEvery := w.LayoutCheck
	if layoutEvery <= 0 {
		layoutEvery = DefaultLayoutCheck
	}
	lastLayout := time.Now()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watcher, err := kv.WatchAll(wctx)
	if err != nil {
		return false, fmt.Errorf("watch bucket %s: %w", w.Bucket, err)
	}
	defer func() { _ = watcher.Stop() }()
	tick := time.NewTicker(check)
	defer tick.Stop()
	seen := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			return loaded, nil
		case <-tick.C:
			// After a reconnect the server may have lost the watcher's
			// consumer (a restart): start a new watcher to be sure.
			if w.Conn.Stats().Reconnects != reconnects {
				return loaded, errReconnected
			}
			if time.Since(lastLayout) >= layoutEvery {
				lastLayout = time.Now()
				now, err := w.created(ctx)
				if ctx.Err() != nil {
					return loaded, nil
				}
				if errors.Is(err, jetstream.ErrStreamNotFound) || (err == nil && !now.Equal(created)) {
					return loaded, fmt.Errorf("%w: %s", ErrBucketReplaced, w.Bucket)
				}
			}
		case e, ok := <-watcher.Updates():
			if !ok {
				return loaded, fmt.Errorf("watcher of bucket %s closed", w.Bucket)
			}
			if e == nil { // every current value delivered
				if !loaded {
					loaded = true
					if w.Current != nil {
						w.Current(seen)
					}
					seen = nil
				}
				continue
			}
			if !loaded && e.Operation() == jetstream.KeyValuePut {
				seen[e.Key()] = true
			}
			w.Entry(e)
		}
	}
}

// created returns the creation time of the bucket's stream, which tells a
// re-created bucket from the one a watcher opened.
func (w *BucketWatch) created(ctx context.Context) (time.Time, error) {
	sctx, cancel := context.WithTimeout(ctx, bucketOpenTimeout)
	defer cancel()
	s, err := w.JS.Stream(sctx, BucketStream(w.Bucket))
	if err != nil {
		return time.Time{}, fmt.Errorf("look up bucket %s: %w", w.Bucket, err)
	}
	return s.CachedInfo().Created, nil
}
