// Package poison is how Switchyard's services treat input they cannot use —
// a message from the bus, a value from a bucket — so that no single one can
// take a process down or flood its log: handlers defer Guard.Recover, which
// turns a panic into a counted, logged, terminated message; bad input is
// logged through Guard.Log, at a bounded rate per source and in total, with a
// periodic line counting what was not logged; Reason names the label a
// service counts bad input under.
package poison

import (
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/switchyard-dev/switchyard/internal/logthrottle"
	"github.com/switchyard-dev/switchyard/messages"
)

// Reasons under which bad input is counted.
const (
	ReasonDecode   = "decode"
	ReasonVersion  = "version"
	ReasonTooLarge = "too_large"
	ReasonKind     = "kind"
	ReasonInvalid  = "invalid"
	ReasonPanic    = "panic"
	// ReasonSubject: a valid message whose names (model, engine, cluster,
	// router) disagree with the subject it came on. With the bus's
	// permissions the subject is the sender's identity, so this is a
	// forgery or a misconfigured publisher.
	ReasonSubject = "subject"
	// ReasonFuture: dated (or a generation) further ahead than a writer's
	// clock can be (messages.ErrFuture).
	ReasonFuture = "future"
	// ReasonExpired: older than messages.MaxMessageAge (messages.ErrExpired).
	ReasonExpired = "expired"
)

// Reason returns the metric label for err, a decode or validation error of
// package messages: the most specific sentinel it wraps, else "invalid".
func Reason(err error) string {
	switch {
	case errors.Is(err, messages.ErrDecode):
		return ReasonDecode
	case errors.Is(err, messages.ErrVersion):
		return ReasonVersion
	case errors.Is(err, messages.ErrTooLarge):
		return ReasonTooLarge
	case errors.Is(err, messages.ErrKind):
		return ReasonKind
	case errors.Is(err, messages.ErrFuture):
		return ReasonFuture
	case errors.Is(err, messages.ErrExpired):
		return ReasonExpired
	}
	return ReasonInvalid
}

// maxStack bounds the stack logged with a panic: the frames nearest the
// panic are the useful ones, and a deep recursion must not make one log
// line megabytes long.
const maxStack = 16 << 10

// Options configures a Guard.
type Options struct {
	// Component names the metrics: switchyard_<Component>_handler_panics_total.
	// Required; a NATS-token-like word ("router", "aggregator").
	Component string
	// Logger receives the lines; the caller adds its component field.
	Logger zerolog.Logger
	// Registerer, when set, receives the panic counter. Several guards of one
	// component may share a registerer: they share the counter.
	Registerer prometheus.Registerer
	// Throttle bounds the log lines (zero fields take logthrottle's defaults).
	Throttle logthrottle.Options
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// ErrOptions is wrapped by New for invalid options.
var ErrOptions = errors.New("poison: invalid options")

// Guard recovers handler panics and throttles the logging of bad input for
// one component. It is safe for concurrent use.
type Guard struct {
	log      zerolog.Logger
	now      func() time.Time
	throttle *logthrottle.Throttle
	// panicLog has a budget of its own, so that a flood of bad input cannot
	// hide a panic's line.
	panicLog *logthrottle.Throttle
	panics   *prometheus.CounterVec
}

// New returns a Guard for opts.
func New(opts Options) (*Guard, error) {
	if !messages.ValidName(opts.Component) {
		return nil, fmt.Errorf("%w: component %q is not a valid name", ErrOptions, opts.Component)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	panics := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "switchyard_" + opts.Component + "_handler_panics_total",
		Help: "Panics recovered in message and value handlers; the input that caused each was dropped (terminated on JetStream).",
	}, []string{"handler"})
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(panics); err != nil {
			are, ok := err.(prometheus.AlreadyRegisteredError)
			if !ok {
				return nil, fmt.Errorf("poison: register %s panic counter: %w", opts.Component, err)
			}
			existing, ok := are.ExistingCollector.(*prometheus.CounterVec)
			if !ok {
				return nil, fmt.Errorf("poison: register %s panic counter: %w", opts.Component, err)
			}
			panics = existing
		}
	}
	return &Guard{
		log:      opts.Logger,
		now:      opts.Now,
		throttle: logthrottle.NewWithOptions(opts.Throttle),
		panicLog: logthrottle.NewWithOptions(opts.Throttle),
		panics:   panics,
	}, nil
}

// Recover, deferred at the top of a handler, recovers a panic of the
// handler: it counts it under handler, logs it with the subject and the
// stack (rate-bounded per subject and in total, on a budget apart from bad
// input's), and then calls drop, if not nil, to
// dispose of the input (for a JetStream message, terminate it). Without a
// panic it does nothing. It must be deferred directly:
//
//	defer g.Recover("signals", m.Subject, func() { _ = m.Term() })
func (g *Guard) Recover(handler, subject string, drop func()) {
	p := recover()
	if p == nil {
		return
	}
	g.panics.WithLabelValues(handler).Inc()
	now := g.now()
	allowed := g.panicLog.Allow(handler+"/"+subject, now)
	g.flush(g.panicLog, "panics", now)
	if allowed {
		ev := g.log.Error()
		stack := debug.Stack()
		if len(stack) > maxStack {
			stack = stack[:maxStack]
		}
		ev.Str("handler", handler).Str("subject", subject).Str("panic", fmt.Sprint(p)).
			Bytes("stack", stack).Msg("handler panicked; input dropped, process continues")
	}
	if drop != nil {
		// drop itself must not take the process down either.
		defer func() {
			if p := recover(); p != nil {
				g.log.Error().Str("handler", handler).Str("subject", subject).Str("panic", fmt.Sprint(p)).
					Msg("dropping the input after a panic panicked too")
			}
		}()
		drop()
	}
}

// Log returns a warning event for bad input from source when the throttle
// allows one now, else nil (zerolog's methods on a nil event do nothing, so
// a caller may chain on the result unconditionally). When an interval with
// throttled lines has ended, it first logs the summary of what was dropped.
func (g *Guard) Log(source string) *zerolog.Event {
	now := g.now()
	allowed := g.throttle.Allow(source, now)
	g.flush(g.throttle, "bad input", now)
	if !allowed {
		return nil
	}
	return g.log.Warn()
}

// Flush logs the summary of throttled lines if an interval with drops has
// ended. Log calls it; a service with a periodic loop may call it too, so
// that the summary of the end of a burst appears without further input.
func (g *Guard) Flush() {
	now := g.now()
	g.flush(g.throttle, "bad input", now)
	g.flush(g.panicLog, "panics", now)
}

func (g *Guard) flush(th *logthrottle.Throttle, what string, now time.Time) {
	s, ok := th.Summary(now)
	if !ok {
		return
	}
	g.log.Warn().Int("dropped", s.Dropped).Int("sources", s.Sources).Bool("sources_capped", s.SourcesCapped).
		Time("since", s.Start).Dur("interval", th.Interval()).Str("about", what).
		Msgf("dropped %d log lines for %d sources in the last interval (%s, rate-limited)", s.Dropped, s.Sources, what)
}
