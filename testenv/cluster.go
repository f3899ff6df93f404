package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/switchyard-dev/switchyard/auth"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/streams/natsembed"
)

// ClusterOptions configures StartClusterWith.
type ClusterOptions struct {
	// Nodes is the number of servers. Zero means 3.
	Nodes int
	// Name is the NATS cluster name. Empty means "sy-test".
	Name string
	// Provision sets how the layout is provisioned; its Replicas defaults to
	// min(Nodes, 3) instead of 1.
	Provision streams.ProvisionOptions
	// NoProvision leaves the streams and buckets out.
	NoProvision bool
	// Logger, when set, receives every server's log (tagged with the server
	// name). Nil means the servers log nothing.
	Logger *zerolog.Logger
	// Timeout bounds the start: servers up, a JetStream meta leader elected
	// and the layout provisioned. Zero means 30 s.
	Timeout time.Duration
	// Auth, when set, runs every node in operator mode with TLS on its
	// client and route ports (routes verify each other's certificates):
	// Conn and Dial connect as its admin identity, DialAs as another.
	Auth *auth.Material
}

// ClusterNode is one server of a Cluster. Its ports and store directory stay
// the same across StopNode and StartNode, so a restarted node rejoins with
// its state and catches up.
type ClusterNode struct {
	// Name is the server name, "n1", "n2", ...
	Name string
	// Port is the client port and ClusterPort the route port, both on 127.0.0.1.
	Port        int
	ClusterPort int
	// DataDir is the node's JetStream store directory.
	DataDir string

	srv *natsembed.Server // nil while stopped
}

// URL returns the node's client URL (also while it is stopped).
func (n *ClusterNode) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(n.Port) }

// RouteURL returns the node's cluster (route) URL.
func (n *ClusterNode) RouteURL() string {
	return "nats-route://127.0.0.1:" + strconv.Itoa(n.ClusterPort)
}

// Cluster is a real NATS cluster of embedded JetStream servers started for
// one test: every node on 127.0.0.1 with its own client and route port and a
// temporary store, all routed to each other. Conn and JS are a client
// connected to every node (it reconnects to a surviving node when one stops).
type Cluster struct {
	// Names is the provisioned layout.
	Names streams.Names
	// Conn is a client connection with every node's URL.
	Conn *nats.Conn
	// JS is JetStream on Conn.
	JS jetstream.JetStream

	opts  ClusterOptions
	mu    sync.Mutex
	nodes []*ClusterNode
}

// StartClusterWith starts a cluster as configured by opts: it picks free
// client and route ports, starts every node with routes to the others, waits
// until JetStream has a meta leader that knows every node, connects a client
// to all nodes and provisions the layout. Everything stops when the test ends.
func StartClusterWith(tb testing.TB, opts ClusterOptions) *Cluster {
	tb.Helper()
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.Nodes < 1 {
		tb.Fatalf("testenv: cluster of %d nodes", opts.Nodes)
	}
	if opts.Name == "" {
		opts.Name = "sy-test"
	}
	if opts.Provision.Replicas == 0 {
		opts.Provision.Replicas = min(opts.Nodes, 3)
	}
	if opts.Timeout == 0 {
		opts.Timeout = 30 * time.Second
	}
	c := &Cluster{Names: streams.DefaultNames(), opts: opts}
	tb.Cleanup(c.Stop)
	dir := tb.TempDir()
	// A picked port may be taken by someone else before the server binds it:
	// pick again a few times.
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		var ports []int
		if ports, err = freePorts(2 * opts.Nodes); err != nil {
			tb.Fatalf("testenv: pick ports: %v", err)
		}
		c.nodes = make([]*ClusterNode, opts.Nodes)
		for i := range c.nodes {
			name := "n" + strconv.Itoa(i+1)
			c.nodes[i] = &ClusterNode{Name: name, Port: ports[2*i], ClusterPort: ports[2*i+1], DataDir: filepath.Join(dir, name)}
		}
		if err = c.startAll(); err == nil {
			break
		}
		c.stopServers()
		if !errors.Is(err, natsembed.ErrPortInUse) {
			break
		}
	}
	if err != nil {
		tb.Fatalf("testenv: start cluster: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), opts.Timeout)
	defer cancel()
	c.Conn = c.Dial(tb, "testenv-cluster")
	if c.JS, err = jetstream.New(c.Conn); err != nil {
		tb.Fatalf("testenv: jetstream: %v", err)
	}
	if err := c.waitMeta(ctx); err != nil {
		tb.Fatalf("testenv: cluster of %d nodes: %v", opts.Nodes, err)
	}
	if !opts.NoProvision {
		if err := c.provision(ctx); err != nil {
			tb.Fatalf("testenv: provision on the cluster: %v", err)
		}
	}
	return c
}

// freePorts returns n distinct free TCP ports on 127.0.0.1, holding them all
// until every one is picked.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func (c *Cluster) startAll() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.nodes {
		if err := c.startLocked(i); err != nil {
			return err
		}
	}
	return nil
}

// startLocked starts node i with routes to every other node.
func (c *Cluster) startLocked(i int) error {
	n := c.nodes[i]
	if n.srv != nil {
		return fmt.Errorf("node %s already running", n.Name)
	}
	var routes []string
	for j, o := range c.nodes {
		if j != i {
			routes = append(routes, o.RouteURL())
		}
	}
	eo := natsembed.Options{DataDir: n.DataDir, Port: n.Port, ServerName: n.Name,
		ClusterName: c.opts.Name, ClusterPort: n.ClusterPort, Routes: routes}
	if m := c.opts.Auth; m != nil {
		eo.Auth, eo.TLS = m.ServerAuth(), m.ServerTLS(false)
	}
	if c.opts.Logger != nil {
		l := c.opts.Logger.With().Str("nats_server", n.Name).Logger()
		eo.Logger = &l
	}
	srv, err := natsembed.Start(eo)
	if err != nil {
		return fmt.Errorf("node %s (client port %d, route port %d): %w", n.Name, n.Port, n.ClusterPort, err)
	}
	n.srv = srv
	return nil
}

// waitMeta waits until a JetStream API call succeeds (there is a meta
// leader) and the meta group counts every running node.
func (c *Cluster) waitMeta(ctx context.Context) error {
	want := c.Running()
	var last error
	for {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.JS.AccountInfo(actx)
		cancel()
		if err == nil {
			peers := 0
			c.mu.Lock()
			for _, n := range c.nodes {
				if n.srv != nil && n.srv.Server().JetStreamIsLeader() {
					peers = len(n.srv.Server().JetStreamClusterPeers())
				}
			}
			c.mu.Unlock()
			if peers >= len(want) {
				return nil
			}
			err = fmt.Errorf("meta group has %d of %d peers", peers, len(want))
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("no JetStream meta leader with every node: %v", last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// provision creates the layout, retrying while the cluster settles.
func (c *Cluster) provision(ctx context.Context) error {
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := streams.Provision(pctx, c.JS, c.Names, c.opts.Provision)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Node returns node i (0-based).
func (c *Cluster) Node(i int) *ClusterNode {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

// NodeIndex returns the index of the node named name, or -1.
func (c *Cluster) NodeIndex(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, n := range c.nodes {
		if n.Name == name {
			return i
		}
	}
	return -1
}

// Running returns the names of the running nodes.
func (c *Cluster) Running() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var names []string
	for _, n := range c.nodes {
		if n.srv != nil {
			names = append(names, n.Name)
		}
	}
	return names
}

// URLs returns every node's client URL, for clients that should survive the
// loss of any one node.
func (c *Cluster) URLs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	urls := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		urls[i] = n.URL()
	}
	return urls
}

// Dial opens a connection to every node (reconnecting every 50 ms to a
// surviving one), closed when the test ends.
func (c *Cluster) Dial(tb testing.TB, name string) *nats.Conn {
	tb.Helper()
	return c.dial(tb, name, "admin", c.URLs())
}

// DialAs opens a connection to every node as identity of the cluster's
// Auth, closed when the test ends.
func (c *Cluster) DialAs(tb testing.TB, identity string) *nats.Conn {
	tb.Helper()
	return c.dial(tb, "testenv-"+identity, identity, c.URLs())
}

func (c *Cluster) dial(tb testing.TB, name, identity string, urls []string) *nats.Conn {
	tb.Helper()
	o := streams.ConnectOptions{URLs: urls, Name: name, Logger: zerolog.Nop(), ReconnectWait: 50 * time.Millisecond}
	if c.opts.Auth != nil {
		o = c.opts.Auth.Connect(identity, false, o)
	}
	return dialOptions(tb, o)
}

// DialNode opens a connection to node i only, closed when the test ends.
func (c *Cluster) DialNode(tb testing.TB, i int, name string) *nats.Conn {
	tb.Helper()
	return c.dial(tb, name, "admin", []string{c.Node(i).URL()})
}

func dialOptions(tb testing.TB, o streams.ConnectOptions) *nats.Conn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nc, err := streams.Connect(ctx, o)
	if err != nil {
		tb.Fatalf("testenv: connect to %s: %v", strings.Join(o.URLs, ","), err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// StopNode shuts node i down gracefully (its leaderships are handed over
// first), keeping its ports and store for StartNode.
func (c *Cluster) StopNode(tb testing.TB, i int) {
	tb.Helper()
	c.mu.Lock()
	n := c.nodes[i]
	srv := n.srv
	n.srv = nil
	c.mu.Unlock()
	if srv == nil {
		tb.Fatalf("testenv: node %s is not running", n.Name)
	}
	srv.Shutdown()
}

// StartNode starts node i again on its ports and store; it rejoins the
// cluster and catches up (see WaitCurrent).
func (c *Cluster) StartNode(tb testing.TB, i int) {
	tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	// The port was just released by this process; give the kernel a moment if it is not yet free.
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		if err = c.startLocked(i); err == nil || !errors.Is(err, natsembed.ErrPortInUse) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		tb.Fatalf("testenv: restart: %v", err)
	}
}

// StreamLeader returns the name of the server leading stream (for a KV
// bucket, "KV_<bucket>"), or "" when it has none.
func (c *Cluster) StreamLeader(ctx context.Context, stream string) string {
	s, err := c.JS.Stream(ctx, stream)
	if err != nil {
		return ""
	}
	info := s.CachedInfo()
	if info.Cluster == nil {
		return ""
	}
	return info.Cluster.Leader
}

// Current checks that every running node has joined the cluster and that
// every stream (buckets included) has a leader and all its replicas online
// and current. It returns nil when they do, or what is not yet so.
func (c *Cluster) Current(ctx context.Context) error {
	running := c.Running()
	c.mu.Lock()
	for _, n := range c.nodes {
		if n.srv == nil {
			continue
		}
		if routed := n.srv.Server().NumRemotes(); routed < len(running)-1 {
			c.mu.Unlock()
			return fmt.Errorf("node %s has routes to %d nodes, want %d", n.Name, routed, len(running)-1)
		}
		if h := n.srv.Server().Healthz(nil); h.Error != "" {
			c.mu.Unlock()
			return fmt.Errorf("node %s not healthy: %s", n.Name, h.Error)
		}
	}
	c.mu.Unlock()
	lister := c.JS.ListStreams(ctx)
	seen := 0
	for info := range lister.Info() {
		seen++
		if info.Cluster == nil || info.Cluster.Leader == "" {
			return fmt.Errorf("stream %s has no leader", info.Config.Name)
		}
		members := []string{info.Cluster.Leader}
		for _, r := range info.Cluster.Replicas {
			if !r.Current || r.Offline {
				return fmt.Errorf("stream %s: replica %s not current (offline %v, lag %d, last active %s ago)",
					info.Config.Name, r.Name, r.Offline, r.Lag, r.Active)
			}
			members = append(members, r.Name)
		}
		if len(members) != info.Config.Replicas {
			return fmt.Errorf("stream %s: %d of %d replicas present (%s)", info.Config.Name, len(members), info.Config.Replicas, strings.Join(members, ","))
		}
		for _, m := range members {
			if !slices.Contains(running, m) {
				return fmt.Errorf("stream %s: replica %s is on a stopped node", info.Config.Name, m)
			}
		}
	}
	if err := lister.Err(); err != nil {
		return fmt.Errorf("list streams: %w", err)
	}
	if seen == 0 && !c.opts.NoProvision {
		return errors.New("no streams listed")
	}
	return nil
}

// WaitCurrent polls Current until it returns nil, failing the test after timeout.
func (c *Cluster) WaitCurrent(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Current(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("testenv: cluster not current within %s: %v", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// LocalStreamState returns the state of stream as stored on node i itself
// (not as reported by the stream's leader): what a restarted node has caught
// up to. ok is false when the node is stopped or does not hold the stream.
func (c *Cluster) LocalStreamState(i int, stream string) (st server.StreamState, ok bool) {
	c.mu.Lock()
	srv := c.nodes[i].srv
	c.mu.Unlock()
	if srv == nil {
		return st, false
	}
	info, err := srv.Server().Jsz(&server.JSzOptions{Accounts: true, Streams: true})
	if err != nil {
		return st, false
	}
	for _, a := range info.AccountDetails {
		for _, sd := range a.Streams {
			if sd.Name == stream {
				return sd.State, true
			}
		}
	}
	return st, false
}

// stopServers shuts every running node down.
func (c *Cluster) stopServers() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if n.srv != nil {
			n.srv.Shutdown()
			n.srv = nil
		}
	}
}

// Stop closes the client connection and shuts every node down; safe to call
// more than once.
func (c *Cluster) Stop() {
	if c.Conn != nil {
		c.Conn.Close()
	}
	c.stopServers()
}
