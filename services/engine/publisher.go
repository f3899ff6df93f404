package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/streams"
)

// Headers and defaults of the engine-side SDK (the request path's header
// names are messages.HeaderLast, messages.HeaderStatus, NATSHeaderEngine, ...).
const (
	// HeaderMsgID is the JetStream de-duplication header every signal carries ("<engine>-<random>-<seq>").
	HeaderMsgID = jetstream.MsgIDHeader
	// DefaultInterval is the signal interval when Options.Interval is zero.
	DefaultInterval = 200 * time.Millisecond
)

// ErrNoSignal is returned by PublishNow before the first Set when the Publisher has no Source.
var ErrNoSignal = errors.New("engine: no signal values yet (call Set or give Options.Source)")

// Options configures a Publisher.
type Options struct {
	// Conn is the NATS connection to publish on. Required; the caller owns it.
	Conn *nats.Conn
	// Names is the NATS layout; the zero value means streams.DefaultNames().
	Names streams.Names
	// Model (a model id, messages.ValidModelName) and Engine (a name) name
	// the signal subject and identify the engine. Required.
	Model string
	// ServedModel is the name the engine serves Model under when it is not
	// Model (vLLM's --served-model-name), carried in every signal so that
	// routers send it; empty means Model.
	ServedModel string
	Engine      string
	// Region is the engine's region (optional NATS token).
	Region string
	// Interval is the time between signals; zero means DefaultInterval.
	Interval time.Duration
	// Source, when set, is called once per signal for the engine's live values;
	// otherwise the values last given to Set are published.
	Source func() messages.EngineSignal
	// FirstSeq is the sequence number of the first signal; zero means the
	// current Unix time in microseconds, so that a restarted engine's
	// sequence numbers keep rising and its message ids never collide with
	// those of its previous run inside the stream's dedup window.
	FirstSeq uint64
	// PublishTimeout bounds one publish and its acknowledgement; zero means max(Interval, 1s).
	PublishTimeout time.Duration
	// Logger receives publish failures (rate-limited) and recoveries.
	Logger zerolog.Logger
}

// Stats counts what a Publisher has done.
type Stats struct {
	// Published counts signals the stream acknowledged as new.
	Published uint64
	// Duplicates counts signals the stream acknowledged as duplicates.
	Duplicates uint64
	// Failed counts publish attempts that got no acknowledgement.
	Failed uint64
	// Invalid counts signals that failed validation and were not sent.
	Invalid uint64
	// LastSeq is the sequence number of the newest signal sent (FirstSeq-1 before the first).
	LastSeq uint64
}

// Publisher publishes one engine's signal periodically to JetStream.
type Publisher struct {
	opts    Options
	subject string
	js      jetstream.JetStream
	log     zerolog.Logger

	mu     sync.Mutex // guards latest, have, seq and lastWarn
	latest messages.EngineSignal
	have   bool
	seq    uint64
	// msgID starts every signal's Nats-Msg-Id (streams.MsgIDPrefix).
	msgID    string
	pubMu    sync.Mutex // serialises publishes so seq order is publish order
	lastWarn time.Time

	published, duplicates, failed, invalid atomic.Uint64
}

// ErrOptions is wrapped by every error of Validate and of NewPublisher for invalid options.
var ErrOptions = errors.New("engine: invalid options")

// WithDefaults returns a copy of o with every zero field set to its
// default. FirstSeq stays zero: NewPublisher picks it when it starts.
func (o Options) WithDefaults() Options {
	if o.Names == (streams.Names{}) {
		o.Names = streams.DefaultNames()
	}
	if o.Interval == 0 {
		o.Interval = DefaultInterval
	}
	if o.PublishTimeout == 0 {
		o.PublishTimeout = max(o.Interval, time.Second)
	}
	return o
}

// Validate reports the first field of o (after defaults) that is not
// usable, naming it and its value; the error wraps ErrOptions. It checks
// configuration only: NewPublisher also needs Conn.
func (o Options) Validate() error {
	o = o.WithDefaults()
	if err := o.Names.Validate(); err != nil {
		return fmt.Errorf("%w: Names: %v", ErrOptions, err)
	}
	if err := messages.CheckModelName(o.Model); err != nil {
		return fmt.Errorf("%w: Model: %v", ErrOptions, err)
	}
	if o.ServedModel != "" {
		if err := messages.CheckModelName(o.ServedModel); err != nil {
			return fmt.Errorf("%w: ServedModel: %v", ErrOptions, err)
		}
	}
	if err := messages.CheckName("Engine", o.Engine); err != nil {
		return fmt.Errorf("%w: %v", ErrOptions, err)
	}
	if o.Region != "" {
		if err := messages.CheckName("Region", o.Region); err != nil {
			return fmt.Errorf("%w: %v", ErrOptions, err)
		}
	}
	if o.Interval < 0 {
		return fmt.Errorf("%w: Interval is %s, want >= 0", ErrOptions, o.Interval)
	}
	if o.PublishTimeout < 0 {
		return fmt.Errorf("%w: PublishTimeout is %s, want >= 0", ErrOptions, o.PublishTimeout)
	}
	return nil
}

// NewPublisher applies defaults to opts, validates them and returns a
// Publisher; it publishes nothing until Run or PublishNow.
func NewPublisher(opts Options) (*Publisher, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Conn == nil {
		return nil, fmt.Errorf("%w: Conn is nil, want a NATS connection", ErrOptions)
	}
	subject, err := opts.Names.SignalSubject(opts.Model, opts.Engine)
	if err != nil {
		return nil, fmt.Errorf("engine: signal subject for model %q engine %q: %w", opts.Model, opts.Engine, err)
	}
	js, err := jetstream.New(opts.Conn)
	if err != nil {
		return nil, fmt.Errorf("engine: JetStream context: %w", err)
	}
	if opts.FirstSeq == 0 {
		opts.FirstSeq = uint64(time.Now().UnixMicro())
	}
	return &Publisher{
		msgID:   streams.MsgIDPrefix(opts.Engine),
		seq:     opts.FirstSeq - 1,
		opts:    opts,
		subject: subject,
		js:      js,
		log: opts.Logger.With().Str("component", "engine-publisher").
			Str("model", opts.Model).Str("engine", opts.Engine).Logger(),
	}, nil
}

// Subject returns the subject the Publisher publishes on.
func (p *Publisher) Subject() string { return p.subject }

// Set replaces the values published by the next signal when there is no Source.
func (p *Publisher) Set(s messages.EngineSignal) {
	p.mu.Lock()
	p.latest, p.have = s, true
	p.mu.Unlock()
}

// Update changes the latest values in place under the Publisher's lock, for engines that track a few fields.
func (p *Publisher) Update(fn func(s *messages.EngineSignal)) {
	p.mu.Lock()
	fn(&p.latest)
	p.have = true
	p.mu.Unlock()
}

// Stats returns the Publisher's counters.
func (p *Publisher) Stats() Stats {
	p.mu.Lock()
	seq := p.seq
	p.mu.Unlock()
	return Stats{
		Published:  p.published.Load(),
		Duplicates: p.duplicates.Load(),
		Failed:     p.failed.Load(),
		Invalid:    p.invalid.Load(),
		LastSeq:    seq,
	}
}

// Run publishes a signal every interval until ctx ends. While the connection is
// down it skips publishing and owes one signal, which it publishes with the
// newest values as soon as the connection is back. It returns nil when ctx ends.
func (p *Publisher) Run(ctx context.Context) error {
	status := p.opts.Conn.StatusChanged(nats.CONNECTED)
	defer p.opts.Conn.RemoveStatusListener(status)
	ticker := time.NewTicker(p.opts.Interval)
	defer ticker.Stop()
	// retry fires sooner than the next tick after a failed attempt with the
	// connection up (JetStream may still be recovering after a restart).
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()

	owed := true // publish at once on start
	for {
		if owed && p.opts.Conn.IsConnected() {
			err := p.PublishNow(ctx)
			switch {
			case err == nil, errors.Is(err, ErrNoSignal), errors.Is(err, messages.ErrInvalid):
				owed = false
			case ctx.Err() != nil:
				return nil
			default:
				retry.Reset(min(p.opts.Interval, 50*time.Millisecond))
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			owed = true
		case <-status:
			// Reconnected: publish the newest values now rather than at the next tick.
			p.log.Info().Msg("nats connection back, publishing the newest signal")
		case <-retry.C:
		}
	}
}

// PublishNow builds a signal from the newest values, gives it the next sequence
// number and the current time, and publishes it once, waiting for the stream's
// acknowledgement.
func (p *Publisher) PublishNow(ctx context.Context) error {
	p.pubMu.Lock()
	defer p.pubMu.Unlock()
	if p.opts.Source != nil {
		return p.publish(ctx, p.opts.Source())
	}
	p.mu.Lock()
	s, ok := p.latest, p.have
	p.mu.Unlock()
	if !ok {
		return ErrNoSignal
	}
	s.Transports = append([]messages.Transport(nil), s.Transports...)
	return p.publish(ctx, s)
}

func (p *Publisher) publish(ctx context.Context, s messages.EngineSignal) error {
	p.mu.Lock()
	seq := p.seq + 1
	p.mu.Unlock()
	s.Model, s.Engine, s.Region, s.ServedModel = p.opts.Model, p.opts.Engine, p.opts.Region, p.opts.ServedModel
	s.Seq = seq
	s.Time = time.Now().UnixMilli()
	data, err := messages.Encode(&s)
	if err != nil {
		p.invalid.Add(1)
		p.warn(err, "signal failed validation, not sent")
		return fmt.Errorf("engine: encode signal seq %d for %s: %w", seq, p.subject, err)
	}
	// The sequence number is spent once an attempt is made: a timed-out
	// publish may still have been stored, so its id is never reused for
	// different values.
	p.mu.Lock()
	p.seq = seq
	p.mu.Unlock()
	pctx, cancel := context.WithTimeout(ctx, p.opts.PublishTimeout)
	defer cancel()
	ack, err := p.js.Publish(pctx, p.subject, data,
		jetstream.WithMsgID(p.msgID+strconv.FormatUint(seq, 10)),
		jetstream.WithRetryAttempts(0))
	if err != nil {
		p.failed.Add(1)
		if ctx.Err() == nil {
			p.warn(err, "signal publish failed, will send the newest values when NATS is back")
		}
		return fmt.Errorf("engine: publish signal seq %d on %s: %w", seq, p.subject, err)
	}
	if ack.Duplicate {
		p.duplicates.Add(1)
	} else {
		p.published.Add(1)
	}
	return nil
}

// warn logs at most once a second.
func (p *Publisher) warn(err error, msg string) {
	p.mu.Lock()
	now := time.Now()
	if now.Sub(p.lastWarn) < time.Second {
		p.mu.Unlock()
		return
	}
	p.lastWarn = now
	p.mu.Unlock()
	p.log.Warn().Err(err).Str("subject", p.subject).Msg(msg)
}
