package streams_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/streams"
)

// TestProvisionOptionsValidate: every bad field is named in Validate's
// error, which is ErrOptions; Provision refuses them the same way.
func TestProvisionOptionsValidate(t *testing.T) {
	cases := []struct {
		o    streams.ProvisionOptions
		want string
	}{
		{streams.ProvisionOptions{Replicas: -1}, "Replicas is -1"},
		{streams.ProvisionOptions{Replicas: 6}, "Replicas is 6"},
		{streams.ProvisionOptions{SignalMaxAge: -time.Second}, "SignalMaxAge is -1s"},
		{streams.ProvisionOptions{DedupWindow: -time.Second}, "DedupWindow is -1s"},
		{streams.ProvisionOptions{LeaseTTL: 500 * time.Millisecond}, "LeaseTTL is 500ms"},
		{streams.ProvisionOptions{WeightsHistory: 65}, "WeightsHistory is 65"},
		{streams.ProvisionOptions{StateMaxBytes: -1}, "StateMaxBytes is -1"},
		{streams.ProvisionOptions{SignalMaxPerSubject: -1}, "SignalMaxPerSubject is -1"},
	}
	for _, c := range cases {
		if err := c.o.Validate(); !errors.Is(err, streams.ErrOptions) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: Validate = %v, want an ErrOptions naming %q", c.o, err, c.want)
		}
		if err := streams.Provision(t.Context(), nil, streams.DefaultNames(), c.o); !errors.Is(err, streams.ErrOptions) {
			t.Errorf("%+v: Provision = %v, want ErrOptions", c.o, err)
		}
	}
	for _, ok := range []streams.ProvisionOptions{{}, {Replicas: 3}, {NoSignalMaxPerSubject: true}} {
		if err := ok.Validate(); err != nil {
			t.Errorf("%+v: %v", ok, err)
		}
	}
	d := streams.ProvisionOptions{}.WithDefaults()
	if d.Replicas != 0 || d.SignalMaxAge != 5*time.Minute || d.SignalMaxPerSubject != streams.DefaultSignalMaxPerSubject {
		t.Errorf("defaults %+v", d)
	}
	// No per-subject limit is JetStream's -1 on the signal stream.
	for _, c := range []struct {
		o    streams.ProvisionOptions
		want int64
	}{{streams.ProvisionOptions{}, streams.DefaultSignalMaxPerSubject}, {streams.ProvisionOptions{NoSignalMaxPerSubject: true}, -1}} {
		if got := streams.Streams(streams.DefaultNames(), c.o)[0].MaxMsgsPerSubject; got != c.want {
			t.Errorf("%+v: signal stream MaxMsgsPerSubject %d, want %d", c.o, got, c.want)
		}
	}
}

// TestConnectOptionsValidate: bad URLs and waits are named, with a URL's
// password redacted.
func TestConnectOptionsValidate(t *testing.T) {
	cases := []struct {
		o    streams.ConnectOptions
		want string
	}{
		{streams.ConnectOptions{}, "no NATS URL"},
		{streams.ConnectOptions{URLs: []string{" , "}}, "no NATS URL"},
		{streams.ConnectOptions{URLs: []string{"nats://a:4222,nats://"}}, `URLs[1] "nats://"`},
		{streams.ConnectOptions{URLs: []string{"nats://u:hunter2@:4222"}}, "URLs[0]"},
		{streams.ConnectOptions{URLs: []string{"127.0.0.1:4222"}, ReconnectWait: -time.Second}, "ReconnectWait is -1s"},
	}
	for _, c := range cases {
		err := c.o.Validate()
		if !errors.Is(err, streams.ErrOptions) || !strings.Contains(err.Error(), c.want) || strings.Contains(fmtErr(err), "hunter2") {
			t.Errorf("%+v: Validate = %v, want an ErrOptions naming %q without the password", c.o, err, c.want)
		}
		if _, err := streams.Connect(t.Context(), c.o); !errors.Is(err, streams.ErrOptions) {
			t.Errorf("%+v: Connect = %v, want ErrOptions", c.o, err)
		}
	}
	d := streams.ConnectOptions{URLs: []string{"nats://a:4222, nats://b:4222", ""}}.WithDefaults()
	if len(d.URLs) != 2 || d.URLs[1] != "nats://b:4222" || d.ReconnectWait != streams.DefaultReconnectWait {
		t.Errorf("defaults %+v", d)
	}
	if err := d.Validate(); err != nil {
		t.Error(err)
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
