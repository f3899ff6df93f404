package natsembed_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/streams/natsembed"
)

func TestEmbeddedPortInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	_, err = natsembed.Start(natsembed.Options{DataDir: t.TempDir(), Port: port})
	if !errors.Is(err, natsembed.ErrPortInUse) {
		t.Fatalf("got %v, want ErrPortInUse", err)
	}
	if want := strconv.Itoa(port); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v does not name port %s", err, want)
	}
}

func TestEmbeddedInProcess(t *testing.T) {
	srv, err := natsembed.Start(natsembed.Options{DataDir: t.TempDir(), Port: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	if srv.ClientURL() != "" {
		t.Fatalf("in-process server has a client URL %q", srv.ClientURL())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nc, err := streams.Connect(ctx, streams.ConnectOptions{InProcess: srv.Server(), Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if err := streams.Provision(ctx, js, streams.DefaultNames(), streams.ProvisionOptions{}); err != nil {
		t.Fatal(err)
	}
}
