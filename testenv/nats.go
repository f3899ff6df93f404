package testenv

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/switchyard-dev/switchyard/auth"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/streams/natsembed"
)

// NATS is an embedded JetStream server started for one test, with a client
// connection and the Switchyard layout provisioned.
type NATS struct {
	Server *natsembed.Server
	Conn   *nats.Conn
	JS     jetstream.JetStream
	Names  streams.Names
	// DataDir is the server's store directory (reused by Restart).
	DataDir string
	// Port is the client port, kept across Restart.
	Port int
	// Auth, set by StartSecureNATS, is the server's operator and TLS
	// material: Conn and Dial are its admin identity, DialAs another.
	Auth *auth.Material
}

// StartNATS starts an embedded JetStream server on a random 127.0.0.1 port in
// a temporary directory, connects to it, provisions the layout, and stops
// everything when the test ends.
func StartNATS(tb testing.TB) *NATS {
	tb.Helper()
	n := &NATS{DataDir: tb.TempDir(), Names: streams.DefaultNames()}
	n.start(tb, -1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := streams.Provision(ctx, n.JS, n.Names, streams.ProvisionOptions{}); err != nil {
		tb.Fatalf("provision: %v", err)
	}
	tb.Cleanup(n.Stop)
	return n
}

// StartSecureNATS is StartNATS with the server in operator mode and TLS on
// its client port, as a deployment runs it: identities get credentials
// (an admin is always added), and anonymous clients are refused.
func StartSecureNATS(tb testing.TB, identities ...auth.Identity) *NATS {
	tb.Helper()
	m, err := auth.Generate(auth.Options{Dir: tb.TempDir(), Identities: identities})
	if err != nil {
		tb.Fatalf("testenv: auth material: %v", err)
	}
	n := &NATS{DataDir: tb.TempDir(), Names: streams.DefaultNames(), Auth: m}
	n.start(tb, -1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := streams.Provision(ctx, n.JS, n.Names, streams.ProvisionOptions{}); err != nil {
		tb.Fatalf("provision: %v", err)
	}
	tb.Cleanup(n.Stop)
	return n
}

func (n *NATS) serverOptions(port int) natsembed.Options {
	o := natsembed.Options{DataDir: n.DataDir, Port: port}
	if n.Auth != nil {
		o.Auth, o.TLS = n.Auth.ServerAuth(), n.Auth.ServerTLS(false)
	}
	return o
}

func (n *NATS) start(tb testing.TB, port int) {
	tb.Helper()
	srv, err := natsembed.Start(n.serverOptions(port))
	if err != nil {
		tb.Fatalf("start embedded NATS: %v", err)
	}
	n.Server = srv
	n.Port = srv.Server().Addr().(*net.TCPAddr).Port
	n.Conn = n.Dial(tb, "test")
	js, err := jetstream.New(n.Conn)
	if err != nil {
		tb.Fatalf("jetstream: %v", err)
	}
	n.JS = js
}

// URL returns the server's client URL.
func (n *NATS) URL() string { return n.Server.ClientURL() }

// Dial opens another connection to the server, closed when the test ends.
func (n *NATS) Dial(tb testing.TB, name string) *nats.Conn {
	tb.Helper()
	return n.dial(tb, name, "admin")
}

// DialAs opens a connection as identity of a StartSecureNATS server,
// closed when the test ends.
func (n *NATS) DialAs(tb testing.TB, identity string) *nats.Conn {
	tb.Helper()
	return n.dial(tb, identity, identity)
}

func (n *NATS) dial(tb testing.TB, name, identity string) *nats.Conn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	o := streams.ConnectOptions{URLs: []string{n.URL()}, Name: name, Logger: zerolog.Nop(), ReconnectWait: 50 * time.Millisecond}
	if n.Auth != nil {
		o = n.Auth.Connect(identity, false, o)
	}
	nc, err := streams.Connect(ctx, o)
	if err != nil {
		tb.Fatalf("connect: %v", err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// StopServer stops only the server, keeping its store and port for StartServer;
// clients stay open and reconnect when it returns.
func (n *NATS) StopServer() {
	if n.Server != nil {
		n.Server.Shutdown()
		n.Server = nil
	}
}

// StartServer starts the server again on the same port and store.
func (n *NATS) StartServer(tb testing.TB) {
	tb.Helper()
	srv, err := natsembed.Start(n.serverOptions(n.Port))
	if err != nil {
		tb.Fatalf("restart embedded NATS on port %d: %v", n.Port, err)
	}
	n.Server = srv
}

// Stop shuts the server down; safe to call more than once.
func (n *NATS) Stop() {
	if n.Conn != nil {
		n.Conn.Close()
		n.Conn = nil
	}
	if n.Server != nil {
		n.Server.Shutdown()
		n.Server = nil
	}
}
