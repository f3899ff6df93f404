package engine_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/services/engine"
)

// TestOptionsValidate: every bad field is named in Validate's error (and
// NewPublisher's), which is ErrOptions.
func TestOptionsValidate(t *testing.T) {
	good := engine.Options{Model: "llama", Engine: "e1"}
	cases := []struct {
		mut  func(*engine.Options)
		want string
	}{
		{func(o *engine.Options) { o.Model = "" }, "Model"},
		{func(o *engine.Options) { o.Engine = "a.b" }, "Engine"},
		{func(o *engine.Options) { o.Region = "r 1" }, "Region"},
		{func(o *engine.Options) { o.Interval = -time.Second }, "Interval is -1s"},
		{func(o *engine.Options) { o.PublishTimeout = -time.Second }, "PublishTimeout is -1s"},
		{func(o *engine.Options) { o.Names.Prefix = "x" }, "Names"},
	}
	for _, c := range cases {
		o := good
		c.mut(&o)
		if err := o.Validate(); !errors.Is(err, engine.ErrOptions) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate = %v, want an ErrOptions naming %q", err, c.want)
		}
		if _, err := engine.NewPublisher(o); !errors.Is(err, engine.ErrOptions) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewPublisher = %v, want an ErrOptions naming %q", err, c.want)
		}
	}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.NewPublisher(good); !errors.Is(err, engine.ErrOptions) || !strings.Contains(err.Error(), "Conn") {
		t.Errorf("NewPublisher without Conn = %v, want an ErrOptions naming Conn", err)
	}
	if d := good.WithDefaults(); d.Interval != engine.DefaultInterval || d.PublishTimeout != time.Second || d.FirstSeq != 0 {
		t.Errorf("defaults %+v", d)
	}
}
