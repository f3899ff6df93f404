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
	"github.com/switchyard-dev/switchyard/internal/logthrottle"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
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
	// FastHalfLife and SlowHalfLife are the EWMA half-lives. Defaults 1 s and 30 s.
	FastHalfLife time.Duration
	SlowHalfLife time.Duration
	// StaleAfter and DownAfter bound how long an engine may stay silent before
	// it is marked stale, then down. Defaults 2 s and 6 s.
	StaleAfter time.Duration
	DownAfter  time.Duration
	// WriteInterval is the batching period of KV writes. Default 250 ms.
	WriteInterval time.Duration
	// Logger receives the service's log.
	Logger zerolog.Logger
	// Registerer receives the service's metrics; nil means none are registered.
	Registerer prometheus.Registerer
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (o *Options) setDefaults() {
	if o.Names == (streams.Names{}) {
		o.Names = streams.DefaultNames()
	}
	if o.Durable == "" {
		o.Durable = "sy-aggregator"
	}
	if o.FastHalfLife == 0 {
		o.FastHalfLife = time.Second
	}
	if o.SlowHalfLife == 0 {
		o.SlowHalfLife = 30 * time.Second
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
	if o.Now == nil {
		o.Now = time.Now
	}
}

// ErrOptions is wrapped by New for invalid options.
var ErrOptions = errors.New("aggregator: invalid options")

// Aggregator is the running service. Create it with New and run it with Run.
type Aggregator struct {
	opts    Options
	log     zerolog.Logger
	js      jetstream.JetStream
	smooth  Smoother
	metrics *metrics
	badLog  *logthrottle.Throttle

	mu      sync.Mutex
	engines map[string]*engineEntry
	demand  map[string]*demandEntry
	rtt     map[string]*rttEntry
	// pending holds, per stream, the newest folded message not yet acknowledged.
	pending map[string]jetstream.Msg
}

type engineEntry struct {
	state    messages.EngineState
	lastSeen time.Time
	dirty    bool
	outcomes outcomeAcc
}

type demandEntry struct {
	state messages.DemandState
	dirty bool
}

type rttEntry struct {
	state messages.RTTState
	dirty bool
}

// New validates opts and returns an Aggregator ready to Run.
func New(opts Options) (*Aggregator, error) {
	opts.setDefaults()
	if opts.Conn == nil {
		return nil, fmt.Errorf("%w: Conn is nil", ErrOptions)
	}
	if err := opts.Names.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrOptions, err)
	}
	if !messages.ValidName(opts.Durable) {
		return nil, fmt.Errorf("%w: durable name %q is not a valid name", ErrOptions, opts.Durable)
	}
	if opts.StaleAfter >= opts.DownAfter {
		return nil, fmt.Errorf("%w: stale-after %s must be shorter than down-after %s", ErrOptions, opts.StaleAfter, opts.DownAfter)
	}
	js, err := jetstream.New(opts.Conn, jetstream.WithPublishAsyncMaxPending(16384))
	if err != nil {
		return nil, fmt.Errorf("aggregator: jetstream: %w", err)
	}
	a := &Aggregator{
		opts:    opts,
		log:     opts.Logger.With().Str("component", "aggregator").Logger(),
		js:      js,
		smooth:  Smoother{Fast: opts.FastHalfLife.Seconds(), Slow: opts.SlowHalfLife.Seconds()},
		metrics: newMetrics(opts.Registerer),
		badLog:  logthrottle.New(10*time.Second, 10000),
		engines: make(map[string]*engineEntry),
		demand:  make(map[string]*demandEntry),
		rtt:     make(map[string]*rttEntry),
		pending: make(map[string]jetstream.Msg),
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
	var ccs []jetstream.ConsumeContext
	defer func() {
		for _, cc := range ccs {
			cc.Stop()
		}
	}()
	for _, s := range []struct {
		stream, filter, suffix string
		handle                 func(jetstream.Msg)
	}{
		{a.opts.Names.SignalStream, a.opts.Names.SignalFilter(), "signals", a.handleSignal},
		{a.opts.Names.ReportStream, a.opts.Names.ReportFilter(), "reports", a.handleReport},
	} {
		cons, err := a.consumer(ctx, s.stream, jetstream.ConsumerConfig{
			Durable:       a.opts.Durable + "-" + s.suffix,
			Description:   "Switchyard aggregator",
			FilterSubject: s.filter,
			AckPolicy:     jetstream.AckAllPolicy,
			AckWait:       30 * time.Second,
			MaxAckPending: 1 << 20,
			DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil // asked to stop while starting
			}
			return fmt.Errorf("aggregator: durable consumer on stream %s: %w", s.stream, err)
		}
		cc, err := cons.Consume(s.handle,
			jetstream.PullMaxMessages(4096),
			jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
				a.log.Debug().Err(err).Str("stream", s.stream).Msg("consume")
			}))
		if err != nil {
			return fmt.Errorf("aggregator: consume stream %s: %w", s.stream, err)
		}
		ccs = append(ccs, cc)
	}
	a.log.Info().Dur("write_interval", a.opts.WriteInterval).Dur("stale_after", a.opts.StaleAfter).
		Dur("down_after", a.opts.DownAfter).Int("engines", loaded).Msg("aggregator running")
	t := time.NewTicker(a.opts.WriteInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			// Drain, not Stop: messages already pulled are delivered to the
			// handlers and written by the final flush. Stopped, they would be
			// pending on the consumer, and the successor's first
			// acknowledgement (AckAll) would acknowledge them unread: lost.
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
			ccs = nil
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
			m, err := messages.DecodeAt(e.Value(), now.Add(time.Hour))
			if err != nil {
				a.log.Warn().Err(err).Str("bucket", bucket).Str("key", e.Key()).Msg("ignoring undecodable state")
				continue
			}
			switch s := m.(type) {
			case *messages.EngineState:
				last := time.UnixMilli(s.LastSignal)
				if last.After(now) || s.Status != messages.StatusDown {
					// Silence counts from when this aggregator could first
					// hear the engine, as a router's does after a reconnect:
					// an engine up when the last run stopped is not made
					// stale or down (and slow-started by the optimizer)
					// before its first signal of this run could arrive.
					last = now
				}
				ent := &engineEntry{state: *s, lastSeen: last}
				if s.Outcomes != nil {
					ent.outcomes.restore(s.Outcomes, a.smooth, now)
				}
				a.engines[e.Key()] = ent
			case *messages.DemandState:
				a.demand[e.Key()] = &demandEntry{state: *s}
			case *messages.RTTState:
				a.rtt[e.Key()] = &rttEntry{state: *s}
			default:
				// Penalty and operator records (written by the optimizer and
				// by people) share sy_engines; they are not the aggregator's.
			}
		}
		if err := w.Stop(); err != nil {
			a.log.Debug().Err(err).Msg("stop watcher")
		}
	}
	a.log.Info().Int("engines", len(a.engines)).Int("demand", len(a.demand)).Int("rtt", len(a.rtt)).Msg("state loaded")
	return nil
}

// bad counts, logs at a limited rate, and terminates a message that failed to decode.
func (a *Aggregator) bad(msg jetstream.Msg, stream string, err error) {
	reason := "invalid"
	switch {
	case errors.Is(err, messages.ErrDecode):
		reason = "decode"
	case errors.Is(err, messages.ErrVersion):
		reason = "version"
	case errors.Is(err, messages.ErrTooLarge):
		reason = "too_large"
	case errors.Is(err, messages.ErrKind):
		reason = "kind"
	}
	a.metrics.bad.WithLabelValues(stream, reason).Inc()
	if a.badLog.Allow(msg.Subject(), time.Now()) {
		a.log.Warn().Err(err).Str("subject", msg.Subject()).Str("reason", reason).Int("bytes", len(msg.Data())).
			Msg("bad message skipped (logged at most once per 10s per subject)")
	}
	if err := msg.Term(); err != nil {
		a.log.Debug().Err(err).Msg("term")
	}
}

func (a *Aggregator) handleSignal(msg jetstream.Msg) {
	now := a.opts.Now()
	var sig messages.EngineSignal
	if err := messages.DecodeIntoAt(msg.Data(), &sig, now); err != nil {
		a.bad(msg, "signals", err)
		return
	}
	toks, ok := a.opts.Names.ParseSubject(msg.Subject(), "signal", 2)
	if !ok || toks[0] != sig.Model || toks[1] != sig.Engine {
		a.bad(msg, "signals", fmt.Errorf("%w: signal for %s.%s published on subject %s", messages.ErrInvalid, sig.Model, sig.Engine, msg.Subject()))
		return
	}
	a.metrics.signals.Inc()
	a.metrics.lag.Set(now.Sub(time.UnixMilli(sig.Time)).Seconds())
	a.mu.Lock()
	a.foldSignal(&sig, now)
	a.pending["signals"] = msg
	a.mu.Unlock()
}

// foldSignal folds one valid signal into the engine's state. Callers hold a.mu.
func (a *Aggregator) foldSignal(sig *messages.EngineSignal, now time.Time) {
	key := sig.Model + "." + sig.Engine
	e, ok := a.engines[key]
	if !ok {
		e = &engineEntry{state: messages.EngineState{Model: sig.Model, Engine: sig.Engine}}
		a.engines[key] = e
	}
	st := &e.state
	first := st.Signals == 0
	if !first && sig.Seq <= st.LastSeq && sig.Time <= st.LastSignal {
		a.metrics.duplicates.Inc()
		return // redelivered or out of order: already folded in
	}
	dt := float64(sig.Time-st.LastSignal) / 1000
	s := a.smooth
	s.Update(&st.TTFTMs, sig.TTFTMs, dt, first)
	s.Update(&st.TBTMs, sig.TBTMs, dt, first)
	s.Update(&st.Queue, float64(sig.Queue), dt, first)
	s.Update(&st.Running, float64(sig.Running), dt, first)
	s.Update(&st.KVUse, sig.KVUse, dt, first)
	s.Update(&st.LoadRPS, sig.LoadRPS, dt, first)
	s.Update(&st.OutputTokens, sig.OutputTokens, dt, first)
	st.Region = sig.Region
	st.CapacityRPS = sig.CapacityRPS
	st.Replicas = sig.Replicas
	st.Health = sig.Health
	st.BaseLatencyMs = sig.BaseLatencyMs
	st.Transports = append(st.Transports[:0], sig.Transports...)
	if sig.Time > st.LastSignal {
		st.LastSignal = sig.Time
	}
	st.LastSeq = sig.Seq
	st.Signals++
	st.Status = messages.StatusUp
	e.lastSeen = now
	e.dirty = true
}

func (a *Aggregator) handleReport(msg jetstream.Msg) {
	now := a.opts.Now()
	var rep messages.RouterReport
	if err := messages.DecodeIntoAt(msg.Data(), &rep, now); err != nil {
		a.bad(msg, "reports", err)
		return
	}
	toks, ok := a.opts.Names.ParseSubject(msg.Subject(), "report", 3)
	if !ok || toks[0] != rep.Model || toks[1] != rep.Cluster || toks[2] != rep.Router {
		a.bad(msg, "reports", fmt.Errorf("%w: report for %s.%s.%s published on subject %s", messages.ErrInvalid, rep.Model, rep.Cluster, rep.Router, msg.Subject()))
		return
	}
	a.metrics.reports.Inc()
	a.mu.Lock()
	a.foldReport(&rep, now)
	a.pending["reports"] = msg
	a.mu.Unlock()
}

// foldReport folds one valid router report into demand and RTT state. Callers hold a.mu.
func (a *Aggregator) foldReport(rep *messages.RouterReport, now time.Time) {
	key := rep.Model + "." + rep.Cluster
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
	if seen && rep.Seq <= r.Seq && rep.Time <= r.LastReport {
		a.metrics.duplicates.Inc()
		return
	}
	first := !seen
	dt := float64(rep.Time-r.LastReport) / 1000
	s := a.smooth
	s.Update(&r.RPS, float64(rep.Requests)/rep.IntervalS, dt, first)
	s.Update(&r.ShedRPS, float64(rep.Shed)/rep.IntervalS, dt, first)
	s.Update(&r.RetryRPS, float64(rep.Retries)/rep.IntervalS, dt, first)
	if len(rep.DemandByPriority) > 0 || len(r.Priority) > 0 {
		pri := make(map[string]messages.Window, 3)
		for _, p := range []string{messages.PriorityCritical, messages.PriorityStandard, messages.PrioritySheddable} {
			w, had := r.Priority[p]
			s.Update(&w, float64(rep.DemandByPriority[p])/rep.IntervalS, dt, first || !had)
			pri[p] = w
		}
		r.Priority = pri
	}
	r.LastReport = max(r.LastReport, rep.Time)
	r.Seq = rep.Seq
	st.Routers[rep.Router] = r
	if rep.Time > st.LastReport {
		st.LastReport = rep.Time
	}
	st.Reports++
	a.sumDemand(st, now)
	d.dirty = true

	// Per-engine outcomes, into the states of engines that have signalled:
	// a report cannot create an engine.
	for engine, o := range rep.Engines {
		e, ok := a.engines[rep.Model+"."+engine]
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
		rk := "rtt." + rep.Cluster + "." + engine
		e, ok := a.rtt[rk]
		if !ok {
			e = &rttEntry{state: messages.RTTState{Cluster: rep.Cluster, Engine: engine}}
			a.rtt[rk] = e
		}
		dt := float64(rep.Time-e.state.Time) / 1000
		s.Update(&e.state.RTTMs, ms, dt, e.state.Samples == 0)
		e.state.Samples++
		e.state.Time = max(e.state.Time, rep.Time)
		e.dirty = true
	}
}

// sumDemand recomputes a cluster's demand as the sum over its live routers and
// forgets routers silent for much longer than DownAfter.
func (a *Aggregator) sumDemand(st *messages.DemandState, now time.Time) {
	var rps, shed, retry messages.Window
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
	a.mu.Lock()
	counts := map[string]int{}
	for key, e := range a.engines {
		status := messages.StatusUp
		switch silent := now.Sub(e.lastSeen); {
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
		if !e.dirty {
			continue
		}
		e.state.Time = nowMs
		if e.state.LastSignal > nowMs {
			e.state.LastSignal = nowMs
		}
		data, err := messages.EncodeAt(&e.state, now)
		if err != nil {
			a.log.Error().Err(err).Str("key", key).Msg("cannot encode engine state")
			e.dirty = false
			continue
		}
		e.dirty = false
		ent := e
		writes = append(writes, write{a.opts.Names.EnginesBucket, key, data, func() { ent.dirty = true }})
	}
	for key, d := range a.demand {
		before := d.state.RPS
		a.sumDemand(&d.state, now)
		if d.state.RPS != before {
			d.dirty = true
		}
		if !d.dirty {
			continue
		}
		d.state.Time = nowMs
		data, err := messages.EncodeAt(&d.state, now)
		if err != nil {
			a.log.Error().Err(err).Str("key", key).Msg("cannot encode demand state")
			d.dirty = false
			continue
		}
		d.dirty = false
		ent := d
		writes = append(writes, write{a.opts.Names.DemandBucket, key, data, func() { ent.dirty = true }})
	}
	for key, r := range a.rtt {
		if !r.dirty {
			continue
		}
		data, err := messages.EncodeAt(&r.state, now)
		if err != nil {
			a.log.Error().Err(err).Str("key", key).Msg("cannot encode RTT state")
			r.dirty = false
			continue
		}
		r.dirty = false
		ent := r
		writes = append(writes, write{a.opts.Names.DemandBucket, key, data, func() { ent.dirty = true }})
	}
	toAck := a.pending
	a.pending = make(map[string]jetstream.Msg, 2)
	a.mu.Unlock()
	for s, n := range counts {
		a.metrics.engines.WithLabelValues(s).Set(float64(n))
	}
	for _, s := range []string{messages.StatusUp, messages.StatusStale, messages.StatusDown} {
		if _, ok := counts[s]; !ok {
			a.metrics.engines.WithLabelValues(s).Set(0)
		}
	}

	err := a.publish(ctx, writes)
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
		a.mu.Unlock()
		return err
	}
	a.metrics.writes.Add(float64(len(writes)))
	for _, m := range toAck {
		if err := m.Ack(); err != nil {
			a.log.Debug().Err(err).Msg("ack")
		}
	}
	return nil
}

// publish writes the values with asynchronous KV puts and waits for all acks.
func (a *Aggregator) publish(ctx context.Context, writes []write) error {
	if len(writes) == 0 {
		return nil
	}
	futures := make([]jetstream.PubAckFuture, 0, len(writes))
	for _, w := range writes {
		f, err := a.js.PublishAsync("$KV."+w.bucket+"."+w.key, w.data)
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
