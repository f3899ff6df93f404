package control

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/internal/poison"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/guard"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/streams"
)

// DefaultStaleAfter is the age past which a snapshot is stale and the
// router falls back to its local policy, when StoreOptions.StaleAfter is
// zero.
const DefaultStaleAfter = 30 * time.Second

// StoreOptions configures NewSnapshotStore. Conn and Cluster are required.
type StoreOptions struct {
	// Conn is the NATS connection; the caller owns it.
	Conn *nats.Conn
	// Names is the NATS layout (default streams.DefaultNames()).
	Names streams.Names
	// Cluster is the router's frontend cluster: the store watches the
	// sy_weights keys *.<cluster>.
	Cluster string
	// StaleAfter is the snapshot age past which the local policy takes over
	// (default DefaultStaleAfter).
	StaleAfter time.Duration
	// Signals gives live engine signals: endpoints for the tables, down
	// marks, and the local policy's input. Nil disables the local policy.
	Signals *Signals
	// Guard, when set, is called on every refresh with each engine of each
	// installed table and whether it is down by its signals (an engine
	// with no endpoint is the handler's to pass over, see
	// Bound.Reachable). It is idempotent; the service wires it to the
	// handler's LiveSet.
	Guard func(model, engine string, down bool)
	// Table tunes the selection tables built (default: TableOptions{}).
	Table selection.TableOptions
	// RefreshInterval is how often staleness and the local policy are
	// re-evaluated (default 250 ms).
	RefreshInterval time.Duration
	// MaxBackoff bounds the pause between attempts to (re)create the
	// weights watcher (default 5 s; the first pause is 100 ms).
	MaxBackoff time.Duration
	// Logger receives the store's logs (component=router and cluster are added).
	Logger zerolog.Logger
	// Registry, when set, receives the store's metrics. The per-model
	// snapshot age, generation and switchyard_router_local_policy gauges are
	// exported by the Handler from Table's Info.
	Registry prometheus.Registerer
	// Now is the clock (default time.Now).
	Now func() time.Time
	// OnValue, when set, is called with the key and bytes of every value
	// the weights watcher delivers, before it is decoded, inside the
	// handler's panic recovery; it must not keep data. For inspection and
	// tests (a handler that panics on a chosen value).
	OnValue func(key string, data []byte)
}

// tableEntry is one model's published table.
type tableEntry struct {
	table *selection.Table
	info  Info
}

// storeView is an immutable view of every model's table, swapped atomically.
type storeView struct {
	tables map[string]tableEntry
	models []string
}

// storeModel is the store's writer-side state of one model.
type storeModel struct {
	snap       *messages.WeightSnapshot // newest installed snapshot, nil when none
	snapTable  *selection.Table
	figures    *guard.Figures
	local      *selection.Table
	localW     map[string]float64
	localVer   uint64 // Signals.Version the local table was computed at
	mode       Mode
	modeLogged bool
}

// SnapshotStore holds the newest weight snapshot of every model for the
// router's frontend cluster and implements Tables. Run watches the weights
// bucket and keeps the tables current; Table is an atomic load and a map
// lookup and never waits on NATS.
//
// A model routes by its snapshot while the snapshot is at most StaleAfter
// old. With no snapshot, or a stale one, it routes by the local policy:
// engines that live signals show healthy (health > 0 and not down), weighted
// by their capacity_rps (equally when none reports a capacity). With no
// healthy engine known, a stale snapshot's table is kept. Info.Mode says
// which, and every mode change is logged once.
type SnapshotStore struct {
	opts StoreOptions
	log  zerolog.Logger

	view atomic.Pointer[storeView]

	mu     sync.Mutex // serialises writers
	models map[string]*storeModel

	installed *prometheus.CounterVec
	rejected  *prometheus.CounterVec
	restarts  prometheus.Counter
	watching  atomic.Bool
	poison    *poison.Guard
	caught    atomic.Bool // the stored snapshots were delivered once (CaughtUp)
	failed    atomic.Bool // a watch attempt failed before catching up (WatchFailed)
	routing   atomic.Bool // StartRouting was called
}

// Rejection reasons counted in switchyard_router_snapshots_rejected_total.
const (
	rejectDecode = "decode"
	rejectKey    = "key"
	rejectOld    = "old_generation"
	rejectTable  = "table"
	// rejectStale: older than StaleAfter on arrival, while the installed
	// snapshot is fresh.
	rejectStale = "stale"
	// rejectFuture: a time more than messages.MaxFutureSkew ahead, or a
	// generation above messages.GenerationCeiling.
	rejectFuture = "future"
	rejectPanic  = poison.ReasonPanic
)

// NewSnapshotStore returns a store for opts; Run starts watching.
func NewSnapshotStore(opts StoreOptions) (*SnapshotStore, error) {
	if opts.Conn == nil {
		return nil, errors.New("router: new snapshot store: StoreOptions.Conn is nil")
	}
	if err := messages.CheckName("cluster", opts.Cluster); err != nil {
		return nil, fmt.Errorf("router: new snapshot store: %w", err)
	}
	if opts.Names.Prefix == "" {
		opts.Names = streams.DefaultNames()
	}
	if opts.StaleAfter <= 0 {
		opts.StaleAfter = DefaultStaleAfter
	}
	if opts.RefreshInterval <= 0 {
		opts.RefreshInterval = 250 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 5 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	log := opts.Logger.With().Str("component", "router").Str("cluster", opts.Cluster).Logger()
	guard, err := poison.New(poison.Options{Component: "router", Logger: log, Registerer: opts.Registry, Now: opts.Now})
	if err != nil {
		return nil, fmt.Errorf("router: new snapshot store: %w", err)
	}
	s := &SnapshotStore{
		opts:   opts,
		log:    log,
		poison: guard,
		models: make(map[string]*storeModel),
		installed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_router_snapshots_installed_total",
			Help: "Weight snapshots installed, by model.",
		}, []string{"model"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_router_snapshots_rejected_total",
			Help: "Weight snapshot updates not installed, by reason (decode, key, old_generation, table, future, stale, panic).",
		}, []string{"reason"}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_router_weights_watch_restarts_total",
			Help: "Times the weights bucket watcher was re-created after an error, a closure or a reconnect.",
		}),
	}
	s.view.Store(&storeView{tables: map[string]tableEntry{}})
	if opts.Registry != nil {
		for _, c := range []prometheus.Collector{s.installed, s.rejected, s.restarts} {
			if err := opts.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("router: new snapshot store: register metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Table returns the table of model, its info and whether model is served.
func (s *SnapshotStore) Table(model string) (*selection.Table, Info, bool) {
	e, ok := s.view.Load().tables[model]
	return e.table, e.info, ok
}

// Models returns the served models, sorted.
func (s *SnapshotStore) Models() []string { return s.view.Load().models }

// Watching reports whether the weights watcher is currently established.
func (s *SnapshotStore) Watching() bool { return s.watching.Load() }

// CaughtUp reports whether the watcher has delivered, at least once, every
// snapshot the bucket held for the cluster when it was created: from then
// on PlannedEngines names every engine the stored snapshots plan for.
func (s *SnapshotStore) CaughtUp() bool { return s.caught.Load() }

// StartRouting tells the store that the router routes from now on (the
// service calls it once it has heard from the engines). From then on a
// fresh snapshot none of whose planned engines has an address gives way to
// the local policy; before, while the engines' first signals are still
// arriving, the snapshot is kept as it is.
func (s *SnapshotStore) StartRouting() {
	s.routing.Store(true)
	s.Refresh()
}

// WatchFailed reports whether an attempt to watch the weights bucket
// failed or ended before the store caught up (the bucket missing, or the
// router not allowed to read it, or NATS unreachable).
func (s *SnapshotStore) WatchFailed() bool { return s.failed.Load() }

// PlannedEngines calls fn with every engine of positive weight in the
// newest installed snapshot of each model, fresh or stale, until fn
// returns false.
func (s *SnapshotStore) PlannedEngines(fn func(model, engine string) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for model, m := range s.models {
		if m.snap == nil {
			continue
		}
		for engine, w := range m.snap.Weights {
			if w > 0 && !fn(model, engine) {
				return
			}
		}
	}
}

// Run watches the weights bucket and re-evaluates staleness and the local
// policy every RefreshInterval until ctx ends. The watcher is re-created,
// with backoff, whenever it fails or closes and after every NATS reconnect,
// so that watching resumes without a restart.
func (s *SnapshotStore) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.watchLoop(ctx)
	}()
	s.Refresh()
	tick := time.NewTicker(s.opts.RefreshInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return nil
		case <-tick.C:
			s.Refresh()
			s.poison.Flush()
		}
	}
}

var errWatchClosed = errors.New("weights watcher closed")
var errReconnected = errors.New("NATS reconnected")

func (s *SnapshotStore) watchLoop(ctx context.Context) {
	const minBackoff = 100 * time.Millisecond
	backoff := minBackoff
	for {
		start := time.Now()
		err := s.watchOnce(ctx)
		s.watching.Store(false)
		if ctx.Err() != nil {
			return
		}
		if !s.caught.Load() {
			s.failed.Store(true)
		}
		s.restarts.Inc()
		if time.Since(start) > 10*time.Second {
			backoff = minBackoff
		}
		ev := s.log.Warn()
		if errors.Is(err, errReconnected) {
			ev = s.log.Info()
			backoff = minBackoff
		}
		ev.Err(err).Dur("retry_in", backoff).Msg("weights watch interrupted; re-creating")
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(backoff*2, s.opts.MaxBackoff)
	}
}

// watchOnce establishes one watcher and feeds it into the store until it
// fails, closes, NATS reconnects, or ctx ends.
func (s *SnapshotStore) watchOnce(ctx context.Context) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reconnects := s.opts.Conn.Stats().Reconnects
	js, err := jetstream.New(s.opts.Conn)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	// An ordered consumer on the bucket's stream rather than kv.Watch: with a
	// short idle heartbeat it notices within about a second when the server
	// holding it goes away (a cluster node stopping while this router's own
	// connection stays up) and re-creates itself, where kv.Watch stays silent
	// for 10 s or more.
	bucket := s.opts.Names.WeightsBucket
	prefix := "$KV." + bucket + "."
	lctx, lcancel := context.WithTimeout(wctx, 5*time.Second)
	cons, err := js.OrderedConsumer(lctx, "KV_"+bucket, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{prefix + "*." + s.opts.Cluster},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	lcancel()
	if err != nil {
		return fmt.Errorf("watch %s *.%s: %w", bucket, s.opts.Cluster, err)
	}
	// The bucket's creation time tells a re-created bucket (deleted, then
	// provisioned again by a service's layout keeper) from this one: its
	// sequences start again, below where this consumer waits.
	var created time.Time
	if st, err := js.Stream(wctx, streams.BucketStream(bucket)); err == nil {
		created = st.CachedInfo().Created
	}
	closed := make(chan struct{})
	cc, err := cons.Consume(func(m jetstream.Msg) {
		// An ordered consumer does not take acknowledgements: a value this
		// handler panics on is dropped by returning, and the next one served.
		defer s.poison.Recover("weights", m.Subject(), func() { s.rejected.WithLabelValues(rejectPanic).Inc() })
		defer func() {
			if md, err := m.Metadata(); err == nil && md.NumPending == 0 {
				s.caught.Store(true)
			}
		}()
		key := strings.TrimPrefix(m.Subject(), prefix)
		if op := m.Headers().Get("KV-Operation"); op != "" {
			// Logged at a bounded rate: a writer deleting thousands of keys
			// must not flood the log either.
			s.poison.Log("deleted/"+key).Str("key", key).Str("op", op).Msg("weights key deleted; keeping the installed snapshot")
			return
		}
		if s.opts.OnValue != nil {
			s.opts.OnValue(key, m.Data())
		}
		if _, err := s.installBytes(key, m.Data()); err != nil {
			s.log.Debug().Err(err).Str("key", key).Msg("snapshot not installed")
		}
	}, jetstream.PullHeartbeat(500*time.Millisecond), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		s.log.Debug().Err(err).Msg("weights watch")
	}))
	if err != nil {
		return fmt.Errorf("watch %s *.%s: %w", bucket, s.opts.Cluster, err)
	}
	defer cc.Stop()
	if info := cons.CachedInfo(); info != nil && info.NumPending == 0 {
		s.caught.Store(true) // nothing stored for this cluster
	}
	go func() {
		select {
		case <-cc.Closed():
			close(closed)
		case <-wctx.Done():
		}
	}()
	s.watching.Store(true)
	s.log.Debug().Str("bucket", bucket).Msg("watching weight snapshots")
	check := time.NewTicker(200 * time.Millisecond)
	defer check.Stop()
	lastLayout := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-closed:
			return errWatchClosed
		case <-check.C:
			// Re-creating the consumer after every reconnect resumes at once
			// and is cheap: the newest value per key is redelivered and
			// ignored unless newer.
			if s.opts.Conn.Stats().Reconnects != reconnects {
				return errReconnected
			}
			if time.Since(lastLayout) >= streams.DefaultLayoutCheck {
				lastLayout = time.Now()
				lctx, lcancel := context.WithTimeout(wctx, time.Second)
				st, err := js.Stream(lctx, streams.BucketStream(bucket))
				lcancel()
				if errors.Is(err, jetstream.ErrStreamNotFound) || (err == nil && !st.CachedInfo().Created.Equal(created)) {
					return fmt.Errorf("%w: keeping the installed snapshots", streams.ErrBucketReplaced)
				}
			}
		}
	}
}

// errOldGeneration is returned by Install for a snapshot that is not newer
// than the installed one.
var errOldGeneration = errors.New("generation not newer than the installed one")

// installBytes decodes a sy_weights value under key and installs it.
func (s *SnapshotStore) installBytes(key string, data []byte) (bool, error) {
	var snap messages.WeightSnapshot
	if err := messages.DecodeIntoAt(data, &snap, s.opts.Now()); err != nil {
		if errors.Is(err, messages.ErrFuture) {
			s.rejectFuture(key, err)
			return false, err
		}
		s.rejected.WithLabelValues(rejectDecode).Inc()
		s.poison.Log(key).Err(err).Str("key", key).Str("reason", poison.Reason(err)).Int("bytes", len(data)).
			Msg("undecodable weight snapshot ignored")
		return false, err
	}
	model, cluster, ok := streams.SplitKey(key)
	if !ok || model != snap.Model || cluster != snap.Cluster {
		s.rejected.WithLabelValues(rejectKey).Inc()
		err := fmt.Errorf("snapshot for %s/%s stored under key %q", snap.Model, snap.Cluster, key)
		s.poison.Log(key).Err(err).Str("key", key).Msg("misfiled weight snapshot ignored")
		return false, err
	}
	return s.Install(&snap)
}

// Install installs snap when it is for the store's cluster and its
// generation is newer than the installed one for its model, and reports
// whether it did. A snapshot from the future — a time more than
// messages.MaxFutureSkew ahead, or a generation above
// messages.GenerationCeiling — is counted (reason "future"), logged at a
// bounded rate and not installed: the installed snapshot stays, and the
// optimizer's next one is installed as usual. Likewise a snapshot already
// older than StaleAfter is not installed over a fresh one (reason "stale"). Run calls it for every value the watcher delivers; tests
// and single-process setups may call it directly. snap must be valid
// (messages.WeightSnapshot.Validate) and is not modified.
func (s *SnapshotStore) Install(snap *messages.WeightSnapshot) (bool, error) {
	if snap.Cluster != s.opts.Cluster {
		s.rejected.WithLabelValues(rejectKey).Inc()
		return false, fmt.Errorf("snapshot for cluster %q, this router serves %q", snap.Cluster, s.opts.Cluster)
	}
	if err := messages.CheckModelName(snap.Model); err != nil {
		s.rejected.WithLabelValues(rejectKey).Inc()
		return false, err
	}
	now := s.opts.Now()
	if ceiling := messages.GenerationCeiling(now); snap.Generation > ceiling || snap.Time > now.Add(messages.MaxFutureSkew).UnixMilli() {
		err := fmt.Errorf("snapshot %s/%s generation %d of %s: %w (generation ceiling %d, time skew %s)", snap.Model, snap.Cluster,
			snap.Generation, time.UnixMilli(snap.Time).UTC().Format(time.RFC3339Nano), messages.ErrFuture, ceiling, messages.MaxFutureSkew)
		s.rejectFuture(snap.Model+"."+snap.Cluster, err)
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.models[snap.Model]
	if m != nil && m.snap != nil && snap.Generation <= m.snap.Generation {
		s.rejected.WithLabelValues(rejectOld).Inc()
		return false, fmt.Errorf("snapshot %s/%s generation %d: %w (%d)", snap.Model, snap.Cluster, snap.Generation,
			errOldGeneration, m.snap.Generation)
	}
	if m != nil && m.snap != nil && s.staleAt(m.snap, now) == nil && s.staleAt(snap, now) != nil {
		// Already stale on arrival while the installed one is fresh: a
		// past-dated value would only switch the model to the local policy.
		s.rejected.WithLabelValues(rejectStale).Inc()
		return false, fmt.Errorf("snapshot %s/%s generation %d: %w (installed generation %d is fresh)", snap.Model, snap.Cluster,
			snap.Generation, s.staleAt(snap, now), m.snap.Generation)
	}
	t, err := s.buildSnapshotTable(snap)
	if err != nil {
		s.rejected.WithLabelValues(rejectTable).Inc()
		s.poison.Log(snap.Model+"."+snap.Cluster).Err(err).Str("model", snap.Model).Uint64("generation", snap.Generation).
			Msg("snapshot table not built")
		return false, err
	}
	if m == nil {
		m = &storeModel{}
		s.models[snap.Model] = m
	}
	cp := *snap
	m.snap, m.snapTable, m.figures = &cp, t, guard.FiguresOf(&cp)
	s.installed.WithLabelValues(snap.Model).Inc()
	s.log.Debug().Str("model", snap.Model).Uint64("generation", snap.Generation).Int("engines", len(snap.Weights)).
		Float64("shed", snap.ShedFraction).Msg("weight snapshot installed")
	s.refreshLocked(s.opts.Now(), true)
	return true, nil
}

// staleAt returns an error when snap is older than StaleAfter at now, else nil.
func (s *SnapshotStore) staleAt(snap *messages.WeightSnapshot, now time.Time) error {
	if age := now.Sub(time.UnixMilli(snap.Time)); age > s.opts.StaleAfter {
		return fmt.Errorf("stale on arrival: %s old, stale after %s", age.Round(time.Millisecond), s.opts.StaleAfter)
	}
	return nil
}

// rejectFuture counts and logs (at most once per futureLogInterval per key) a
// snapshot from the future: a time or a generation no honest writer gives it
// (messages.GenerationCeiling). Installing it would leave the router unable
// to install the optimizer's next snapshots; the installed one is kept.
func (s *SnapshotStore) rejectFuture(key string, err error) {
	s.rejected.WithLabelValues(rejectFuture).Inc()
	ev := s.poison.Log(key)
	if ev == nil {
		return
	}
	ev = ev.Err(err).Str("key", key).Str("reason", rejectFuture)
	if model, _, ok := streams.SplitKey(key); ok {
		ev = ev.Str("model", model)
		if snap, ok := s.Snapshot(model); ok {
			ev = ev.Uint64("installed_generation", snap.Generation)
		}
	}
	ev.Msg("weight snapshot from the future ignored; keeping the installed one (logged at a bounded rate)")
}

// buildSnapshotTable turns a snapshot into a selection table, with the
// engines' live endpoints, their planned utilisation (which PickTwo weighs
// their load against) and weights scaled down when rounding makes them
// sum to more than 1. A snapshot that carries a slot table is installed
// with it (NewTableFromSlots), so that every router maps keys alike; the
// slots spread keys over the weighted engines only, the shed fraction being
// the guards' business. A slot table that does not fit the weights (a slot
// owned by an engine of weight zero) is logged and replaced by NewTable's.
func (s *SnapshotStore) buildSnapshotTable(snap *messages.WeightSnapshot) (*selection.Table, error) {
	sum := 0.0
	for _, w := range snap.Weights {
		sum += w
	}
	scale := 1.0
	if sum > 1 {
		scale = 1 / sum
	}
	engine := func(name string) selection.Engine {
		e := selection.Engine{Name: name, Weight: math.Min(1, snap.Weights[name]*scale), Utilisation: snap.Utilisation[name]}
		if s.opts.Signals != nil {
			if ep, ok := s.opts.Signals.Endpoints(snap.Model, name); ok {
				e.URL, e.Subject, e.ServedModel = ep.URL, ep.Subject, ep.ServedModel
			}
		}
		return e
	}
	es := make([]selection.Engine, 0, len(snap.Weights))
	if len(snap.Slots) > 0 {
		// Slot indexes refer to SlotEngines: list those first, in order.
		listed := make(map[string]bool, len(snap.SlotEngines))
		for _, name := range snap.SlotEngines {
			listed[name] = true
			es = append(es, engine(name))
		}
		for name := range snap.Weights {
			if !listed[name] {
				es = append(es, engine(name))
			}
		}
		idx, err := selection.DecodeSlots(snap.Slots)
		if err == nil {
			var t *selection.Table
			if t, err = selection.NewTableFromSlots(es, idx, s.opts.Table); err == nil {
				return t, nil
			}
		}
		s.log.Warn().Err(err).Str("model", snap.Model).Uint64("generation", snap.Generation).
			Msg("snapshot's slot table not usable; computing slots from its weights")
		return selection.NewTable(es, s.opts.Table)
	}
	for name := range snap.Weights {
		es = append(es, engine(name))
	}
	return selection.NewTable(es, s.opts.Table)
}

// Refresh re-evaluates every model's mode and local policy now and
// publishes the result. Run calls it every RefreshInterval.
func (s *SnapshotStore) Refresh() {
	s.mu.Lock()
	s.refreshLocked(s.opts.Now(), false)
	guards := s.guardListLocked()
	s.mu.Unlock()
	if s.opts.Guard != nil {
		for _, g := range guards {
			s.opts.Guard(g.model, g.engine, g.down)
		}
	}
}

// refreshLocked recomputes modes and local tables and publishes the view.
func (s *SnapshotStore) refreshLocked(now time.Time, force bool) {
	var sigVer uint64
	if s.opts.Signals != nil {
		sigVer = s.opts.Signals.Version()
		for _, model := range s.opts.Signals.Models() {
			if s.models[model] == nil {
				s.models[model] = &storeModel{}
			}
		}
	}
	view := &storeView{tables: make(map[string]tableEntry, len(s.models))}
	for name, m := range s.models {
		fresh := m.snap != nil && now.Sub(time.UnixMilli(m.snap.Time)) <= s.opts.StaleAfter
		// A fresh snapshot none of whose planned engines the router can
		// reach (stored by an earlier run for engines that are gone) would
		// answer every request 503 until the optimizer plans the engines
		// that are here: the local policy serves them meanwhile.
		unreachable := fresh && s.routing.Load() && !s.reachableLocked(name, m)
		fresh = fresh && !unreachable
		var entry tableEntry
		if fresh {
			entry = tableEntry{table: m.snapTable, info: Info{Generation: m.snap.Generation, Mode: ModeSnapshot,
				Created: time.UnixMilli(m.snap.Time), Figures: m.figures}}
		} else {
			if force || m.local == nil || m.localVer != sigVer {
				s.updateLocalLocked(name, m)
				m.localVer = sigVer
			}
			info := Info{Mode: ModeLocalPolicy}
			if m.snap != nil {
				info.Generation, info.Created = m.snap.Generation, time.UnixMilli(m.snap.Time)
			}
			switch {
			case m.local != nil && m.local.Slots() > 0:
				entry = tableEntry{table: m.local, info: info}
			case m.snapTable != nil:
				entry = tableEntry{table: m.snapTable, info: info} // no healthy engine known: keep the stale snapshot
			case m.local != nil:
				entry = tableEntry{table: m.local, info: info}
			default:
				continue
			}
		}
		if !m.modeLogged || m.mode != entry.info.Mode {
			ev := s.log.Info()
			if entry.info.Mode == ModeLocalPolicy {
				ev = s.log.Warn()
			}
			ev = ev.Str("model", name).Str("mode", string(entry.info.Mode)).Uint64("generation", entry.info.Generation)
			switch {
			case entry.info.Mode == ModeSnapshot:
				ev.Msg("routing by the optimizer's weight snapshot")
			case m.snap == nil:
				ev.Msg("no weight snapshot yet; routing by the local policy over live engine signals")
			case unreachable:
				ev.Msg("no engine the weight snapshot plans for has an address (none signalled); routing by the local policy over live engine signals")
			default:
				ev.Dur("snapshot_age", now.Sub(time.UnixMilli(m.snap.Time))).Dur("stale_after", s.opts.StaleAfter).
					Msg("weight snapshot is stale; routing by the local policy over live engine signals")
			}
			m.mode, m.modeLogged = entry.info.Mode, true
		}
		view.tables[name] = entry
		view.models = append(view.models, name)
	}
	sort.Strings(view.models)
	old := s.view.Load()
	if !force && sameView(old, view) {
		return
	}
	s.view.Store(view)
}

// reachableLocked reports whether model's snapshot table has an engine of
// positive weight with an address, from the table or its signals (true
// without Signals, and for a snapshot that plans no engine at all).
func (s *SnapshotStore) reachableLocked(model string, m *storeModel) bool {
	if s.opts.Signals == nil || m.snapTable == nil {
		return true
	}
	weighted := 0
	for i := 0; i < m.snapTable.Len(); i++ {
		e := m.snapTable.Engine(i)
		if e.Weight <= 0 {
			continue
		}
		weighted++
		if e.URL != "" || e.Subject != "" {
			return true
		}
		if ep, ok := s.opts.Signals.Endpoints(model, e.Name); ok && (ep.URL != "" || ep.Subject != "") {
			return true
		}
	}
	return weighted == 0
}

func sameView(a, b *storeView) bool {
	if len(a.tables) != len(b.tables) {
		return false
	}
	for k, e := range b.tables {
		if o, ok := a.tables[k]; !ok || o != e {
			return false
		}
	}
	return true
}

// localWeightTolerance is how far a local-policy weight may drift before
// the local table is rebuilt (capacities jitter from signal to signal).
const localWeightTolerance = 0.02

// updateLocalLocked rebuilds model's local-policy table when the healthy
// engines or their capacity shares changed materially.
func (s *SnapshotStore) updateLocalLocked(model string, m *storeModel) {
	if s.opts.Signals == nil {
		return
	}
	views := s.opts.Signals.Engines(model)
	w := make(map[string]float64)
	total, healthy := 0.0, 0
	for _, v := range views {
		if v.Down || v.Signal.Health <= 0 || (v.URL == "" && v.Subject == "") {
			continue
		}
		healthy++
		total += v.Signal.CapacityRPS
	}
	for _, v := range views {
		if v.Down || v.Signal.Health <= 0 || (v.URL == "" && v.Subject == "") {
			continue
		}
		if total > 0 {
			if v.Signal.CapacityRPS > 0 {
				w[v.Engine] = v.Signal.CapacityRPS / total
			}
		} else {
			w[v.Engine] = 1 / float64(healthy)
		}
	}
	if m.local != nil && closeWeights(m.localW, w) {
		return
	}
	es := make([]selection.Engine, 0, len(views))
	for _, v := range views {
		es = append(es, selection.Engine{Name: v.Engine, URL: v.URL, Subject: v.Subject, ServedModel: v.ServedModel, Weight: math.Min(1, w[v.Engine]*(1-1e-12))})
	}
	t, err := selection.NewTable(es, s.opts.Table)
	if err != nil {
		s.log.Warn().Err(err).Str("model", model).Msg("local-policy table not built")
		return
	}
	m.local, m.localW = t, w
}

func closeWeights(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range b {
		o, ok := a[k]
		if !ok || math.Abs(o-v) > localWeightTolerance {
			return false
		}
	}
	return true
}

type guardMark struct {
	model, engine string
	down          bool
}

// guardListLocked lists, for every published table, whether each engine
// should be skipped.
func (s *SnapshotStore) guardListLocked() []guardMark {
	if s.opts.Guard == nil {
		return nil
	}
	var out []guardMark
	for model, e := range s.view.Load().tables {
		for i := 0; i < e.table.Len(); i++ {
			eng := e.table.Engine(i)
			down := false
			if s.opts.Signals != nil {
				// An engine without an address is the handler's to pass
				// over (Bound.Reachable), not down: marking it down here
				// could override the up mark of a first signal that
				// arrived since this list was made.
				v, ok := s.opts.Signals.Engine(model, eng.Name)
				down = ok && v.Down
			}
			out = append(out, guardMark{model, eng.Name, down})
		}
	}
	return out
}

// Snapshot returns a copy of the newest installed snapshot of model.
func (s *SnapshotStore) Snapshot(model string) (messages.WeightSnapshot, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.models[model]
	if m == nil || m.snap == nil {
		return messages.WeightSnapshot{}, false
	}
	return *m.snap, true
}

// String describes the store, for logs.
func (s *SnapshotStore) String() string {
	return "snapshot store for cluster " + s.opts.Cluster + " (" + strings.Join(s.Models(), ",") + ")"
}
