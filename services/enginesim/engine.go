package enginesim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/switchyard-dev/switchyard/batching"
	"github.com/switchyard-dev/switchyard/internal/poison"
	"github.com/switchyard-dev/switchyard/services/engine"
)

// ErrClosed is returned by Start and SetFailure once the engine is closed.
var ErrClosed = errors.New("enginesim: engine closed")

// Engine is one simulated engine. Create it with New, start it with Start or
// Run, and stop it with Close.
type Engine struct {
	opts    Options
	log     zerolog.Logger
	metrics *metrics
	poison  *poison.Guard
	handler http.Handler
	wake    chan struct{}
	quit    chan struct{}
	// baseCtx ends at Close; NATS requests and the publisher derive from it.
	baseCtx    context.Context
	cancelBase context.CancelFunc
	wg         sync.WaitGroup
	closeOnce  sync.Once

	mu    sync.Mutex // guards the fields below up to ctl
	batch *batching.Batch[*request]
	// admitted are the requests of the prefill step in progress.
	admitted   []*request
	kvReserved int
	stats      stats
	failure    Failure
	sinceSet   int // requests since the failure was set, for CrashAfter
	closing    bool
	rng        *rand.Rand
	nextID     uint64
	// httpURL and inferSubject are the advertised transports (set by Start).
	httpURL      string
	inferSubject string

	ctl      sync.Mutex // guards the lifecycle fields below
	started  bool
	closed   bool
	adminURL string
	addr     string // the bound HTTP address, reused when recovering from a crash
	front    *http.Server
	admin    *http.Server
	sub      *nats.Subscription
	ctlSub   *nats.Subscription // the control subject; stays up when crashed
	pub      *engine.Publisher
	kvPub    *KVPublisher
	kv       *prefixCache
}

// New validates opts (after applying defaults) and returns an engine that is not yet serving.
func New(opts Options) (*Engine, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	seed := opts.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	e := &Engine{
		opts:    opts,
		wake:    make(chan struct{}, 1),
		quit:    make(chan struct{}),
		failure: opts.Failure,
		batch:   batching.New[*request](opts.cost(), opts.MaxBatch),
		rng:     rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		addr:    opts.Listen,
		log: opts.Logger.With().Str("component", "enginesim").
			Str("model", opts.Model).Str("engine", opts.Name).Logger(),
	}
	e.baseCtx, e.cancelBase = context.WithCancel(context.Background())
	e.metrics = newMetrics(e)
	guard, err := poison.New(poison.Options{Component: "enginesim", Logger: e.log, Registerer: e.metrics.reg})
	if err != nil {
		return nil, fmt.Errorf("enginesim: %w", err)
	}
	e.poison = guard
	e.handler = e.routes()
	// Before any measurement, signal what the model predicts for a lone request.
	e.stats.lastTTFTMs = opts.cost().PrefillMs(opts.PromptTokens) * opts.TimeScale
	e.stats.lastTBTMs = opts.cost().DecodeMs(1, 0) * opts.TimeScale
	e.stats.lastOut = float64(opts.OutputTokens)
	if opts.Conn != nil {
		subj, err := opts.Names.InferSubject(opts.Model, opts.Name)
		if err != nil {
			return nil, fmt.Errorf("enginesim: inference subject for model %q engine %q: %w", opts.Model, opts.Name, err)
		}
		e.inferSubject = subj
		if !opts.NoSignals {
			pub, err := engine.NewPublisher(engine.Options{
				Conn: opts.Conn, Names: opts.Names, Model: opts.Model, ServedModel: opts.ServedModel, Engine: opts.Name, Region: opts.Region,
				Interval: opts.SignalInterval, Source: e.signal, Logger: opts.Logger,
			})
			if err != nil {
				return nil, fmt.Errorf("enginesim: %w", err)
			}
			e.pub = pub
		}
	}
	return e, nil
}

// Start binds the HTTP listener(s), subscribes on NATS, and starts the
// scheduler and the signal publisher. ctx bounds only the start-up; stop the
// engine with Close.
func (e *Engine) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	e.ctl.Lock()
	defer e.ctl.Unlock()
	if e.closed {
		return ErrClosed
	}
	if e.started {
		return errors.New("enginesim: engine already started")
	}
	e.mu.Lock()
	crashed := e.failure.Crashed
	e.stats.start = time.Now()
	e.mu.Unlock()
	if e.opts.KVEvents != "" && e.kvPub == nil {
		// Before serving: requests read e.kv without a lock.
		p, err := NewKVPublisher(KVPublisherOptions{Endpoint: e.opts.KVEvents, Replay: e.opts.KVReplay,
			Topic: e.opts.KVTopic, Logger: e.log})
		if err != nil {
			return err
		}
		e.kvPub, e.kv = p, newPrefixCache(vllmBlockSize, e.opts.KVTokens/vllmBlockSize, p)
	}
	if e.opts.AdminListen != "" {
		l, err := net.Listen("tcp", e.opts.AdminListen)
		if err != nil {
			return fmt.Errorf("enginesim: engine %s: admin listen on %s: %w", e.opts.Name, e.opts.AdminListen, err)
		}
		e.adminURL = "http://" + l.Addr().String()
		e.admin = e.serve(l, e.adminRoutes())
	}
	if !crashed {
		if err := e.startServingLocked(); err != nil {
			if e.admin != nil {
				_ = e.admin.Close()
			}
			return err
		}
	} else if l, err := net.Listen("tcp", e.addr); err == nil {
		// Crashed from the start: learn the address, then let it go.
		e.addr = l.Addr().String()
		_ = l.Close()
	}
	e.mu.Lock()
	e.httpURL = "http://" + e.addr
	e.mu.Unlock()
	if e.opts.Conn != nil {
		if err := e.subscribeControlLocked(); err != nil {
			e.stopServingLocked()
			if e.admin != nil {
				_ = e.admin.Close()
			}
			return err
		}
	}
	e.started = true
	e.wg.Add(1)
	go e.schedule()
	if e.pub != nil {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			_ = e.pub.Run(e.baseCtx)
		}()
	}
	e.log.Info().Str("http", e.httpURL).Str("nats", e.inferSubject).
		Float64("capacity_rps", e.Capacity()).Msg("engine simulator started")
	return nil
}

// Run starts the engine, serves until ctx ends, then closes it.
func (e *Engine) Run(ctx context.Context) error {
	if err := e.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	return e.Close()
}

// Close stops serving, fails requests still in flight, and waits for every
// goroutine of the engine to end. It is safe to call more than once.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		e.mu.Lock()
		e.closing = true
		e.mu.Unlock()
		close(e.quit)
		e.ctl.Lock()
		e.closed = true
		front, admin, sub, ctlSub := e.front, e.admin, e.sub, e.ctlSub
		e.front, e.admin, e.sub, e.ctlSub = nil, nil, nil, nil
		e.ctl.Unlock()
		for _, s := range []*nats.Subscription{sub, ctlSub} {
			if s != nil {
				_ = s.Unsubscribe()
			}
		}
		for _, srv := range []*http.Server{front, admin} {
			if srv == nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = srv.Shutdown(ctx)
			cancel()
			_ = srv.Close()
		}
		e.cancelBase()
		e.wg.Wait()
		if e.kvPub != nil {
			_ = e.kvPub.Close()
		}
		e.log.Info().Msg("engine simulator stopped")
	})
	return nil
}

// KVEndpoint returns the bound endpoints of the KV event PUB and replay
// sockets once started, empty without Options.KVEvents.
func (e *Engine) KVEndpoint() (pub, replay string) {
	e.ctl.Lock()
	defer e.ctl.Unlock()
	if e.kvPub == nil {
		return "", ""
	}
	return e.kvPub.Endpoint(), e.kvPub.ReplayEndpoint()
}

// URL returns the HTTP base URL, such as http://127.0.0.1:41234, once started.
func (e *Engine) URL() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.httpURL
}

// AdminURL returns the base URL of the separate admin listener, or "" without Options.AdminListen.
func (e *Engine) AdminURL() string {
	e.ctl.Lock()
	defer e.ctl.Unlock()
	return e.adminURL
}

// servedName is the name the engine answers to in requests.
func (o *Options) servedName() string {
	if o.ServedModel != "" {
		return o.ServedModel
	}
	return o.Model
}

// InferSubject returns the NATS inference subject, or "" without a NATS connection.
func (e *Engine) InferSubject() string { return e.inferSubject }

// Name returns the engine's name.
func (e *Engine) Name() string { return e.opts.Name }

// Options returns the engine's options with defaults applied.
func (e *Engine) Options() Options { return e.opts }

// Capacity returns the sustainable request rate, req/s, under the current failure injection.
func (e *Engine) Capacity() float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return capacity(e.opts, e.failure.factor())
}

// Failure returns the failure injection in force.
func (e *Engine) Failure() Failure {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.failure
}

// SetFailure replaces the failure injection. Setting Crashed crashes the engine
// at once; clearing it on a crashed engine brings the listener (same address)
// and the NATS subscription back. CrashAfter counts from this call.
func (e *Engine) SetFailure(f Failure) error {
	if err := f.validate(); err != nil {
		return err
	}
	e.ctl.Lock()
	defer e.ctl.Unlock()
	if e.closed {
		return ErrClosed
	}
	e.mu.Lock()
	was := e.failure.Crashed
	e.failure, e.sinceSet = f, 0
	if f.Crashed && !was {
		e.abortAllLocked()
	}
	e.mu.Unlock()
	e.pokeScheduler()
	e.log.Info().Float64("error_rate", f.ErrorRate).Float64("added_latency_ms", f.AddedLatencyMs).
		Bool("hang", f.Hang).Int("crash_after", f.CrashAfter).Bool("crashed", f.Crashed).
		Float64("capacity_factor", f.factor()).Float64("ttft_factor", f.TTFTFactor).Bool("silent", f.Silent).Msg("failure injection set")
	if !e.started {
		return nil
	}
	switch {
	case f.Crashed && !was:
		e.stopServingLocked()
	case !f.Crashed && was:
		if err := e.startServingLocked(); err != nil {
			e.mu.Lock()
			e.failure.Crashed = true
			e.mu.Unlock()
			return err
		}
		e.log.Info().Msg("engine recovered from crash")
	}
	return nil
}

// crash is what CrashAfter triggers.
func (e *Engine) crash() {
	e.ctl.Lock()
	defer e.ctl.Unlock()
	e.mu.Lock()
	if e.closing || e.failure.Crashed {
		e.mu.Unlock()
		return
	}
	e.failure.Crashed = true
	e.abortAllLocked()
	e.mu.Unlock()
	e.log.Warn().Msg("engine crashed (failure injection)")
	if e.started && !e.closed {
		e.stopServingLocked()
	}
}

// startServingLocked listens on the engine's address and subscribes on NATS; e.ctl is held.
func (e *Engine) startServingLocked() error {
	l, err := net.Listen("tcp", e.addr)
	// After a crash the old listener's socket is closed by the goroutine
	// blocked in its Accept, a moment after Close returned: on a busy
	// machine the address can still be in use for a while.
	for wait := time.Now().Add(relistenWait); errors.Is(err, syscall.EADDRINUSE) && time.Now().Before(wait); {
		time.Sleep(5 * time.Millisecond)
		l, err = net.Listen("tcp", e.addr)
	}
	if err != nil {
		return fmt.Errorf("enginesim: engine %s: listen on %s: %w", e.opts.Name, e.addr, err)
	}
	e.addr = l.Addr().String()
	if e.opts.Conn != nil {
		handle := func(m *nats.Msg) {
			e.mu.Lock()
			if e.closing {
				e.mu.Unlock()
				return
			}
			e.wg.Add(1)
			e.mu.Unlock()
			go func() {
				defer e.wg.Done()
				e.serveNATS(m)
			}()
		}
		var sub *nats.Subscription
		if e.opts.NATSQueue != "" {
			sub, err = e.opts.Conn.QueueSubscribe(e.inferSubject, e.opts.NATSQueue, handle)
		} else {
			sub, err = e.opts.Conn.Subscribe(e.inferSubject, handle)
		}
		if err == nil {
			err = e.opts.Conn.Flush()
		}
		if err != nil {
			_ = l.Close()
			if sub != nil {
				_ = sub.Unsubscribe()
			}
			return fmt.Errorf("enginesim: engine %s: subscribe to %s: %w", e.opts.Name, e.inferSubject, err)
		}
		e.sub = sub
	}
	e.front = e.serve(l, e.handler)
	return nil
}

// stopServingLocked closes the listener and every connection, and drops the
// NATS subscription, as a crashed process would; e.ctl is held.
func (e *Engine) stopServingLocked() {
	if e.sub != nil {
		_ = e.sub.Unsubscribe()
		e.sub = nil
		// Make sure the server has dropped the interest before returning, so
		// requesters see "no responders" at once.
		_ = e.opts.Conn.FlushTimeout(500 * time.Millisecond)
	}
	if e.front != nil {
		_ = e.front.Close()
		e.front = nil
	}
}

func (e *Engine) serve(l net.Listener, h http.Handler) *http.Server {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			e.log.Error().Err(err).Str("addr", l.Addr().String()).Msg("http serve failed")
		}
	}()
	return srv
}

// relistenWait bounds how long an engine recovering from a crash retries
// listening on its address while the old socket is still being closed.
const relistenWait = 2 * time.Second

// verdict is what failure injection decides for an arriving request.
type verdict int

const (
	proceed verdict = iota
	crashNow
	hang
	injectError
	closingDown
)

// arrive counts an arriving inference request and applies failure injection.
func (e *Engine) arrive() (v verdict, delay time.Duration, at time.Time) {
	at = time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stats.arrived()
	f := e.failure
	switch {
	case e.closing:
		return closingDown, 0, at
	case f.Crashed:
		return crashNow, 0, at
	}
	e.sinceSet++
	switch {
	case f.CrashAfter > 0 && e.sinceSet > f.CrashAfter:
		return crashNow, 0, at
	case f.Hang:
		return hang, 0, at
	case f.ErrorRate > 0 && e.rng.Float64() < f.ErrorRate:
		e.stats.failed()
		return injectError, 0, at
	}
	return proceed, time.Duration(f.AddedLatencyMs * float64(time.Millisecond)), at
}

// admit applies failure injection to j and queues it. The error is an
// *apiError to answer with, errCrashed (answer nothing: the connection is
// gone), or the context's error (the client gave up).
func (e *Engine) admit(ctx context.Context, j *job) (*request, error) {
	v, delay, at := e.arrive()
	switch v {
	case closingDown:
		return nil, errUnavailable("engine " + e.opts.Name + " is shutting down")
	case crashNow:
		e.crash()
		e.metrics.requests.WithLabelValues("crashed").Inc()
		return nil, errCrashed
	case hang:
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-e.quit:
			return nil, errCrashed
		}
	case injectError:
		e.metrics.requests.WithLabelValues("error").Inc()
		return nil, &apiError{Status: 500, Type: "server_error", Code: "engine_error", Message: "injected failure (error_rate) in engine " + e.opts.Name}
	}
	if j.err != nil {
		e.mu.Lock()
		e.stats.failed()
		e.mu.Unlock()
		e.metrics.requests.WithLabelValues("error").Inc()
		return nil, j.err
	}
	if k := e.Failure().TTFTFactor; k > 1 {
		idle := e.opts.cost().PrefillMs(j.prompt) * e.opts.TimeScale / e.Failure().factor()
		delay += time.Duration((k - 1) * idle * float64(time.Millisecond))
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-e.quit:
			t.Stop()
			return nil, errUnavailable("engine " + e.opts.Name + " is shutting down")
		}
	}
	if need := j.prompt + j.maxOut; need > e.opts.KVTokens {
		e.mu.Lock()
		e.stats.failed()
		e.mu.Unlock()
		return nil, &apiError{Status: 400, Type: "invalid_request_error", Code: "context_length_exceeded",
			Message: fmt.Sprintf("prompt (%d tokens) plus max output (%d tokens) exceed the KV cache of %d tokens", j.prompt, j.maxOut, e.opts.KVTokens)}
	}
	r := newRequest(j.prompt, j.maxOut, at)
	if e.kv != nil {
		r.cached = min(j.prompt, e.kv.observe(j.tokens))
	}
	if err := e.submit(r); err != nil {
		if errors.Is(err, errClosing) {
			return nil, errUnavailable("engine " + e.opts.Name + " is shutting down")
		}
		return nil, err
	}
	return r, nil
}

// outcome records how a request ended in the requests metric.
func (e *Engine) outcome(err error) {
	switch {
	case err == nil:
		e.metrics.requests.WithLabelValues("ok").Inc()
	case errors.Is(err, errCrashed):
		e.metrics.requests.WithLabelValues("crashed").Inc()
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		e.metrics.requests.WithLabelValues("cancelled").Inc()
	default:
		e.metrics.requests.WithLabelValues("error").Inc()
	}
}
