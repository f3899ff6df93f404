// Package deploy_test runs the clustered deployment in one process — a real
// three-node NATS JetStream cluster (testenv.StartClusterWith), the case study's
// simulated engines, the aggregator, a leader and a standby optimizer and one
// router per frontend cluster — and checks that losing a NATS node, the
// optimizer leader or the aggregator loses nothing while traffic flows.
//
// The folder also holds the container deployment's parts: Dockerfile,
// build-images.sh and smoke.sh; the compose file is the top-level
// docker-compose.yml (see docs/deployment.md).
package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/services/aggregator"
	"github.com/switchyard-dev/switchyard/services/enginesim"
	"github.com/switchyard-dev/switchyard/services/optimizersvc"
	"github.com/switchyard-dev/switchyard/stack"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/testenv"
)

// testLogLevel is the level of the services' logs in the test output.
var testLogLevel = zerolog.WarnLevel

const (
	model    = "llama"
	leaseTTL = time.Second
	// resumeWithin bounds the gap in weight snapshots after a failure.
	resumeWithin = 5 * time.Second
)

// service is a component running in its own goroutine on its own connection.
type service struct {
	name   string
	conn   *nats.Conn
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

func run(t *testing.T, name string, conn *nats.Conn, fn func(context.Context) error) *service {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &service{name: name, conn: conn, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.err = fn(ctx)
	}()
	t.Cleanup(func() { s.stop(t) })
	return s
}

// stop cancels the service and waits for it to return.
func (s *service) stop(t *testing.T) {
	t.Helper()
	s.cancel()
	select {
	case <-s.done:
		if s.err != nil {
			t.Errorf("%s: %v", s.name, s.err)
		}
	case <-time.After(15 * time.Second):
		t.Errorf("%s did not stop within 15 s", s.name)
	}
}

// deployment is the case study running on a three-node cluster.
type deployment struct {
	t        *testing.T
	cluster  *testenv.Cluster
	file     *stack.File
	log      zerolog.Logger
	engines  []*enginesim.Engine
	agg      *service
	opts     []*optimizer
	routers  []*router.Service
	keys     []string // sy_weights keys of the case study
	aggCount int
}

type optimizer struct {
	*service
	svc *optimizersvc.Service
}

func (d *deployment) startAggregator() {
	d.t.Helper()
	d.aggCount++
	name := fmt.Sprintf("aggregator-%d", d.aggCount)
	conn := d.cluster.Dial(d.t, name)
	agg, err := aggregator.New(aggregator.Options{Conn: conn, WriteInterval: 100 * time.Millisecond, Logger: d.log.With().Str("svc", name).Logger()})
	if err != nil {
		d.t.Fatal(err)
	}
	d.agg = run(d.t, name, conn, agg.Run)
}

func (d *deployment) startOptimizer(instance string) *optimizer {
	d.t.Helper()
	conn := d.cluster.Dial(d.t, instance)
	o := optimizersvc.Options{Conn: conn, Instance: instance, NetworkMs: d.file.NetworkTable(), PreferConfiguredNetwork: true,
		MinInterval: 100 * time.Millisecond, MaxInterval: 400 * time.Millisecond, Heartbeat: time.Second, LeaseTTL: leaseTTL,
		Logger: d.log.With().Str("svc", instance).Logger()}
	for _, c := range d.file.Clusters {
		o.Clusters = append(o.Clusters, c.Name)
	}
	svc, err := optimizersvc.New(o)
	if err != nil {
		d.t.Fatal(err)
	}
	opt := &optimizer{service: run(d.t, instance, conn, svc.Run), svc: svc}
	d.opts = append(d.opts, opt)
	return opt
}

// leader returns the optimizer instance holding the lease, if exactly one does.
func (d *deployment) leader() *optimizer {
	var found *optimizer
	for _, o := range d.opts {
		select {
		case <-o.done:
			continue
		default:
		}
		if o.svc.Leader() {
			if found != nil {
				return nil
			}
			found = o
		}
	}
	return found
}

func startDeployment(t *testing.T) *deployment {
	t.Helper()
	start := time.Now()
	c := testenv.StartClusterWith(t, testenv.ClusterOptions{Provision: streams.ProvisionOptions{LeaseTTL: leaseTTL}})
	t.Logf("three-node cluster up in %s: %v", time.Since(start).Round(time.Millisecond), c.URLs())
	d := &deployment{t: t, cluster: c, file: stack.Default(),
		log: zerolog.New(zerolog.NewTestWriter(t)).Level(testLogLevel).With().Timestamp().Logger()}
	f := d.file
	for _, cl := range f.Clusters {
		key, err := streams.WeightsKey(f.Model, cl.Name)
		if err != nil {
			t.Fatal(err)
		}
		d.keys = append(d.keys, key)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, e := range f.Engines {
		eo := enginesim.Options{Name: e.Name, Model: f.Model, Region: e.Region, OutputTokens: f.Sim.OutputTokens,
			PromptTokens: f.Sim.PromptTokens, BaseTBTMs: f.Sim.BaseTBTMs, TBTGrowthMs: f.Sim.TBTGrowthMs,
			PrefillMsPerToken: f.Sim.PrefillMsPerToken, Conn: c.Dial(t, e.Name), SignalInterval: 100 * time.Millisecond,
			Logger: d.log.With().Str("svc", e.Name).Logger()}
		b, err := enginesim.BatchForCapacity(eo, e.CapacityRPS)
		if err != nil {
			t.Fatal(err)
		}
		eo.MaxBatch = b
		eng, err := enginesim.New(eo)
		if err != nil {
			t.Fatal(err)
		}
		if err := eng.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = eng.Close() })
		d.engines = append(d.engines, eng)
	}
	d.startAggregator()
	first := d.startOptimizer("opt-1")
	testenv.WaitFor(t, 10*time.Second, "opt-1 leads", first.svc.Leader)
	d.startOptimizer("opt-2")
	for _, cl := range f.Clusters {
		name := cl.Name + "-1"
		rs, err := router.NewService(router.ServiceOptions{Conn: c.Dial(t, "router-"+name), Cluster: cl.Name, Router: name,
			HTTPAddr: "127.0.0.1:0", Logger: d.log.With().Str("svc", "router-"+name).Logger()})
		if err != nil {
			t.Fatal(err)
		}
		d.routers = append(d.routers, rs)
		run(t, "router "+name, nil, rs.Run)
	}
	testenv.WaitFor(t, 15*time.Second, "every router holds a weight snapshot", func() bool {
		for _, r := range d.routers {
			if _, ok := r.Store().Snapshot(model); !ok {
				return false
			}
		}
		return true
	})
	t.Logf("deployment serving after %s", time.Since(start).Round(time.Millisecond))
	return d
}

// load sends requests through every router until stopped, counting failures.
type load struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	failures   []string
	cancel     context.CancelFunc
	wg         sync.WaitGroup
}

// startLoad runs workers per router, each sending one short completion every period.
func startLoad(d *deployment, workers int, period time.Duration) *load {
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{cancel: cancel}
	client := &http.Client{Timeout: 15 * time.Second}
	for _, r := range d.routers {
		url := "http://" + r.Addr() + "/v1/completions"
		for w := range workers {
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				tick := time.NewTicker(period)
				defer tick.Stop()
				for n := 0; ; n++ {
					select {
					case <-ctx.Done():
						return
					case <-tick.C:
					}
					body := fmt.Sprintf(`{"model":%q,"prompt":"conversation %d-%d: hello","max_tokens":4,"user":"u%d-%d"}`, model, w, n%20, w, n%20)
					l.do(ctx, client, url, body)
				}
			}()
		}
	}
	return l
}

func (l *load) do(ctx context.Context, client *http.Client, url, body string) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader([]byte(body)))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("HTTP %s", resp.Status)
		}
	}
	if err == nil {
		l.ok.Add(1)
		return
	}
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return
	}
	l.failed.Add(1)
	l.mu.Lock()
	if len(l.failures) < 10 {
		l.failures = append(l.failures, fmt.Sprintf("%s %s: %v", time.Now().Format("15:04:05.000"), url, err))
	}
	l.mu.Unlock()
}

func (l *load) stop() {
	l.cancel()
	l.wg.Wait()
}

// weightsWatch records every sy_weights update, through a connection of its
// own to one node, and checks per key that generations only rise.
//
// It reads the bucket's stream with an ordered pull consumer and a 500 ms
// heartbeat rather than with KeyValue.Watch: the KV watcher (a push ordered
// consumer with a 5 s heartbeat) whose consumer lived on a stopped node
// resumes only after 10 s or more, even on a connection to a surviving node.
type weightsWatch struct {
	mu      sync.Mutex
	gen     map[string]uint64    // newest generation per key
	rev     map[string]uint64    // newest revision per key
	at      map[string]time.Time // when the newest generation arrived
	writers map[string]int       // snapshots per writer
	updates int
	errs    []string
}

func watchWeights(t *testing.T, conn *nats.Conn, bucket string) *weightsWatch {
	t.Helper()
	js, err := jetstream.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	prefix := "$KV." + bucket + "."
	cons, err := js.OrderedConsumer(ctx, "KV_"+bucket, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{prefix + ">"}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy})
	if err != nil {
		t.Fatal(err)
	}
	ww := &weightsWatch{gen: map[string]uint64{}, rev: map[string]uint64{}, at: map[string]time.Time{}, writers: map[string]int{}}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		key := strings.TrimPrefix(m.Subject(), prefix)
		if op := m.Headers().Get("KV-Operation"); op != "" {
			return // a delete or purge marker
		}
		meta, err := m.Metadata()
		if err != nil {
			return
		}
		rev := meta.Sequence.Stream
		var s messages.WeightSnapshot
		err = messages.DecodeInto(m.Data(), &s)
		ww.mu.Lock()
		defer ww.mu.Unlock()
		switch {
		case err != nil:
			ww.errs = append(ww.errs, fmt.Sprintf("%s rev %d: undecodable: %v", key, rev, err))
		case rev <= ww.rev[key]:
			// Redelivered after a consumer reset: already seen.
		case s.Generation <= ww.gen[key]:
			ww.errs = append(ww.errs, fmt.Sprintf("%s rev %d: generation %d (writer %s) after %d", key, rev, s.Generation, s.Writer, ww.gen[key]))
		default:
			ww.gen[key], ww.rev[key], ww.at[key] = s.Generation, rev, time.Now()
			ww.writers[s.Writer]++
			ww.updates++
		}
	}, jetstream.PullHeartbeat(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	return ww
}

// generations returns the newest generation of each key.
func (w *weightsWatch) generations(keys []string) []uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	g := make([]uint64, len(keys))
	for i, k := range keys {
		g[i] = w.gen[k]
	}
	return g
}

func (w *weightsWatch) check(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.errs {
		t.Error("sy_weights: " + e)
	}
}

// waitNewGenerations waits until every key has a generation above before,
// both in sy_weights and installed in every router, and returns how long it took.
func (d *deployment) waitNewGenerations(w *weightsWatch, since time.Time, before []uint64, what string) time.Duration {
	d.t.Helper()
	var state string
	done := func() bool {
		now := w.generations(d.keys)
		installed := make([]uint64, len(d.routers))
		for i, r := range d.routers {
			if s, ok := r.Store().Snapshot(model); ok {
				installed[i] = s.Generation
			}
		}
		state = fmt.Sprintf("sy_weights %v, routers %v, before %v, optimizer leader %s", now, installed, before, d.leaderName())
		for i := range now {
			if now[i] <= before[i] || installed[i] <= before[i] {
				return false
			}
		}
		return true
	}
	deadline := since.Add(resumeWithin)
	for !done() {
		if time.Now().After(deadline) {
			d.t.Fatalf("%s: no new weight generation everywhere within %s: %s", what, resumeWithin, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(since)
	d.t.Logf("%s: new generations everywhere after %s (%s)", what, took.Round(time.Millisecond), state)
	return took
}

func (d *deployment) leaderName() string {
	if l := d.leader(); l != nil {
		return l.name
	}
	return "(none or several)"
}

// probe publishes valid signals and reports for a model of its own ("probe",
// which no router serves) and records the stream sequence of every publish
// the stream acknowledged. A publish that gets no acknowledgement is retried
// with the same message id, as engines do.
type probe struct {
	mu     sync.Mutex
	acked  map[string][]ackedMsg // by stream
	failed int
	cancel context.CancelFunc
	done   chan struct{}
}

type ackedMsg struct {
	seq  uint64
	data []byte
}

func startProbe(t *testing.T, conn *nats.Conn, names streams.Names) *probe {
	t.Helper()
	js, err := jetstream.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	sigSubject, err := names.SignalSubject("probe", "probe-engine")
	if err != nil {
		t.Fatal(err)
	}
	repSubject, err := names.ReportSubject("probe", "P", "probe-router")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &probe{acked: map[string][]ackedMsg{}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for seq := uint64(1); ; seq++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			now := time.Now()
			sig := &messages.EngineSignal{Model: "probe", Engine: "probe-engine", Time: now.UnixMilli(), Seq: seq,
				TTFTMs: 10, TBTMs: 1, CapacityRPS: 1, Replicas: 1, Health: 1}
			rep := &messages.RouterReport{Model: "probe", Cluster: "P", Router: "probe-router", Time: now.UnixMilli(), Seq: seq, IntervalS: 0.05}
			for _, m := range []struct {
				stream, subject string
				msg             messages.Message
			}{{names.SignalStream, sigSubject, sig}, {names.ReportStream, repSubject, rep}} {
				data, err := messages.Encode(m.msg)
				if err != nil {
					panic(err)
				}
				id := fmt.Sprintf("probe-%s-%d", m.stream, seq)
				for attempt := 0; attempt < 20 && ctx.Err() == nil; attempt++ {
					pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
					ack, err := js.Publish(pctx, m.subject, data, jetstream.WithMsgID(id))
					pcancel()
					if err == nil {
						// A duplicate ack (an earlier attempt was stored but its
						// ack was lost) carries the original sequence.
						p.mu.Lock()
						p.acked[m.stream] = append(p.acked[m.stream], ackedMsg{ack.Sequence, data})
						p.mu.Unlock()
						break
					}
					p.mu.Lock()
					p.failed++
					p.mu.Unlock()
				}
			}
		}
	}()
	return p
}

func (p *probe) stop() {
	p.cancel()
	<-p.done
}

func (p *probe) count(stream string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.acked[stream])
}

// verify checks that every acknowledged probe message is in its stream, and
// that the aggregator's durable consumer has acknowledged past all of them.
func (p *probe) verify(t *testing.T, ctx context.Context, js jetstream.JetStream) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for stream, msgs := range p.acked {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			raw, err := s.GetMsg(ctx, m.seq)
			if err != nil {
				t.Errorf("%s: acknowledged probe message seq %d lost: %v", stream, m.seq, err)
				continue
			}
			if !bytes.Equal(raw.Data, m.data) {
				t.Errorf("%s: seq %d holds other data than the probe message acknowledged there", stream, m.seq)
			}
		}
	}
}

// waitConsumersCaughtUp waits until the aggregator's durable consumers have
// acknowledged every probe message acknowledged by the streams so far.
func (d *deployment) waitConsumersCaughtUp(p *probe) {
	d.t.Helper()
	type target struct {
		stream, durable string
		last            uint64
	}
	targets := []target{
		{d.cluster.Names.SignalStream, "sy-aggregator-signals", p.lastSeq(d.cluster.Names.SignalStream)},
		{d.cluster.Names.ReportStream, "sy-aggregator-reports", p.lastSeq(d.cluster.Names.ReportStream)},
	}
	var status []string
	done := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		status = status[:0]
		ok := true
		for _, tg := range targets {
			cons, err := d.cluster.JS.Consumer(ctx, tg.stream, tg.durable)
			if err != nil {
				status = append(status, fmt.Sprintf("%s/%s: %v", tg.stream, tg.durable, err))
				ok = false
				continue
			}
			floor := cons.CachedInfo().AckFloor.Stream
			status = append(status, fmt.Sprintf("%s/%s ack floor %d, last probe seq %d", tg.stream, tg.durable, floor, tg.last))
			ok = ok && floor >= tg.last
		}
		return ok
	}
	deadline := time.Now().Add(10 * time.Second)
	for !done() {
		if time.Now().After(deadline) {
			d.t.Fatalf("the aggregator did not consume every acknowledged probe message within 10 s: %s", strings.Join(status, "; "))
		}
		time.Sleep(50 * time.Millisecond)
	}
	d.t.Logf("aggregator caught up: %s", strings.Join(status, "; "))
}

// routerGenerations samples every router's installed generation and
// records any that went backwards.
func (d *deployment) watchRouters() (stop func() []string) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var errs []string
	go func() {
		defer close(done)
		last := make([]uint64, len(d.routers))
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			for i, r := range d.routers {
				s, ok := r.Store().Snapshot(model)
				if !ok {
					continue
				}
				if s.Generation < last[i] {
					errs = append(errs, fmt.Sprintf("router %s installed generation %d after %d", r.Name(), s.Generation, last[i]))
				}
				last[i] = s.Generation
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() []string {
		cancel()
		<-done
		return errs
	}
}

// TestFailover runs the case study on a three-node cluster under traffic
// through the routers and, in turn, stops the NATS node leading the weights
// bucket (and restarts it), crashes the optimizer leader, and restarts the
// aggregator. Throughout: no client request fails, weight generations only
// rise (in sy_weights and in every router), snapshots resume within 5 s of
// each failure, and no signal or report the stream acknowledged is lost.
func TestFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("three-node cluster failover: not in -short")
	}
	begin := time.Now()
	d := startDeployment(t)
	c := d.cluster
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// The node to stop leads the weights bucket; the test watches through a
	// connection to another node.
	weightsStream := "KV_" + c.Names.WeightsBucket
	leaderName := c.StreamLeader(ctx, weightsStream)
	victim := c.NodeIndex(leaderName)
	if victim < 0 {
		t.Fatalf("stream %s has no leader among the nodes (%q)", weightsStream, leaderName)
	}
	watcher := (victim + 1) % 3
	watch := watchWeights(t, c.DialNode(t, watcher, "test-watch"), c.Names.WeightsBucket)
	stopRouterWatch := d.watchRouters()
	prb := startProbe(t, c.Dial(t, "test-probe"), c.Names)
	traffic := startLoad(d, 2, 100*time.Millisecond)
	testenv.WaitFor(t, 10*time.Second, "traffic and snapshots flowing", func() bool {
		return traffic.ok.Load() >= 30 && !slices.Contains(watch.generations(d.keys), 0)
	})

	// 1. A NATS node goes away: the one leading the weights bucket.
	before := watch.generations(d.keys)
	probesBefore := prb.count(c.Names.SignalStream)
	stopped := time.Now()
	c.StopNode(t, victim)
	t.Logf("stopped NATS node %s (leader of %s); watching through %s", leaderName, weightsStream, c.Node(watcher).Name)
	natsGap := d.waitNewGenerations(watch, stopped, before, "NATS node "+leaderName+" stopped")
	testenv.WaitFor(t, 5*time.Second, "probe publishes acknowledged with a node down", func() bool {
		return prb.count(c.Names.SignalStream) > probesBefore+5
	})
	if l := c.StreamLeader(ctx, weightsStream); l == "" || l == leaderName {
		t.Errorf("%s leader after stopping %s: %q", weightsStream, leaderName, l)
	}
	restarted := time.Now()
	c.StartNode(t, victim)
	c.WaitCurrent(t, 30*time.Second)
	sigSeq := prb.lastSeq(c.Names.SignalStream)
	testenv.WaitFor(t, 10*time.Second, "restarted node holds every acknowledged signal", func() bool {
		st, ok := c.LocalStreamState(victim, c.Names.SignalStream)
		return ok && st.LastSeq >= sigSeq
	})
	t.Logf("NATS node %s rejoined, every replica current, in %s", leaderName, time.Since(restarted).Round(time.Millisecond))

	// 2. The optimizer leader crashes: its connection drops (so it cannot
	// release the lease), then it stops. The standby takes over within the TTL.
	old := d.leader()
	if old == nil {
		t.Fatal("no single optimizer leader")
	}
	before = watch.generations(d.keys)
	crashed := time.Now()
	old.conn.Close()
	old.stop(t)
	var standby *optimizer
	testenv.WaitFor(t, 3*leaseTTL, "the standby optimizer leads", func() bool {
		standby = d.leader()
		return standby != nil
	})
	takeover := time.Since(crashed)
	t.Logf("optimizer %s crashed; %s leads after %s (lease TTL %s)", old.name, standby.name, takeover.Round(time.Millisecond), leaseTTL)
	if takeover > leaseTTL+leaseTTL/2 {
		t.Errorf("standby took over after %s, want within the lease TTL %s (+ half for scheduling)", takeover, leaseTTL)
	}
	optGap := d.waitNewGenerations(watch, crashed, before, "optimizer "+old.name+" crashed")

	// 3. The aggregator restarts; engine state keeps being written and it
	// consumes from where it left off.
	before = watch.generations(d.keys)
	restartAt := time.Now()
	d.agg.stop(t)
	d.startAggregator()
	engines, err := c.JS.KeyValue(ctx, c.Names.EnginesBucket)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "engine state written by the restarted aggregator", func() bool {
		for _, e := range d.engines {
			key, _ := streams.EngineKey(model, e.Name())
			v, err := engines.Get(ctx, key)
			if err != nil || v.Created().Before(restartAt) {
				return false
			}
		}
		return true
	})
	aggGap := d.waitNewGenerations(watch, restartAt, before, "aggregator restarted")
	d.waitConsumersCaughtUp(prb)

	// Stop, then check everything recorded.
	traffic.stop()
	prb.stop()
	routerErrs := stopRouterWatch()
	for _, e := range routerErrs {
		t.Error(e)
	}
	watch.check(t)
	prb.verify(t, ctx, c.JS)
	d.waitConsumersCaughtUp(prb)
	if n := traffic.failed.Load(); n > 0 {
		t.Errorf("%d of %d client requests failed; first: %v", n, n+traffic.ok.Load(), traffic.failures)
	}
	watch.mu.Lock()
	writers := fmt.Sprint(watch.writers)
	updates := watch.updates
	watch.mu.Unlock()
	t.Logf("requests: %d ok, %d failed; snapshots seen: %d by writer %s; probe messages acknowledged: %d signals, %d reports (%d publish attempts retried)",
		traffic.ok.Load(), traffic.failed.Load(), updates, writers, prb.count(c.Names.SignalStream), prb.count(c.Names.ReportStream), prb.failed)
	t.Logf("snapshot gaps: NATS node %s, optimizer leader %s, aggregator %s; whole test %s",
		natsGap.Round(time.Millisecond), optGap.Round(time.Millisecond), aggGap.Round(time.Millisecond), time.Since(begin).Round(time.Millisecond))
}

// lastSeq returns the stream sequence of the newest acknowledged probe message on stream.
func (p *probe) lastSeq(stream string) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	msgs := p.acked[stream]
	if len(msgs) == 0 {
		return 0
	}
	return msgs[len(msgs)-1].seq
}
