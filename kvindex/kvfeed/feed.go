// Package kvfeed keeps kvindex prefix indexes current from the SY_KV
// stream: it consumes every engine's messages.KVEvents (published by the
// engines' agents) and applies them to one kvindex.Index per model. A
// router or any other reader asks Feed.Index(model).Longest.
package kvfeed

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/switchyard-dev/switchyard/internal/logthrottle"
	"github.com/switchyard-dev/switchyard/kvindex"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/streams"
)

// ErrOptions wraps every Options validation error.
var ErrOptions = errors.New("kvfeed: invalid options")

// Options configures a Feed.
type Options struct {
	// JS is the JetStream context the stream is read through. Required.
	JS jetstream.JetStream
	// Names is the NATS layout; the zero value means streams.DefaultNames().
	Names streams.Names
	// Index configures each model's index.
	Index kvindex.Options
	// Logger receives the feed's log.
	Logger zerolog.Logger
}

// Validate names the first field of o that is not usable.
func (o Options) Validate() error {
	if o.JS == nil {
		return fmt.Errorf("%w: Options.JS is nil, want a JetStream context", ErrOptions)
	}
	if o.Names != (streams.Names{}) {
		if err := o.Names.Validate(); err != nil {
			return fmt.Errorf("%w: Options.Names: %v", ErrOptions, err)
		}
	}
	if err := o.Index.Validate(); err != nil {
		return fmt.Errorf("%w: Options.Index: %v", ErrOptions, err)
	}
	return nil
}

// Stats counts what a Feed did.
type Stats struct {
	// Applied counts messages applied; Bad those that failed to decode,
	// validate or match their subject.
	Applied, Bad uint64
	// Gaps counts sequence gaps seen (the engine's blocks were cleared).
	Gaps uint64
}

// seqState is where an engine's messages stand.
type seqState struct {
	epoch int64
	seq   uint64
}

// Feed applies the SY_KV stream to per-model indexes.
type Feed struct {
	opts     Options
	log      zerolog.Logger
	throttle *logthrottle.Throttle

	mu      sync.Mutex
	indexes map[string]*kvindex.Index
	seqs    map[string]seqState // by <model>.<engine>

	applied, bad, gaps atomic.Uint64
}

// New validates opts and returns a Feed that reads nothing until Run.
func New(opts Options) (*Feed, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Names == (streams.Names{}) {
		opts.Names = streams.DefaultNames()
	}
	return &Feed{opts: opts, indexes: map[string]*kvindex.Index{}, seqs: map[string]seqState{},
		throttle: logthrottle.New(10*time.Second, 1024),
		log:      opts.Logger.With().Str("component", "kvfeed").Logger()}, nil
}

// Stats returns the feed's counters.
func (f *Feed) Stats() Stats {
	return Stats{Applied: f.applied.Load(), Bad: f.bad.Load(), Gaps: f.gaps.Load()}
}

// Index returns the index of model, nil before any event of it arrived;
// once there, it is the same index for the feed's life.
func (f *Feed) Index(model string) *kvindex.Index {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.indexes[model]
}

// Run consumes the stream from its start (rebuilding what its window
// holds) until ctx ends, with an ordered consumer that the client
// re-creates after a reconnect.
func (f *Feed) Run(ctx context.Context) error {
	c, err := f.opts.JS.OrderedConsumer(ctx, f.opts.Names.KVStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{f.opts.Names.KVFilter()}, DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return fmt.Errorf("kvfeed: consume %s: %w", f.opts.Names.KVStream, err)
	}
	cc, err := c.Consume(func(m jetstream.Msg) { f.Apply(m.Subject(), m.Data()) })
	if err != nil {
		return fmt.Errorf("kvfeed: consume %s: %w", f.opts.Names.KVStream, err)
	}
	<-ctx.Done()
	cc.Stop()
	return nil
}

// Apply applies one message received on subject; a bad one is counted and
// dropped. It never panics on its input.
func (f *Feed) Apply(subject string, data []byte) {
	var m messages.KVEvents
	if err := messages.DecodeIntoAt(data, &m, time.Now()); err != nil {
		f.reject(subject, err)
		return
	}
	if want := f.opts.Names.Prefix + ".kv." + messages.ModelToken(m.Model) + "." + m.Engine; subject != want {
		f.reject(subject, fmt.Errorf("message of %s.%s on subject %s", m.Model, m.Engine, subject))
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	x := f.indexes[m.Model]
	if x == nil {
		var err error
		if x, err = kvindex.New(f.opts.Index); err != nil {
			f.reject(subject, err)
			return
		}
		f.indexes[m.Model] = x
	}
	key := m.Model + "." + m.Engine
	prev, seen := f.seqs[key]
	switch {
	case m.Cleared:
		x.Clear(m.Engine)
	case seen && m.Epoch == prev.epoch && m.Seq != prev.seq+1:
		// Lost messages: what the engine holds is no longer known.
		f.gaps.Add(1)
		x.Clear(m.Engine)
	}
	f.seqs[key] = seqState{epoch: m.Epoch, seq: m.Seq}
	x.Remove(m.Engine, m.Removed)
	if err := x.Store(m.Engine, m.Stored); err != nil {
		f.reject(subject, err)
		return
	}
	f.applied.Add(1)
}

func (f *Feed) reject(subject string, err error) {
	f.bad.Add(1)
	if f.throttle.Allow(subject, time.Now()) {
		f.log.Warn().Err(err).Str("subject", strings.Clone(subject)).Msg("bad KV events message dropped")
	}
}
