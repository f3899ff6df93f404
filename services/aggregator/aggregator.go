// Package aggregator is Switchyard's signal-path service. It consumes engine
// signals and router reports from JetStream with durable consumers, keeps fast
// and slow EWMA windows of them, marks engines that stop signalling stale and
// then down, and writes the current state to the sy_engines and sy_demand KV
// buckets, batched to at most one write per key per write interval.
//
// The per-engine outcomes of router reports are folded into the engine's
// state (EngineState.Outcomes: error and timeout rates, TTFT as routers see
// it, consecutive failed intervals), for engines that have signalled. The
// sy_engines bucket also holds penalty.<model>.<engine> records (written by
// the optimizer) and operator.<engine> records (written by people); the
// aggregator leaves them alone.
//
// It is restart-safe: on start it reloads its state from the buckets and
// resumes from its durable consumers; a message is acknowledged only after the
// state that includes it has been written, and a redelivered message is
// recognised by its sequence number and timestamp and not folded in twice.
// Stopping, it folds in and writes what it has pulled; started after one
// that died with messages unacknowledged, it has them delivered again.
package aggregator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/switchyard-dev/switchyard/auth/endpoints"
	"github.com/switchyard-dev/switchyard/internal/poison"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/streams"
)

// Options configures an Aggregator. Zero durations take the defaults below.
type Options struct {
	// Conn is the NATS connection. Required.
	Conn *nats.Conn
	// Names is the NATS layout; the zero value means streams.DefaultNames().
	Names streams.Names
	// Durable is the prefix of the durable consumer names. Empty means "sy-aggregator".
	Durable string
	// FastHalfLife and SlowHalfLife are the half-lives of the windows (see
	// messages.Smoother). Defaults messages.DefaultFastHalfLife and DefaultSlowHalfLife.
	FastHalfLife time.Duration
	SlowHalfLife time.Duration
	// StaleAfter and DownAfter bound how long an engine may stay silent before
	// it is marked stale, then down. Defaults 2 s and 6 s.
	StaleAfter time.Duration
	DownAfter  time.Duration
	// WriteInterval is the batching period of KV writes. Default 250 ms.
	WriteInterval time.Duration
	// ForgetAfter is how long the state of an engine that stopped
	// signalling, of a cluster whose routers stopped reporting, or of an RTT
	// pair no longer measured stays in memory and in the buckets: every
	// value the aggregator writes carries it as its per-key TTL, and an
	// entry silent for that long is dropped and its key purged. Default
	// DefaultForgetAfter; it must exceed DownAfter and be at least 1 s.
	ForgetAfter time.Duration
	// Endpoints is the operator's engine endpoint policy (auth/endpoints),
	// the one routers and the optimizer apply: a signal advertising a URL
	// or subject it refuses is not folded in, so that sy_engines, and the
	// dashboard and the tools that read it, hold only the endpoints an
	// engine was allowed last (refusals are counted in
	// switchyard_aggregator_endpoints_refused_total and logged at a bounded
	// rate). Nil stores whatever engines advertise.
	Endpoints *endpoints.Policy
	// Provision is what the aggregator's layout keeper re-creates a deleted
	// stream or bucket with (see streams.Repair).
	Provision streams.ProvisionOptions
	// Logger receives the service's log.
	Logger zerolog.Logger
	// Registerer receives the service's metrics; nil means none are registered.
	Registerer prometheus.Registerer
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// BeforeFold, when set, is called with every message's subject and data
	// as its handler starts, inside the handler's panic recovery. It is a
	// test hook (a handler that panics on a chosen message); leave it nil.
	BeforeFold func(subject string, data []byte)
}

// WithDefaults returns a copy of o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	if o.Names == (streams.Names{}) {
		o.Names = streams.DefaultNames()
	}
	if o.Durable == "" {
		o.Durable = "sy-aggregator"
	}
	if o.FastHalfLife == 0 {
		o.FastHalfLife = messages.DefaultFastHalfLife
	}
	if o.SlowHalfLife == 0 {
		o.SlowHalfLife = messages.DefaultSlowHalfLife
	}
	if o.StaleAfter == 0 {
		o.StaleAfter = 2 * time.Second
	}
	if o.DownAfter == 0 {
		o.DownAfter = 6 * time.Second
	}
	if o.WriteInterval == 0 {
		o.WriteInterval = 250 * time.Millisecond
	}
	if o.ForgetAfter == 0 {
		o.ForgetAfter = DefaultForgetAfter
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	o.Provision = o.Provision.WithDefaults()
	return o
}

// Validate reports the first field of o (after defaults) that is not
// usable, naming it and its value; the error wraps ErrOptions. It checks
// configuration only: New also needs Conn.
func (o Options) Validate() error {
	o = o.WithDefaults()
	if err := o.Names.Validate(); err != nil {
		return fmt.Errorf("%w: Names: %v", ErrOptions, err)
	}
	if !messages.ValidName(o.Durable) {
		return fmt.Errorf("%w: Durable %q is not a valid name", ErrOptions, o.Durable)
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"FastHalfLife", o.FastHalfLife}, {"SlowHalfLife", o.SlowHalfLife}, {"StaleAfter", o.StaleAfter},
		{"DownAfter", o.DownAfter}, {"WriteInterval", o.WriteInterval}} {
		if d.v <= 0 {
			return fmt.Errorf("%w: %s is %s, want > 0", ErrOptions, d.field, d.v)
		}
	}
	if o.StaleAfter >= o.DownAfter {
		return fmt.Errorf("%w: StaleAfter %s must be shorter than DownAfter %s", ErrOptions, o.StaleAfter, o.DownAfter)
	}
	if o.ForgetAfter <= o.DownAfter || o.ForgetAfter < time.Second {
		return fmt.Errorf("%w: ForgetAfter %s must be longer than DownAfter %s and at least 1s", ErrOptions, o.ForgetAfter, o.DownAfter)
	}
	if err := o.Provision.Validate(); err != nil {
		return fmt.Errorf("%w: Provision: %v", ErrOptions, err)
	}
	return nil
}

// DefaultForgetAfter is ForgetAfter's default: ten minutes, so that an
// engine that went down stays listed (as down) long enough for an operator to
// see it, and a flood of invented names is gone within minutes.
const DefaultForgetAfter = 10 * time.Minute

// consumerCheck is how often the aggregator checks that its durable
// consumers exist: one consumer-info request per stream a second, so that a
// deleted stream or consumer is consuming again within about a second of its
// re-creation.
const consumerCheck = time.Second

// writeAckTimeout bounds the wait for a state write's acknowledgement. A
// stream deleted while a write is queued in the server drops the write with
// no answer at all; unbounded, that one lost acknowledgement would stop
// every later write. A healthy stream acknowledges within milliseconds;
// 2 s, a third of the default down-after, makes a lost acknowledgement
// cost one retry on the next write tick, not an engine's silence.
const writeAckTimeout = 2 * time.Second

// ErrOptions is wrapped by every error of Validate and of New for invalid options.
var ErrOptions = errors.New("aggregator: invalid options")

// Aggregator is the running service. Create it with New and run it with Run.
type Aggregator struct {
	opts    Options
	log     zerolog.Logger
	js      jetstream.JetStream
	smooth  messages.Smoother
	metrics *metrics
	guard   *poison.Guard
	keeper  *streams.Keeper
	relaid  chan []string // streams the keeper re-created

	mu sync.Mutex
	// ttl holds, per state bucket, whether it takes per-key TTLs (a bucket
	// provisioned by an older Provision, or on a server before 2.11, does
	// not: its values are written without, and purged when forgotten).
	ttl map[string]bool
	// signalsLost is set while the signal consumer is gone (its stream was
	// deleted): silence is then no evidence that an engine stopped, and
	// statuses are held. signalsSince is when signals last began to flow
	// (the consumer was created); silence counts from then.
	signalsLost  bool
	signalsSince time.Time
	engines      map[string]*engineEntry
	demand       map[string]*demandEntry
	rtt          map[string]*rttEntry
	// pending holds, per stream, the newest folded message not yet acknowledged.
	pending map[string]jetstream.Msg
	// dropped holds, per stream, bad messages to terminate at the next
	// successful write (see dropLocked).
	dropped map[string][]jetstream.Msg
}

// maxDropped bounds the bad messages held per stream until the next write.
// Beyond it only the newest is kept: on an ack-all consumer terminating it
// also settles the older ones, so none is redelivered; they only miss their
// termination advisory.
const maxDropped = 1024

type engineEntry struct {
	state    messages.EngineState
	lastSeen time.Time
	dirty    bool
	outcomes outcomeAcc
	// lastTTFT and lastTBT are the newest signal's latency figures, to
	// tell a signal that repeats them (see foldSignal); valid when
	// haveLast.
	lastTTFT, lastTBT float64
	haveLast          bool
}

type demandEntry struct {
	state messages.DemandState
	dirty bool
}

type rttEntry struct {
	state messages.RTTState
	dirty bool
}

// New applies defaults to opts, validates them and returns an Aggregator
// ready to Run.
func New(opts Options) (*Aggregator, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Conn == nil {
		return nil, fmt.Errorf("%w: Conn is nil, want a NATS connection", ErrOptions)
	}
	js, err := jetstream.New(opts.Conn, jetstream.WithPublishAsyncMaxPending(16384), jetstream.WithPublishAsyncTimeout(writeAckTimeout))
	if err != nil {
		return nil, fmt.Errorf("aggregator: jetstream: %w", err)
	}
	log := opts.Logger.With().Str("component", "aggregator").Logger()
	guard, err := poison.New(poison.Options{Component: "aggregator", Logger: log, Registerer: opts.Registerer})
	if err != nil {
		return nil, fmt.Errorf("aggregator: %w", err)
	}
	a := &Aggregator{
		opts:    opts,
		log:     log,
		js:      js,
		smooth:  messages.Smoother{Fast: opts.FastHalfLife.Seconds(), Slow: opts.SlowHalfLife.Seconds()},
		metrics: newMetrics(opts.Registerer),
		guard:   guard,
		engines: make(map[string]*engineEntry),
		demand:  make(map[string]*demandEntry),
		rtt:     make(map[string]*rttEntry),
		pending: make(map[string]jetstream.Msg),
		dropped: make(map[string][]jetstream.Msg),
		ttl:     make(map[string]bool),
		relaid:  make(chan []string, 8),
	}
	a.keeper, err = streams.NewKeeper(streams.KeeperOptions{JS: js, Conn: opts.Conn, Names: opts.Names, Provision: opts.Provision,
		// The leases bucket's TTL is the optimizer's to set.
		Skip:   []string{streams.BucketStream(opts.Names.LeasesBucket)},
		Logger: a.log, OnRepair: func(created []string) {
			a.metrics.repairs.Add(float64(len(created)))
			select {
			case a.relaid <- created:
			default: // a check of everything is already due
			}
		}})
	if err != nil {
		return nil, fmt.Errorf("aggregator: %w", err)
	}
	return a, nil
}

// Run loads the state from KV, consumes signals and reports, and writes state
// until ctx is done; then it writes and acknowledges what it has folded in and
// returns nil. It returns an error only when it cannot start.
func (a *Aggregator) Run(ctx context.Context) error {
	if err := a.load(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	loaded := len(a.engines)
	a.checkTTL(ctx)
	inputs := []*input{
		{stream: a.opts.Names.SignalStream, filter: a.opts.Names.SignalFilter(), suffix: "signals", handle: a.handleSignal},
		{stream: a.opts.Names.ReportStream, filter: a.opts.Names.ReportFilter(), suffix: "reports", handle: a.handleReport},
	}
	defer func() {
		for _, in := range inputs {
			if in.cc != nil {
				in.cc.Stop()
			}
		}
	}()
	for _, in := range inputs {
		if err := a.startInput(ctx, in); err != nil {
			if ctx.Err() != nil {
				return nil // asked to stop while starting
			}
			return err
		}
	}
	kctx, kcancel := context.WithCancel(ctx)
	kdone := make(chan struct{})
	go func() { defer close(kdone); _ = a.keeper.Run(kctx) }()
	defer func() { kcancel(); <-kdone }()
	a.log.Info().Dur("write_interval", a.opts.WriteInterval).Dur("stale_after", a.opts.StaleAfter).
		Dur("down_after", a.opts.DownAfter).Dur("forget_after", a.opts.ForgetAfter).Int("engines", loaded).Msg("aggregator running")
	t := time.NewTicker(a.opts.WriteInterval)
	defer t.Stop()
	check := time.NewTicker(consumerCheck)
	defer check.Stop()
	for {
		select {
		case created := <-a.relaid:
			a.relayout(ctx, created)
			a.checkInputs(ctx, inputs)
		case <-check.C:
			a.checkInputs(ctx, inputs)
		case <-ctx.Done():
			// Drain, not Stop: messages already pulled are delivered to the
			// handlers and written by the final flush. Stopped, they would be
			// pending on the consumer, and the successor's first
			// acknowledgement (AckAll) would acknowledge them unread: lost.
			var ccs []jetstream.ConsumeContext
			for _, in := range inputs {
				if in.cc != nil {
					ccs = append(ccs, in.cc)
					in.cc = nil
				}
			}
			for _, cc := range ccs {
				cc.Drain()
			}
			drained := time.NewTimer(drainTimeout)
			for _, cc := range ccs {
				select {
				case <-cc.Closed():
				case <-drained.C:
					a.log.Warn().Dur("timeout", drainTimeout).Msg("consumers not drained in time; messages pulled but not folded in may be lost")
				}
			}
			drained.Stop()
			fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := a.flush(fctx)
			cancel()
			if err != nil {
				a.log.Warn().Err(err).Msg("final write failed; unacknowledged messages will be redelivered")
			}
			return nil
		case <-t.C:
			if err := a.flush(ctx); err != nil && ctx.Err() == nil {
				a.log.Warn().Err(err).Msg("state write failed; will retry")
			}
		}
	}
}

// input is one stream the aggregator consumes.
type input struct {
	stream, filter, suffix string
	handle                 func(jetstream.Msg)
	cons                   jetstream.Consumer
	cc                     jetstream.ConsumeContext
	lost                   bool // the consumer is gone and not yet re-created
}

// startInput creates (or finds) the input's durable consumer and consumes it.
func (a *Aggregator) startInput(ctx context.Context, in *input) error {
	cons, err := a.consumer(ctx, in.stream, jetstream.ConsumerConfig{
		Durable:       a.opts.Durable + "-" + in.suffix,
		Description:   "Switchyard aggregator",
		FilterSubject: in.filter,
		AckPolicy:     jetstream.AckAllPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: 1 << 20,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return fmt.Errorf("aggregator: durable consumer on stream %s: %w", in.stream, err)
	}
	cc, err := cons.Consume(in.handle,
		jetstream.PullMaxMessages(4096),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			a.log.Debug().Err(err).Str("stream", in.stream).Msg("consume")
		}))
	if err != nil {
		return fmt.Errorf("aggregator: consume stream %s: %w", in.stream, err)
	}
	in.cons, in.cc = cons, cc
	if in.suffix == "signals" {
		a.mu.Lock()
		a.signalsLost, a.signalsSince = false, a.opts.Now()
		a.mu.Unlock()
	}
	return nil
}

// checkInputs re-creates the durable consumer of an input whose consumer
// or stream is gone (deleted, or re-created empty by a keeper). While the
// signal consumer is gone, engine statuses are held (see flush).
func (a *Aggregator) checkInputs(ctx context.Context, inputs []*input) {
	for _, in := range inputs {
		if !in.lost {
			ictx, cancel := context.WithTimeout(ctx, consumerCheck)
			_, err := in.cons.Info(ictx)
			cancel()
			if err == nil || !(errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)) {
				continue // there, or no answer (NATS trouble is not a deletion)
			}
			a.log.Warn().Err(err).Str("stream", in.stream).Msg("durable consumer gone; re-creating it")
			in.lost = true
			in.cc.Stop()
			if in.suffix == "signals" {
				a.mu.Lock()
				a.signalsLost = true
				a.mu.Unlock()
			}
			a.keeper.Kick()
		}
		if err := a.startInput(ctx, in); err != nil {
			if ctx.Err() == nil {
				a.log.Debug().Err(err).Str("stream", in.stream).Msg("durable consumer not re-created yet")
			}
			continue
		}
		in.lost = false
		a.metrics.recreated.Inc()
		a.log.Info().Str("stream", in.stream).Msg("durable consumer re-created; consuming again")
	}
}

// relayout follows a re-provisioning: a re-created state bucket is empty, so
// everything the aggregator holds for it is written again, and whether it
// takes per-key TTLs is read again.
func (a *Aggregator) relayout(ctx context.Context, created []string) {
	a.checkTTL(ctx)
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range created {
		switch c {
		case streams.BucketStream(a.opts.Names.EnginesBucket):
			for _, e := range a.engines {
				e.dirty = true
			}
		case streams.BucketStream(a.opts.Names.DemandBucket):
			for _, d := range a.demand {
				d.dirty = true
			}
			for _, r := range a.rtt {
				r.dirty = true
			}
		}
	}
}

// checkTTL reads whether each state bucket takes per-key TTLs.
func (a *Aggregator) checkTTL(ctx context.Context) {
	for _, b := range []string{a.opts.Names.EnginesBucket, a.opts.Names.DemandBucket} {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := a.js.Stream(sctx, streams.BucketStream(b))
		cancel()
		if err != nil {
			continue // keep what was known; the next repair reads it again
		}
		ok := st.CachedInfo().Config.AllowMsgTTL
		a.mu.Lock()
		if !ok && a.ttl[b] != ok {
			a.log.Warn().Str("bucket", b).Msg("bucket takes no per-key TTLs (provisioned by an older version, or a server before 2.11): silent state is purged by the aggregator only")
		}
		a.ttl[b] = ok
		a.mu.Unlock()
	}
}

// consumer returns the durable consumer cfg describes on stream, creating
// it when missing. A predecessor that died (or lost its connection) with
// messages delivered but not acknowledged left them pending on the
// consumer, where this aggregator would not see them before AckWait, and
// its first acknowledgement — AckAll — would acknowledge them unread. So
// when messages are pending the consumer is recreated to deliver again from
// the first unacknowledged one: the state loaded from KV holds everything
// acknowledged, and what it already holds is recognised and not folded in
// twice. An aggregator still running on the old consumer (two at once, in
// a rolling restart) loses its subscription and stops consuming.
func (a *Aggregator) consumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	if cons, err := a.js.Consumer(ctx, stream, cfg.Durable); err == nil {
		info, err := cons.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("read consumer %s: %w", cfg.Durable, err)
		}
		if info.NumAckPending == 0 {
			// Keep where it delivers from: a start set by a recreation
			// below cannot be updated.
			cfg.DeliverPolicy, cfg.OptStartSeq = info.Config.DeliverPolicy, info.Config.OptStartSeq
			return a.js.CreateOrUpdateConsumer(ctx, stream, cfg)
		}
		start := info.AckFloor.Stream + 1
		if err := a.js.DeleteConsumer(ctx, stream, cfg.Durable); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, fmt.Errorf("recreate consumer %s: %w", cfg.Durable, err)
		}
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, start
		a.log.Info().Str("stream", stream).Int("pending", info.NumAckPending).Uint64("from_seq", start).
			Msg("delivering again what a stopped aggregator had not acknowledged")
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("read consumer %s: %w", cfg.Durable, err)
	}
	return a.js.CreateOrUpdateConsumer(ctx, stream, cfg)
}

// drainTimeout bounds how long a stopping aggregator waits for the
// messages it has pulled to be folded in.
const drainTimeout = 5 * time.Second

// load reads the current state from the buckets, so that a restarted
// aggregator continues its windows instead of starting over.
func (a *Aggregator) load(ctx context.Context) error {
	now := a.opts.Now()
	for _, bucket := range []string{a.opts.Names.EnginesBucket, a.opts.Names.DemandBucket} {
		kv, err := a.js.KeyValue(ctx, bucket)
		if err != nil {
			return fmt.Errorf("aggregator: open bucket %s (provisioned?): %w", bucket, err)
		}
		w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
		if err != nil {
			return fmt.Errorf("aggregator: read bucket %s: %w", bucket, err)
		}
		for e := range w.Updates() {
			if e == nil {
				break
			}
			a.loadEntry(bucket, e, now)
		}
		if err := w.Stop(); err != nil {
			a.log.Debug().Err(err).Msg("stop watcher")
		}
	}
	a.log.Info().Int("engines", len(a.engines)).Int("demand", len(a.demand)).Int("rtt", len(a.rtt)).Msg("state loaded")
	return nil
}

// loadEntry restores one stored value. A value that fails to decode is
// counted (under the bucket's name as the stream label) and skipped, and a
// panic on one is recovered: a poison value in a bucket must not keep the
// aggregator from starting.
func (a *Aggregator) loadEntry(bucket string, e jetstream.KeyValueEntry, now time.Time) {
	defer a.guard.Recover("load", bucket+"/"+e.Key(), func() {
		a.metrics.bad.WithLabelValues(bucket, poison.ReasonPanic).Inc()
	})
	if a.opts.BeforeFold != nil {
		a.opts.BeforeFold(bucket+"/"+e.Key(), e.Value())
	}
	m, err := messages.DecodeAt(e.Value(), now.Add(time.Hour))
	if err != nil {
		reason := poison.Reason(err)
		a.metrics.bad.WithLabelValues(bucket, reason).Inc()
		a.guard.Log(bucket+"/"+e.Key()).Err(err).Str("bucket", bucket).Str("key", e.Key()).Str("reason", reason).
			Int("bytes", len(e.Value())).Msg("ignoring undecodable state")
		return
	}
	misfiled := func(want string) bool {
		if e.Key() == want {
			return false
		}
		a.metrics.bad.WithLabelValues(bucket, poison.ReasonInvalid).Inc()
		a.guard.Log(bucket+"/"+e.Key()).Str("bucket", bucket).Str("key", e.Key()).Str("want_key", want).
			Str("reason", poison.ReasonInvalid).Msg("ignoring state stored under another key")
		return true
	}
	switch s := m.(type) {
	case *messages.EngineState:
		if misfiled(streams.JoinKey(s.Model, s.Engine)) {
			return
		}
		last := time.UnixMilli(s.LastSignal)
		if last.After(now) || s.Status != messages.StatusDown {
			// Silence counts from when this aggregator could first hear the
			// engine, as a router's does after a reconnect: an engine up when
			// the last run stopped is not made stale or down (and slow-started
			// by the optimizer) before its first signal of this run could
			// arrive.
			last = now
		}
		ent := &engineEntry{state: *s, lastSeen: last}
		if s.Outcomes != nil {
			ent.outcomes.restore(s.Outcomes, a.smooth, now)
		}
		a.engines[e.Key()] = ent
	case *messages.DemandState:
		if misfiled(streams.JoinKey(s.Model, s.Cluster)) {
			return
		}
		a.demand[e.Key()] = &demandEntry{state: *s}
	case *messages.RTTState:
		if misfiled(streams.JoinRTTKey(s.Cluster, s.Engine)) {
			return
		}
		a.rtt[e.Key()] = &rttEntry{state: *s}
	default:
		// Penalty and operator records (written by the optimizer and
		// by people) share sy_engines; they are not the aggregator's.
	}
}

// errSubject marks a message whose names disagree with its subject: with
// the bus's permissions the subject is its sender's identity, so the
// message is a forgery (counted under reason "subject").
var errSubject = fmt.Errorf("%w: names disagree with the subject", messages.ErrInvalid)

// bad counts, logs at a bounded rate, and drops a message that failed to
// decode or validate: it is terminated at the next write (dropLocked).
func (a *Aggregator) bad(msg jetstream.Msg, stream string, err error) {
	reason := poison.Reason(err)
	switch {
	case errors.Is(err, errTooManyRouters):
		reason = "too_many_routers"
	case errors.Is(err, errSubject):
		reason = poison.ReasonSubject
	}
	a.metrics.bad.WithLabelValues(stream, reason).Inc()
	a.guard.Log(msg.Subject()).Err(err).Str("subject", msg.Subject()).Str("reason", reason).Int("bytes", len(msg.Data())).
		Msg("bad message skipped (logged at a bounded rate)")
	a.mu.Lock()
	a.dropLocked(stream, msg)
	a.mu.Unlock()
}

// recovered is the drop function of a handler that panicked on msg.
func (a *Aggregator) recovered(stream string, msg jetstream.Msg) func() {
	return func() {
		a.metrics.bad.WithLabelValues(stream, poison.ReasonPanic).Inc()
		a.mu.Lock()
		a.dropLocked(stream, msg)
		a.mu.Unlock()
	}
}

// dropLocked holds a bad message for termination after the next successful
// write. Not at once: the consumers acknowledge all (AckAll), and the server
// treats a termination as an acknowledgement of every earlier message too,
// which would settle valid messages folded in but not yet written — lost if
// the aggregator stopped before the write. Callers hold a.mu.
func (a *Aggregator) dropLocked(stream string, msg jetstream.Msg) {
	d := a.dropped[stream]
	if len(d) >= maxDropped {
		d[len(d)-1] = msg
		return
	}
	a.dropped[stream] = append(d, msg)
}

func (a *Aggregator) handleSignal(msg jetstream.Msg) {
	defer a.guard.Recover("signals", msg.Subject(), a.recovered("signals", msg))
	if a.opts.BeforeFold != nil {
		a.opts.BeforeFold(msg.Subject(), msg.Data())
	}
	now := a.opts.Now()
	var sig messages.EngineSignal
	if err := messages.DecodeIntoAt(msg.Data(), &sig, now); err != nil {
		a.bad(msg, "signals", err)
		return
	}
	toks, ok := a.opts.Names.ParseSubject(msg.Subject(), "signal", 2)
	if !ok || toks[0] != sig.Model || toks[1] != sig.Engine {
		a.bad(msg, "signals", fmt.Errorf("%w: signal for %s.%s published on subject %s", errSubject, sig.Model, sig.Engine, msg.Subject()))
		return
	}
	if !a.allowed(msg, &sig) {
		// Not folded in, acknowledged all the same: a refused signal is
		// no reason to have it delivered again.
		a.mu.Lock()
		a.pending["signals"] = msg
		a.mu.Unlock()
		return
	}
	a.metrics.signals.Inc()
	a.metrics.lag.Set(now.Sub(time.UnixMilli(sig.Time)).Seconds())
	a.mu.Lock()
	defer a.mu.Unlock() // deferred: a panic while folding must not leave it locked
	a.foldSignal(&sig, now)
	a.pending["signals"] = msg
}

// allowed asks the endpoint policy about the endpoints sig advertises (the
// ones routers would use, endpoints.Of), and counts and logs a refusal. A
// URL whose host name is still being resolved is refused uncounted, as
// routers do: the engine's next signal finds the answer.
func (a *Aggregator) allowed(msg jetstream.Msg, sig *messages.EngineSignal) bool {
	if a.opts.Endpoints == nil {
		return true
	}
	u, subject := endpoints.Of(sig.Transports)
	err := a.opts.Endpoints.Check(sig.Model, sig.Engine, u, subject)
	if err == nil {
		return true
	}
	if errors.Is(err, endpoints.ErrResolving) {
		return false
	}
	reason := endpoints.Reason(err)
	a.metrics.refused.WithLabelValues(reason).Inc()
	a.guard.Log("endpoint/"+msg.Subject()).Err(err).Str("subject", msg.Subject()).Str("reason", reason).
		Str("model", sig.Model).Str("engine", sig.Engine).
		Msg("ignored an engine signal: the operator's endpoint policy refuses the endpoint it advertises; the engine keeps the endpoints it was allowed last (logged at a bounded rate)")
	return false
}

// foldSignal folds one valid signal into the engine's state. Callers hold a.mu.
func (a *Aggregator) foldSignal(sig *messages.EngineSignal, now time.Time) {
	key := streams.JoinKey(sig.Model, sig.Engine)
	e, ok := a.engines[key]
	if !ok {
		e = &engineEntry{state: messages.EngineState{Model: sig.Model, Engine: sig.Engine}}
		a.engines[key] = e
	}
	st := &e.state
	first := st.Signals == 0
	// A stored time ahead of the clock (a signal dated in the future, or a
	// state loaded from the bucket) counts as now: neither dedup nor the
	// windows' weights wait for it.
	st.LastSignal = dedupHorizon(st.LastSignal, now)
	if !first && sig.Seq <= st.LastSeq && sig.Time <= st.LastSignal {
		a.metrics.duplicates.Inc()
		return // redelivered or out of order: already folded in
	}
	dt := float64(sig.Time-st.LastSignal) / 1000
	s := a.smooth
	// An engine that completed no request in a signal's interval repeats
	// its last interval's means (the agent and the engine simulator both
	// do): folding the repeat would weight an old measurement as new, and
	// the latency windows would converge on it while the load window
	// decays, so the optimizer's fit (optimizer.BaseFit) would read an idle
	// engine's last latency at ever lower loads. A repeat leaves the
	// latency windows as they were.
	repeat := !first && e.haveLast && sig.TTFTMs == e.lastTTFT && sig.TBTMs == e.lastTBT
	e.lastTTFT, e.lastTBT, e.haveLast = sig.TTFTMs, sig.TBTMs, true
	if !repeat {
		s.Update(&st.TTFTMs, sig.TTFTMs, dt, first)
		s.Update(&st.TBTMs, sig.TBTMs, dt, first)
	}
	s.Update(&st.Queue, float64(sig.Queue), dt, first)
	s.Update(&st.Running, float64(sig.Running), dt, first)
	st.InFlight = int64(sig.Queue) + int64(sig.Running)
	s.Update(&st.KVUse, sig.KVUse, dt, first)
	s.Update(&st.LoadRPS, sig.LoadRPS, dt, first)
	if !repeat {
		s.Update(&st.OutputTokens, sig.OutputTokens, dt, first)
	}
	if sig.PromptTokens > 0 {
		// An engine that does not state its mix (0) leaves the window as it
		// was rather than pulling it to 0.
		s.Update(&st.PromptTokens, sig.PromptTokens, dt, first || st.PromptTokens.IsZero())
	}
	st.PrefillWeight = sig.PrefillWeight
	st.Region = sig.Region
	st.CapacityRPS = sig.CapacityRPS
	st.Replicas = sig.Replicas
	st.Health = sig.Health
	st.BaseLatencyMs = sig.BaseLatencyMs
	st.Transports = append(st.Transports[:0], sig.Transports...)
	st.LastSignal = max(st.LastSignal, dedupHorizon(sig.Time, now))
	st.LastSeq = sig.Seq
	st.Signals++
	st.Status = messages.StatusUp
	e.lastSeen = now
	e.dirty = true
}

func (a *Aggregator) handleReport(msg jetstream.Msg) {
	defer a.guard.Recover("reports", msg.Subject(), a.recovered("reports", msg))
	if a.opts.BeforeFold != nil {
		a.opts.BeforeFold(msg.Subject(), msg.Data())
	}
	now := a.opts.Now()
	var rep messages.RouterReport
	if err := messages.DecodeIntoAt(msg.Data(), &rep, now); err != nil {
		a.bad(msg, "reports", err)
		return
	}
	toks, ok := a.opts.Names.ParseSubject(msg.Subject(), "report", 3)
	if !ok || toks[0] != rep.Model || toks[1] != rep.Cluster || toks[2] != rep.Router {
		a.bad(msg, "reports", fmt.Errorf("%w: report for %s.%s.%s published on subject %s", errSubject, rep.Model, rep.Cluster, rep.Router, msg.Subject()))
		return
	}
	err := func() error {
		a.mu.Lock()
		defer a.mu.Unlock() // deferred: a panic while folding must not leave it locked
		err := a.foldReport(&rep, now)
		if err == nil {
			a.pending["reports"] = msg
		}
		return err
	}()
	if err != nil {
		a.bad(msg, "reports", err)
		return
	}
	a.metrics.reports.Inc()
}

// maxRoutersPerCluster bounds the routers a cluster's demand state lists
// for one model: the state must encode within messages.MaxMessageSize, and
// 160 routers with the longest names and every window take about 40 KiB.
// With each router's rates bounded by messages.MaxRouterRate, it also keeps
// a cluster's summed demand below messages.MaxRate. A report from one more
// router is refused until a listed one expires (silent for 10 × DownAfter),
// so that invented router names cannot block the cluster's demand.
const maxRoutersPerCluster = 160

// errTooManyRouters is returned by foldReport for a report of a router a
// full demand state does not list.
var errTooManyRouters = errors.New("aggregator: too many routers in the cluster")

// dedupClockTolerance is how far ahead of the aggregator's clock a stored
// last-signal or last-report time may be (dedupHorizon). Redelivered messages
// from senders whose clocks run ahead by less are still recognised; a message
// dated further ahead — a forged far-future time — can make a real sender's
// next messages look already seen for at most this long (one report at the
// default interval), not until its date.
const dedupClockTolerance = time.Second

// dedupHorizon returns ms, or the aggregator's now plus dedupClockTolerance
// when that is earlier: the latest time a stored state may claim to have
// seen, against which a message's time is compared.
func dedupHorizon(ms int64, now time.Time) int64 {
	return min(ms, now.Add(dedupClockTolerance).UnixMilli())
}

// foldReport folds one valid router report into demand and RTT state; it
// refuses (errTooManyRouters) a report of a new router when its cluster lists
// maxRoutersPerCluster already. A report whose sequence number and time are
// both not newer than the router's is a redelivery, skipped; one with a lower
// sequence number but a newer time is a restarted router's, folded in. The
// router's time is stored at most dedupClockTolerance ahead of now, so that
// a report dated in the future cannot make the router's next ones look seen.
// Callers hold a.mu.
func (a *Aggregator) foldReport(rep *messages.RouterReport, now time.Time) error {
	key := streams.JoinKey(rep.Model, rep.Cluster)
	d, ok := a.demand[key]
	if !ok {
		d = &demandEntry{state: messages.DemandState{Model: rep.Model, Cluster: rep.Cluster}}
		a.demand[key] = d
	}
	st := &d.state
	if st.Routers == nil {
		st.Routers = make(map[string]messages.RouterDemand)
	}
	r, seen := st.Routers[rep.Router]
	r.LastReport = dedupHorizon(r.LastReport, now)
	if seen && rep.Seq <= r.Seq && rep.Time <= r.LastReport {
		a.metrics.duplicates.Inc()
		return nil
	}
	if !seen && len(st.Routers) >= maxRoutersPerCluster {
		a.sumDemand(st, now) // forgets routers silent long enough
		if len(st.Routers) >= maxRoutersPerCluster {
			return fmt.Errorf("%w: report of %s for %s in %s, which lists %d routers already (limit %d)",
				errTooManyRouters, rep.Router, rep.Model, rep.Cluster, len(st.Routers), maxRoutersPerCluster)
		}
	}
	first := !seen
	dt := float64(rep.Time-r.LastReport) / 1000
	s := a.smooth
	r.Fold(s, rep, dt, first)
	r.LastReport = max(r.LastReport, dedupHorizon(rep.Time, now))
	r.Seq = rep.Seq
	st.Routers[rep.Router] = r
	st.LastReport = max(st.LastReport, dedupHorizon(rep.Time, now))
	st.Reports++
	a.sumDemand(st, now)
	d.dirty = true

	// Per-engine outcomes, into the states of engines that have signalled:
	// a report cannot create an engine.
	for engine, o := range rep.Engines {
		e, ok := a.engines[streams.JoinKey(rep.Model, engine)]
		if !ok {
			continue
		}
		if e.state.Outcomes == nil {
			e.state.Outcomes = &messages.EngineOutcomes{}
		}
		e.outcomes.fold(e.state.Outcomes, o, rep.Time, now, s)
		e.dirty = true
	}

	for engine, ms := range rep.RTTMs {
		rk := streams.JoinRTTKey(rep.Cluster, engine)
		e, ok := a.rtt[rk]
		if !ok {
			e = &rttEntry{state: messages.RTTState{Cluster: rep.Cluster, Engine: engine}}
			a.rtt[rk] = e
		}
		dt := float64(rep.Time-e.state.Time) / 1000
		s.Update(&e.state.RTTMs, ms, dt, e.state.Samples == 0)
		e.state.Samples++
		e.state.Time = max(e.state.Time, dedupHorizon(rep.Time, now))
		e.dirty = true
	}
	return nil
}

// sumDemand recomputes a cluster's demand as the sum over its live routers and
// forgets routers silent for much longer than DownAfter.
func (a *Aggregator) sumDemand(st *messages.DemandState, now time.Time) {
	var rps, shed, retry, prompt, done, output, variance messages.Window
	var pri map[string]messages.Window
	for name, r := range st.Routers {
		age := now.Sub(time.UnixMilli(r.LastReport))
		if age > 10*a.opts.DownAfter {
			delete(st.Routers, name)
			continue
		}
		if age > a.opts.DownAfter {
			continue
		}
		rps.Fast += r.RPS.Fast
		rps.Slow += r.RPS.Slow
		shed.Fast += r.ShedRPS.Fast
		shed.Slow += r.ShedRPS.Slow
		retry.Fast += r.RetryRPS.Fast
		retry.Slow += r.RetryRPS.Slow
		// The routers' counts are independent, so their variances add.
		for _, acc := range [...]struct{ sum, w *messages.Window }{{&prompt, &r.PromptTPS}, {&done, &r.DoneRPS},
			{&output, &r.OutputTPS}, {&variance, &r.RPSVar}} {
			acc.sum.Fast += acc.w.Fast
			acc.sum.Slow += acc.w.Slow
		}
		for p, w := range r.Priority {
			if pri == nil {
				pri = make(map[string]messages.Window, 3)
			}
			acc := pri[p]
			acc.Fast += w.Fast
			acc.Slow += w.Slow
			pri[p] = acc
		}
	}
	st.RPS, st.ShedRPS, st.RetryRPS, st.RPSByPriority = rps, shed, retry, pri
	st.PromptTPS, st.DoneRPS, st.OutputTPS, st.RPSVar = prompt, done, output, variance
}

type write struct {
	bucket, key string
	data        []byte
	redirty     func()
}

// flush updates liveness, writes every dirty key once, and then acknowledges
// the messages folded in before the write.
func (a *Aggregator) flush(ctx context.Context) error {
	now := a.opts.Now()
	nowMs := now.UnixMilli()
	var writes []write
	var forget []write
	a.mu.Lock()
	counts := map[string]int{}
	for key, e := range a.engines {
		if now.Sub(e.lastSeen) > a.opts.ForgetAfter {
			delete(a.engines, key)
			forget = append(forget, write{bucket: a.opts.Names.EnginesBucket, key: key})
			a.metrics.forgotten.WithLabelValues("engine").Inc()
			continue
		}
		// Silence counts from when signals last began to flow, and not at
		// all while the signal stream is gone: an engine is not marked down
		// because the control plane lost its input.
		since := e.lastSeen
		if a.signalsSince.After(since) {
			since = a.signalsSince
		}
		status := messages.StatusUp
		switch silent := now.Sub(since); {
		case a.signalsLost:
			status = e.state.Status
		case silent > a.opts.DownAfter:
			status = messages.StatusDown
		case silent > a.opts.StaleAfter:
			status = messages.StatusStale
		}
		counts[status]++
		if status != e.state.Status {
			if status != messages.StatusUp {
				a.log.Info().Str("model", e.state.Model).Str("engine", e.state.Engine).Str("status", status).
					Dur("silent", now.Sub(e.lastSeen)).Msg("engine stopped signalling")
			}
			e.state.Status = status
			e.dirty = true
		}
		// The outcome windows are in wall time: they empty while no report
		// names the engine.
		if e.state.Outcomes != nil && e.outcomes.tick(e.state.Outcomes, now, a.smooth) {
			e.dirty = true
		}
		if !e.dirty {
			continue
		}
		e.state.Time = nowMs
		if e.state.LastSignal > nowMs {
			e.state.LastSignal = nowMs
		}
		data, err := messages.EncodeAt(&e.state, now)
		if err != nil {
			a.encodeFailed(key, "engine state", err)
			e.dirty = false
			continue
		}
		e.dirty = false
		ent := e
		writes = append(writes, write{a.opts.Names.EnginesBucket, key, data, func() { ent.dirty = true }})
	}
	for key, d := range a.demand {
		if now.Sub(time.UnixMilli(d.state.LastReport)) > a.opts.ForgetAfter {
			delete(a.demand, key)
			forget = append(forget, write{bucket: a.opts.Names.DemandBucket, key: key})
			a.metrics.forgotten.WithLabelValues("demand").Inc()
			continue
		}
		before := d.state.RPS
		a.sumDemand(&d.state, now)
		if d.state.RPS != before {
			d.dirty = true
		}
		if !d.dirty {
			continue
		}
		d.state.Time = nowMs
		data, err := a.encodeDemand(&d.state, now)
		if err != nil {
			a.encodeFailed(key, "demand state", err)
			d.dirty = false
			continue
		}
		d.dirty = false
		ent := d
		writes = append(writes, write{a.opts.Names.DemandBucket, key, data, func() { ent.dirty = true }})
	}
	for key, r := range a.rtt {
		if now.Sub(time.UnixMilli(r.state.Time)) > a.opts.ForgetAfter {
			delete(a.rtt, key)
			forget = append(forget, write{bucket: a.opts.Names.DemandBucket, key: key})
			a.metrics.forgotten.WithLabelValues("rtt").Inc()
			continue
		}
		if !r.dirty {
			continue
		}
		data, err := messages.EncodeAt(&r.state, now)
		if err != nil {
			a.encodeFailed(key, "RTT state", err)
			r.dirty = false
			continue
		}
		r.dirty = false
		ent := r
		writes = append(writes, write{a.opts.Names.DemandBucket, key, data, func() { ent.dirty = true }})
	}
	toAck := a.pending
	a.pending = make(map[string]jetstream.Msg, 2)
	toTerm := a.dropped
	a.dropped = make(map[string][]jetstream.Msg, 2)
	ttl := map[string]bool{a.opts.Names.EnginesBucket: a.ttl[a.opts.Names.EnginesBucket], a.opts.Names.DemandBucket: a.ttl[a.opts.Names.DemandBucket]}
	a.mu.Unlock()
	a.guard.Flush()
	a.purge(ctx, forget, ttl)
	for s, n := range counts {
		a.metrics.engines.WithLabelValues(s).Set(float64(n))
	}
	for _, s := range []string{messages.StatusUp, messages.StatusStale, messages.StatusDown} {
		if _, ok := counts[s]; !ok {
			a.metrics.engines.WithLabelValues(s).Set(0)
		}
	}

	err := a.publish(ctx, writes, ttl)
	if err != nil {
		a.mu.Lock()
		for _, w := range writes {
			w.redirty()
		}
		for s, m := range toAck {
			if _, newer := a.pending[s]; !newer {
				a.pending[s] = m
			}
		}
		for s, ms := range toTerm {
			for _, m := range ms {
				a.dropLocked(s, m)
			}
		}
		a.mu.Unlock()
		return err
	}
	a.metrics.writes.Add(float64(len(writes)))
	for _, ms := range toTerm {
		for _, m := range ms {
			if err := m.Term(); err != nil {
				a.log.Debug().Err(err).Msg("term")
			}
		}
	}
	for _, m := range toAck {
		if err := m.Ack(); err != nil {
			a.log.Debug().Err(err).Msg("ack")
		}
	}
	return nil
}

// encodeFailed logs, at a bounded rate per key, a state that could not be
// encoded (and so is not written).
func (a *Aggregator) encodeFailed(key, what string, err error) {
	if ev := a.guard.Log("encode/" + key); ev != nil {
		ev.Err(err).Str("key", key).Msg("cannot encode " + what + "; not written (logged at a bounded rate)")
	}
}

// encodeDemand encodes a cluster's demand state. Should it not encode (a
// router's windows out of range, which validated reports cannot cause), the
// routers whose entries do not validate on their own are dropped, counted,
// and the sums recomputed, so that one router's entry never blocks the
// cluster's demand.
func (a *Aggregator) encodeDemand(st *messages.DemandState, now time.Time) ([]byte, error) {
	data, err := messages.EncodeAt(st, now)
	if err == nil || len(st.Routers) == 0 {
		return data, err
	}
	for name, r := range st.Routers {
		one := messages.DemandState{Model: st.Model, Cluster: st.Cluster, Time: st.Time,
			Routers: map[string]messages.RouterDemand{name: r}}
		if verr := one.Validate(now); verr != nil {
			delete(st.Routers, name)
			a.metrics.dropped.Inc()
			if ev := a.guard.Log("drop/" + st.Model + "." + st.Cluster + "." + name); ev != nil {
				ev.Err(verr).Str("model", st.Model).Str("cluster", st.Cluster).Str("router", name).
					Msg("router's demand entry dropped: the cluster's demand did not encode with it (logged at a bounded rate)")
			}
		}
	}
	a.sumDemand(st, now)
	return messages.EncodeAt(st, now)
}

// purge removes the keys of forgotten entries. Most have expired by
// themselves (their last value carried ForgetAfter as its TTL); the purge
// removes those written without one, by an older aggregator or into a bucket
// that takes no TTLs. With TTLs its marker expires too.
func (a *Aggregator) purge(ctx context.Context, forget []write, ttl map[string]bool) {
	for _, w := range forget {
		a.log.Info().Str("bucket", w.bucket).Str("key", w.key).Dur("silent_for", a.opts.ForgetAfter).Msg("forgetting silent state")
		kv, err := a.js.KeyValue(ctx, w.bucket)
		if err != nil {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if ttl[w.bucket] {
			err = kv.Purge(pctx, w.key, jetstream.PurgeTTL(streams.StateMarkerTTL))
		} else {
			err = kv.Purge(pctx, w.key)
		}
		cancel()
		if err != nil && ctx.Err() == nil {
			a.log.Debug().Err(err).Str("key", w.key).Msg("purge forgotten key")
		}
	}
}

// publish writes the values with asynchronous KV puts and waits for all
// acks. Into a bucket that takes per-key TTLs, each value carries
// ForgetAfter as its TTL, so that it expires when the aggregator stops
// writing it (the aggregator died, or the thing it describes went silent).
func (a *Aggregator) publish(ctx context.Context, writes []write, ttl map[string]bool) error {
	if len(writes) == 0 {
		return nil
	}
	withTTL := []jetstream.PublishOpt{jetstream.WithMsgTTL(a.opts.ForgetAfter.Round(time.Second))}
	futures := make([]jetstream.PubAckFuture, 0, len(writes))
	for _, w := range writes {
		var opts []jetstream.PublishOpt
		if ttl[w.bucket] {
			opts = withTTL
		}
		f, err := a.js.PublishAsync("$KV."+w.bucket+"."+w.key, w.data, opts...)
		if err != nil {
			return fmt.Errorf("aggregator: write %s/%s: %w", w.bucket, w.key, err)
		}
		futures = append(futures, f)
	}
	for i, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("aggregator: write %s/%s: %w", writes[i].bucket, writes[i].key, err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
