package dashboard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/internal/poison"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/streams"
)

// Defaults for Options.
const (
	// DefaultHistory is how far back the history reaches when
	// Options.History is zero.
	DefaultHistory = 5 * time.Minute
	// DefaultSampleInterval is the history's resolution when
	// Options.SampleInterval is zero.
	DefaultSampleInterval = time.Second
)

// RouterStatus is one router's view of one model: the snapshot generation it
// routes on, the snapshot's age and the routing mode.
type RouterStatus struct {
	// Cluster is the router's frontend cluster.
	Cluster string `json:"cluster"`
	// Router is the router's name.
	Router string `json:"router"`
	// Model is the model; empty when the router serves no model yet.
	Model string `json:"model,omitempty"`
	// Generation is the generation of the installed snapshot (0: none).
	Generation uint64 `json:"generation"`
	// AgeSeconds is the installed snapshot's age, seconds; negative when
	// unknown (no snapshot yet).
	AgeSeconds float64 `json:"age_s"`
	// Mode is "snapshot" or "local-policy" (see control.Mode).
	Mode string `json:"mode"`
}

// Options configures New. Conn is required.
type Options struct {
	// Conn is the NATS connection; the caller owns it.
	Conn *nats.Conn
	// Names is the NATS layout (default streams.DefaultNames()).
	Names streams.Names
	// Logger receives the dashboard's logs (component=dashboard is added).
	Logger zerolog.Logger
	// History is how far back /api/history reaches (default DefaultHistory).
	History time.Duration
	// SampleInterval is the time between history samples (default
	// DefaultSampleInterval).
	SampleInterval time.Duration
	// Routers, when set, is called on every /api/state request for the
	// status of the routers running in this process (see RouterStatuses).
	// It must be safe for concurrent use and cheap.
	Routers func() []RouterStatus
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Registerer, when set, receives the dashboard's metrics (values
	// ignored, handler panics, every engine's state).
	Registerer prometheus.Registerer
}

// Dashboard keeps the control plane's current state and recent history and
// serves them, with the page, through Handler. Create it with New, run it
// with Run.
type Dashboard struct {
	opts Options
	log  zerolog.Logger

	mu      sync.Mutex
	weights map[string]*messages.WeightSnapshot // by sy_weights key
	engines map[string]*messages.EngineState    // by sy_engines key
	// penalties and operators are the other records of sy_engines, by
	// model.engine and by engine.
	penalties map[string]*messages.Penalty
	operators map[string]*messages.Operator
	demand    map[string]*messages.DemandState // by sy_demand key
	watching  map[string]bool                  // by bucket
	ring      []Sample
	next      int // index the next sample goes to
	full      bool

	poison *poison.Guard
	bad    *prometheus.CounterVec
}

// ErrOptions is wrapped by every error of Validate and of New for invalid options.
var ErrOptions = errors.New("dashboard: invalid options")

// maxSamples bounds the history ring (History / SampleInterval), so that
// its memory stays a few MB.
const maxSamples = 100_000

// WithDefaults returns a copy of o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	if o.Names == (streams.Names{}) {
		o.Names = streams.DefaultNames()
	}
	if o.History == 0 {
		o.History = DefaultHistory
	}
	if o.SampleInterval == 0 {
		o.SampleInterval = DefaultSampleInterval
	}
	if o.Now == nil {
		o.Now = time.Now
	}
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
	if o.History < 0 {
		return fmt.Errorf("%w: History is %s, want > 0", ErrOptions, o.History)
	}
	if o.SampleInterval < 0 {
		return fmt.Errorf("%w: SampleInterval is %s, want > 0", ErrOptions, o.SampleInterval)
	}
	n := int(o.History / o.SampleInterval)
	if n < 2 {
		return fmt.Errorf("%w: History %s holds fewer than two samples of SampleInterval %s", ErrOptions, o.History, o.SampleInterval)
	}
	if n > maxSamples {
		return fmt.Errorf("%w: History %s holds more than %d samples of SampleInterval %s", ErrOptions, o.History, maxSamples, o.SampleInterval)
	}
	return nil
}

// New applies defaults to opts, validates them and returns a dashboard;
// Run starts watching.
func New(opts Options) (*Dashboard, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Conn == nil {
		return nil, fmt.Errorf("%w: Conn is nil, want a NATS connection", ErrOptions)
	}
	n := int(opts.History / opts.SampleInterval)
	log := opts.Logger.With().Str("component", "dashboard").Logger()
	guard, err := poison.New(poison.Options{Component: "dashboard", Logger: log, Registerer: opts.Registerer, Now: opts.Now})
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	bad := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "switchyard_dashboard_bad_values_total",
		Help: "Bucket values that failed to decode or validate (or whose handling panicked), ignored, by bucket and reason.",
	}, []string{"bucket", "reason"})
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(bad); err != nil {
			return nil, fmt.Errorf("dashboard: register metrics: %w", err)
		}
	}
	d := &Dashboard{
		opts:      opts,
		log:       log,
		poison:    guard,
		bad:       bad,
		weights:   map[string]*messages.WeightSnapshot{},
		engines:   map[string]*messages.EngineState{},
		penalties: map[string]*messages.Penalty{},
		operators: map[string]*messages.Operator{},
		demand:    map[string]*messages.DemandState{},
		watching:  map[string]bool{},
		ring:      make([]Sample, n),
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(newStateCollector(d)); err != nil {
			return nil, fmt.Errorf("dashboard: register metrics: %w", err)
		}
	}
	return d, nil
}

// Run watches the weights, engines and demand buckets and samples the
// history until ctx ends; it returns nil then. Watchers that fail are
// re-created with backoff, so Run does not return on NATS trouble.
func (d *Dashboard) Run(ctx context.Context) error {
	js, err := jetstream.New(d.opts.Conn)
	if err != nil {
		return fmt.Errorf("dashboard: %w", err)
	}
	var wg sync.WaitGroup
	for _, b := range []string{d.opts.Names.WeightsBucket, d.opts.Names.EnginesBucket, d.opts.Names.DemandBucket} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.watch(ctx, js, b)
		}()
	}
	d.sample()
	tick := time.NewTicker(d.opts.SampleInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return nil
		case <-tick.C:
			d.sample()
			d.poison.Flush()
		}
	}
}

// watch keeps the view of bucket current until ctx ends (streams.BucketWatch
// re-creates its watcher after NATS trouble).
func (d *Dashboard) watch(ctx context.Context, js jetstream.JetStream, bucket string) {
	w := &streams.BucketWatch{
		Conn: d.opts.Conn, JS: js, Bucket: bucket, Logger: d.log,
		Entry: func(e jetstream.KeyValueEntry) { d.apply(bucket, e) },
		Current: func(seen map[string]bool) {
			d.sweep(bucket, seen)
			d.setWatching(bucket, true)
		},
		Down:       func(error) { d.setWatching(bucket, false) },
		MinBackoff: 100 * time.Millisecond, MaxBackoff: 5 * time.Second,
	}
	if err := w.Run(ctx); err != nil {
		d.log.Error().Err(err).Msg("cannot watch")
	}
}

func (d *Dashboard) setWatching(bucket string, on bool) {
	d.mu.Lock()
	d.watching[bucket] = on
	d.mu.Unlock()
}

// sweep drops the keys of bucket a new watcher did not deliver: they were
// deleted while no watcher was running.
func (d *Dashboard) sweep(bucket string, seen map[string]bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch bucket {
	case d.opts.Names.WeightsBucket:
		sweepMap(d.weights, seen)
	case d.opts.Names.EnginesBucket:
		sweepMap(d.engines, seen)
		sweepRecords(d.penalties, seen, func(k string) string { return streams.PenaltyPrefix + k })
		sweepRecords(d.operators, seen, func(k string) string { return streams.OperatorPrefix + k })
	case d.opts.Names.DemandBucket:
		sweepMap(d.demand, seen)
	}
}

func sweepMap[V any](m map[string]V, seen map[string]bool) {
	for k := range m {
		if !seen[k] {
			delete(m, k)
		}
	}
}

// keep stores in m under key the message data holds, or deletes the key
// when del. A value that fails to decode leaves m as it was.
func keep[T any, P interface {
	*T
	messages.Message
}](m map[string]P, key string, del bool, data []byte, now time.Time) error {
	if del {
		delete(m, key)
		return nil
	}
	v := P(new(T))
	if err := messages.DecodeIntoAt(data, v, now); err != nil {
		return err
	}
	m[key] = v
	return nil
}

// sweepRecords is sweepMap for maps not keyed by the bucket key: key
// gives a map key's bucket key.
func sweepRecords[V any](m map[string]V, seen map[string]bool, key func(string) string) {
	for k := range m {
		if !seen[key(k)] {
			delete(m, k)
		}
	}
}

// apply folds one watcher entry into the state. A value that fails to
// decode is counted and skipped (the key keeps its previous value), and a
// panic on one is recovered: the dashboard must show the rest.
func (d *Dashboard) apply(bucket string, e jetstream.KeyValueEntry) {
	defer d.poison.Recover(bucket, bucket+"/"+e.Key(), func() { d.bad.WithLabelValues(bucket, poison.ReasonPanic).Inc() })
	key := e.Key()
	del := e.Operation() != jetstream.KeyValuePut
	now := d.opts.Now()
	var err error
	d.mu.Lock()
	defer d.mu.Unlock()
	data := e.Value()
	switch bucket {
	case d.opts.Names.WeightsBucket:
		err = keep(d.weights, key, del, data, now)
	case d.opts.Names.EnginesBucket:
		// sy_engines also holds penalty and operator records, told apart by
		// their key prefix; they go into the engines' states.
		if rest, ok := strings.CutPrefix(key, streams.PenaltyPrefix); ok {
			err = keep(d.penalties, rest, del, data, now)
			break
		}
		if rest, ok := strings.CutPrefix(key, streams.OperatorPrefix); ok {
			err = keep(d.operators, rest, del, data, now)
			break
		}
		if _, kind, perr := messages.Peek(data); !del && perr == nil && kind != messages.KindEngineState {
			return
		}
		err = keep(d.engines, key, del, data, now)
	case d.opts.Names.DemandBucket:
		if strings.HasPrefix(key, streams.RTTPrefix) {
			return
		}
		err = keep(d.demand, key, del, data, now)
	}
	if err != nil {
		// Keep the previous value of the key, if any, and say so at a
		// bounded rate.
		reason := poison.Reason(err)
		d.bad.WithLabelValues(bucket, reason).Inc()
		d.poison.Log(bucket+"/"+key).Err(err).Str("bucket", bucket).Str("key", key).Str("reason", reason).Msg("value ignored")
	}
}
