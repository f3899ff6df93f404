package dashboard_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/dashboard"
	"github.com/switchyard-dev/switchyard/streams"
)

// TestOptionsValidate: every bad field is named in Validate's error (and
// New's), which is ErrOptions.
func TestOptionsValidate(t *testing.T) {
	cases := []struct {
		o    dashboard.Options
		want string
	}{
		{dashboard.Options{History: -time.Second}, "History is -1s"},
		{dashboard.Options{SampleInterval: -time.Second}, "SampleInterval is -1s"},
		{dashboard.Options{History: time.Second, SampleInterval: time.Second}, "fewer than two samples"},
		{dashboard.Options{History: time.Hour, SampleInterval: time.Millisecond}, "more than 100000 samples"},
		{dashboard.Options{Names: streams.Names{Prefix: "x"}}, "Names"},
	}
	for _, c := range cases {
		if err := c.o.Validate(); !errors.Is(err, dashboard.ErrOptions) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate = %v, want an ErrOptions naming %q", err, c.want)
		}
		if _, err := dashboard.New(c.o); !errors.Is(err, dashboard.ErrOptions) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New = %v, want an ErrOptions naming %q", err, c.want)
		}
	}
	if err := (dashboard.Options{}).Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := dashboard.New(dashboard.Options{}); !errors.Is(err, dashboard.ErrOptions) || !strings.Contains(err.Error(), "Conn") {
		t.Errorf("New without Conn = %v, want an ErrOptions naming Conn", err)
	}
	if d := (dashboard.Options{}).WithDefaults(); d.History != dashboard.DefaultHistory || d.SampleInterval != dashboard.DefaultSampleInterval {
		t.Errorf("defaults %+v", d)
	}
}
