package aggregator_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/services/aggregator"
	"github.com/switchyard-dev/switchyard/streams"
)

// TestOptionsValidate: every bad field is named in Validate's error (and
// New's), which is ErrOptions; the zero value is valid and its defaults
// are the documented ones.
func TestOptionsValidate(t *testing.T) {
	cases := []struct {
		name string
		o    aggregator.Options
		want string
	}{
		{"bad durable", aggregator.Options{Durable: "a.b"}, `Durable "a.b"`},
		{"bad names", aggregator.Options{Names: streams.Names{Prefix: "x"}}, "Names"},
		{"negative half-life", aggregator.Options{FastHalfLife: -time.Second}, "FastHalfLife is -1s"},
		{"negative write interval", aggregator.Options{WriteInterval: -time.Millisecond}, "WriteInterval is -1ms"},
		{"stale after down", aggregator.Options{StaleAfter: 7 * time.Second}, "StaleAfter 7s must be shorter than DownAfter 6s"},
		{"forget before down", aggregator.Options{ForgetAfter: 5 * time.Second}, "ForgetAfter 5s"},
		{"provision replicas", aggregator.Options{Provision: streams.ProvisionOptions{Replicas: 9}}, "Provision: streams: invalid options: Replicas is 9"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.o.Validate()
			if !errors.Is(err, aggregator.ErrOptions) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Validate = %v, want an ErrOptions naming %q", err, c.want)
			}
			if _, err := aggregator.New(c.o); !errors.Is(err, aggregator.ErrOptions) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("New = %v, want an ErrOptions naming %q", err, c.want)
			}
		})
	}
	if err := (aggregator.Options{}).Validate(); err != nil {
		t.Fatalf("zero Options: %v", err)
	}
	if _, err := aggregator.New(aggregator.Options{}); !errors.Is(err, aggregator.ErrOptions) || !strings.Contains(err.Error(), "Conn") {
		t.Errorf("New without Conn = %v, want an ErrOptions naming Conn", err)
	}
	d := aggregator.Options{}.WithDefaults()
	if d.Durable != "sy-aggregator" || d.StaleAfter != 2*time.Second || d.DownAfter != 6*time.Second ||
		d.ForgetAfter != aggregator.DefaultForgetAfter || d.Names != streams.DefaultNames() || d.Provision.LeaseTTL != 3*time.Second {
		t.Errorf("defaults %+v", d)
	}
	if o := (aggregator.Options{StaleAfter: time.Second}); o.WithDefaults().StaleAfter != time.Second || o.StaleAfter != time.Second {
		t.Error("WithDefaults overrides a set field or changes its receiver")
	}
}
