package testenv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-dev/switchyard/auth"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestClusterStopAndRejoin starts a three-node cluster, checks that every
// stream and bucket has three current replicas, stops the node leading the
// signal stream, keeps publishing and writing through the survivors, then
// restarts the node and checks that it rejoins and holds every message.
// The cluster runs as a deployment does: operator mode with its
// identities, TLS on client and route ports.
func TestClusterStopAndRejoin(t *testing.T) {
	start := time.Now()
	m, err := auth.Generate(auth.Options{Dir: t.TempDir(), Identities: []auth.Identity{{Name: "router-A", Role: auth.RoleRouter, Cluster: "A"}}})
	if err != nil {
		t.Fatal(err)
	}
	c := testenv.StartClusterWith(t, testenv.ClusterOptions{Nodes: 3, Auth: m})
	t.Logf("three-node cluster up and provisioned in %s", time.Since(start).Round(time.Millisecond))
	c.WaitCurrent(t, 20*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	stream := c.Names.SignalStream
	for _, name := range []string{stream, c.Names.ReportStream, "KV_" + c.Names.WeightsBucket} {
		s, err := c.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if r := s.CachedInfo().Config.Replicas; r != 3 {
			t.Fatalf("stream %s has %d replicas, want 3", name, r)
		}
	}
	kv, err := c.JS.KeyValue(ctx, c.Names.WeightsBucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []streams.ConnectOptions{{URLs: c.URLs()}, {URLs: c.URLs(), TLSCA: m.Path(auth.CAFile)}} {
		if nc, err := streams.Connect(ctx, o); err == nil {
			nc.Close()
			t.Fatalf("an anonymous client (TLS CA %q) connected to the cluster", o.TLSCA)
		}
	}
	rjs, err := jetstream.New(c.DialAs(t, "router-A"))
	if err != nil {
		t.Fatal(err)
	}
	rkv, err := rjs.KeyValue(ctx, c.Names.WeightsBucket)
	if err != nil {
		t.Fatalf("router-A reads %s: %v", c.Names.WeightsBucket, err)
	}
	pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
	if _, err := rkv.Put(pctx, "llama.A", []byte("forged")); err == nil {
		t.Fatal("router-A wrote the weights bucket")
	}
	pcancel()

	var acked []uint64
	publish := func(n int) {
		t.Helper()
		for range n {
			id := fmt.Sprintf("probe-%d", len(acked))
			var ack *jetstream.PubAck
			testenv.WaitFor(t, 10*time.Second, "publish "+id+" acknowledged", func() bool {
				pctx, pcancel := context.WithTimeout(ctx, time.Second)
				defer pcancel()
				ack, err = c.JS.Publish(pctx, "sy.signal.probe.probe", []byte(id), jetstream.WithMsgID(id))
				return err == nil
			})
			acked = append(acked, ack.Sequence)
		}
	}
	publish(10)
	if _, err := kv.Put(ctx, "probe.A", []byte("1")); err != nil {
		t.Fatal(err)
	}

	leader := c.StreamLeader(ctx, stream)
	victim := c.NodeIndex(leader)
	if victim < 0 {
		t.Fatalf("stream %s leader %q is not a node of the cluster", stream, leader)
	}
	stopped := time.Now()
	c.StopNode(t, victim)
	publish(10)
	if _, err := kv.Put(ctx, "probe.A", []byte("2")); err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped %s (leader of %s); writes resumed after %s", leader, stream, time.Since(stopped).Round(time.Millisecond))
	if l := c.StreamLeader(ctx, stream); l == "" || l == leader {
		t.Fatalf("stream %s leader after stopping %s: %q", stream, leader, l)
	}

	c.StartNode(t, victim)
	restarted := time.Now()
	c.WaitCurrent(t, 20*time.Second)
	last := acked[len(acked)-1]
	testenv.WaitFor(t, 10*time.Second, "restarted node holds every acknowledged message", func() bool {
		st, ok := c.LocalStreamState(victim, stream)
		return ok && st.LastSeq >= last
	})
	t.Logf("%s rejoined and caught up in %s", leader, time.Since(restarted).Round(time.Millisecond))

	for i, seq := range acked {
		m, err := c.JS.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := m.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("acknowledged message %d (seq %d) lost: %v", i, seq, err)
		}
		if want := fmt.Sprintf("probe-%d", i); string(raw.Data) != want {
			t.Fatalf("seq %d holds %q, want %q", seq, raw.Data, want)
		}
	}
	e, err := kv.Get(ctx, "probe.A")
	if err != nil || string(e.Value()) != "2" {
		t.Fatalf("probe.A after rejoin: %v %v", e, err)
	}
}
