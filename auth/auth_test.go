package auth_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/auth"
	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/streams/natsembed"
)

func TestGenerateServeAndRefuse(t *testing.T) {
	dir := t.TempDir()
	opts := auth.Options{Dir: dir + "/auth", Identities: []auth.Identity{
		{Name: "engine-a", Role: auth.RoleEngine}, {Name: "engine-b", Role: auth.RoleEngine},
		{Name: "router-A", Role: auth.RoleRouter, Cluster: "A"},
	}}
	m, err := auth.Generate(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := natsembed.Start(natsembed.Options{DataDir: dir + "/js", Port: natsembed.RandomPort, Auth: m.ServerAuth(), TLS: m.ServerTLS(false)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	url := srv.ClientURL()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	if nc, err := streams.Connect(ctx, streams.ConnectOptions{URLs: []string{url}, TLSCA: m.Path(auth.CAFile), Logger: zerolog.Nop()}); err == nil {
		nc.Close()
		t.Fatal("an anonymous client connected")
	}
	if nc, err := streams.Connect(ctx, streams.ConnectOptions{URLs: []string{url}, Creds: m.CredsFile("engine-b"), Logger: zerolog.Nop()}); err == nil {
		nc.Close()
		t.Fatal("a client connected without TLS")
	}
	connect := func(id string) (*nats.Conn, chan error) {
		errs := make(chan error, 16)
		o := m.Connect(id, false, streams.ConnectOptions{URLs: []string{url}, Logger: zerolog.Nop()})
		nc, err := streams.Connect(ctx, o)
		if err != nil {
			t.Fatalf("connect as %s: %v", id, err)
		}
		nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err })
		t.Cleanup(nc.Close)
		return nc, errs
	}
	admin, _ := connect("admin")
	seen, err := admin.SubscribeSync("sy.signal.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Flush(); err != nil {
		t.Fatal(err)
	}
	eng, errs := connect("engine-b")
	if !strings.HasPrefix(eng.NewInbox(), "_INBOX_engine-b.") {
		t.Fatalf("engine-b's inbox is %s, want _INBOX_engine-b.*", eng.NewInbox())
	}
	_ = eng.Publish("sy.signal.m.engine-a", []byte("forged"))
	if err := waitViolation(errs); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.SubscribeSync("sy.req.>"); err == nil {
		_ = eng.Flush()
		if err := waitViolation(errs); err != nil {
			t.Fatal("engine-b subscribed to sy.req.>: ", err)
		}
	}
	if err := eng.Publish("sy.signal.m.engine-b", []byte("own")); err != nil {
		t.Fatal(err)
	}
	msg, err := seen.NextMsg(5 * time.Second)
	if err != nil || msg.Subject != "sy.signal.m.engine-b" {
		t.Fatalf("admin saw %v, %v; want engine-b's own signal only", msg, err)
	}

	rt, rerrs := connect("router-A")
	if _, err := rt.SubscribeSync("sy.req.A.m"); err == nil {
		_ = rt.Flush()
		if err := waitViolation(rerrs); err != nil {
			t.Fatal("router-A subscribed to sy.req.A.m outside its queue group: ", err)
		}
	}
	if _, err := rt.QueueSubscribeSync("sy.req.A.m", streams.RequestQueue("A")); err != nil {
		t.Fatal(err)
	}
	if err := rt.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-rerrs:
		t.Fatalf("router-A in its queue group: %v", err)
	case <-time.After(200 * time.Millisecond):
	}

	// Generating again reuses the keys: credentials issued before still work.
	old := m.CredsFile("engine-a")
	if _, err := auth.Generate(opts); err != nil {
		t.Fatal(err)
	}
	loaded, err := auth.Load(opts.Dir)
	if err != nil || loaded.AccountKey != m.AccountKey {
		t.Fatalf("Load: %v, account %s, want %s", err, loaded.AccountKey, m.AccountKey)
	}
	if nc, err := streams.Connect(ctx, streams.ConnectOptions{URLs: []string{url}, Creds: old, TLSCA: m.Path(auth.CAFile), Logger: zerolog.Nop()}); err != nil {
		t.Fatalf("re-issued credentials refused: %v", err)
	} else {
		nc.Close()
	}
}

func waitViolation(errs chan error) error {
	select {
	case err := <-errs:
		if strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			return nil
		}
		return err
	case <-time.After(5 * time.Second):
		return errors.New("no permissions violation reported within 5 s")
	}
}

func TestIdentityValidate(t *testing.T) {
	for _, id := range []auth.Identity{
		{Name: "", Role: auth.RoleAdmin},
		{Name: "x.y", Role: auth.RoleAdmin},
		{Name: "x", Role: "boss"},
		{Name: "r", Role: auth.RoleRouter},
		{Name: "ag", Role: auth.RoleAgent},
	} {
		if err := id.Validate(); !errors.Is(err, auth.ErrIdentity) {
			t.Errorf("%+v: Validate() = %v, want ErrIdentity", id, err)
		}
	}
	if err := (auth.Options{}).Validate(); !errors.Is(err, auth.ErrOptions) {
		t.Errorf("Options{}.Validate() = %v, want ErrOptions", err)
	}
}
