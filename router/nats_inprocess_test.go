package router_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestServiceInProcessConnection runs a router connected in-process to its
// NATS server (nats.InProcessServer, as `switchyard router --embed-nats`
// and `switchyard up` connect it) and checks that it routes NATS requests
// to an engine connected over TCP, installs snapshots, and, when the server
// drops the in-process connection, reconnects in-process, re-creates its
// weights watch and front subscription, and carries on.
func TestServiceInProcessConnection(t *testing.T) {
	env := testenv.StartNATS(t)
	startSimEngine(t, env, "s1")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rc, err := streams.Connect(ctx, streams.ConnectOptions{InProcess: env.Server.Server(), Name: "router-in-process",
		Logger: zerolog.Nop(), ReconnectWait: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	svc := runService(t, router.ServiceOptions{Conn: rc, Cluster: "A", Router: "r1", PreferNATS: true})

	client := env.Dial(t, "client")
	ask := func() bool {
		msgs, err := natsTry(t, client, "sy.req.A.llama", chatJSON("llama", false, "hello"), nil)
		return err == nil && len(msgs) == 1 && msgs[0].Header.Get(messages.HeaderStatus) == "200" && msgs[0].Header.Get("x-switchyard-engine") == "s1"
	}
	testenv.WaitFor(t, 5*time.Second, "a NATS request routed in-process to s1", ask)
	installed := func(gen uint64) func() bool {
		return func() bool {
			_, info, ok := svc.Store().Table("llama")
			return ok && info.Mode == control.ModeSnapshot && info.Generation == gen
		}
	}
	putSnapshot(t, env.JS, env.Names, snapshot("llama", "A", 1, time.Now(), map[string]float64{"s1": 1}))
	testenv.WaitFor(t, 5*time.Second, "snapshot 1 installed", installed(1))

	// The connection is the in-process one: the server lists it without a
	// client port. Kick it.
	cz, err := env.Server.Server().Connz(&server.ConnzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var cid uint64
	for _, c := range cz.Conns {
		if c.Name == "router-in-process" {
			if c.Port != 0 {
				t.Fatalf("router's connection has client port %d, want an in-process one", c.Port)
			}
			cid = c.Cid
		}
	}
	if cid == 0 {
		t.Fatalf("the server does not list the router's connection: %+v", cz.Conns)
	}
	if err := env.Server.Server().DisconnectClientByID(cid); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the router reconnects in-process", func() bool {
		return rc.Stats().Reconnects >= 1 && rc.IsConnected()
	})
	putSnapshot(t, env.JS, env.Names, snapshot("llama", "A", 2, time.Now(), map[string]float64{"s1": 1}))
	testenv.WaitFor(t, 10*time.Second, "snapshot 2 installed after the reconnect", installed(2))
	testenv.WaitFor(t, 5*time.Second, "NATS requests routed again after the reconnect", ask)
}
