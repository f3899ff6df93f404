package natsembed_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/streams/natsembed"
)

// TestOptionsValidate: every bad field is named in Validate's error (and
// Start's), which is ErrOptions; nothing is started for them.
func TestOptionsValidate(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		o    natsembed.Options
		want string
	}{
		{natsembed.Options{}, "DataDir is empty"},
		{natsembed.Options{DataDir: dir, Port: 70000}, "Port is 70000"},
		{natsembed.Options{DataDir: dir, Port: -2}, "Port is -2"},
		{natsembed.Options{DataDir: dir, LeafPort: 65536}, "LeafPort is 65536"},
		{natsembed.Options{DataDir: dir, HTTPPort: -5}, "HTTPPort is -5"},
		{natsembed.Options{DataDir: dir, ClusterName: "c", ClusterPort: -1}, "ServerName is empty"},
		{natsembed.Options{DataDir: dir, ServerName: "n", ClusterName: "c", ClusterPort: -1, Routes: []string{"::"}}, "Routes[0]"},
		{natsembed.Options{NoJetStream: true, LeafRemotes: []string{"host-only"}}, "LeafRemotes[0]"},
		{natsembed.Options{DataDir: dir, StartTimeout: -time.Second}, "StartTimeout is -1s"},
		{natsembed.Options{DataDir: dir, LeafRemoteTLS: natsembed.TLS{CAFile: "ca.pem"}}, "LeafRemoteTLS is set without LeafRemotes"},
		{natsembed.Options{NoJetStream: true, LeafRemotes: []string{"nats-leaf://h:7422"}, LeafRemoteTLS: natsembed.TLS{CertFile: "c.pem", KeyFile: "k.pem"}}, "LeafRemoteTLS.CAFile is empty"},
		{natsembed.Options{NoJetStream: true, LeafRemotes: []string{"nats-leaf://h:7422"}, LeafRemoteTLS: natsembed.TLS{CAFile: "ca.pem", CertFile: "c.pem"}}, "want both or neither"},
	}
	for _, c := range cases {
		if err := c.o.Validate(); !errors.Is(err, natsembed.ErrOptions) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: Validate = %v, want an ErrOptions naming %q", c.o, err, c.want)
		}
		if srv, err := natsembed.Start(c.o); !errors.Is(err, natsembed.ErrOptions) {
			if srv != nil {
				srv.Shutdown()
			}
			t.Errorf("%+v: Start = %v, want ErrOptions", c.o, err)
		}
	}
	for _, ok := range []natsembed.Options{{DataDir: dir}, {NoJetStream: true, Port: natsembed.RandomPort}} {
		if err := ok.Validate(); err != nil {
			t.Errorf("%+v: %v", ok, err)
		}
	}
	if d := (natsembed.Options{}).WithDefaults(); d.Host != natsembed.DefaultHost || d.StartTimeout != natsembed.DefaultStartTimeout {
		t.Errorf("defaults %+v", d)
	}
}
