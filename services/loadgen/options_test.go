package loadgen_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/services/loadgen"
)

// TestOptionsValidate: every bad field is named in Validate's error (and
// Run's), which is ErrOptions; nothing is sent for them.
func TestOptionsValidate(t *testing.T) {
	good := loadgen.Options{URL: "http://127.0.0.1:1", Model: "m"}
	cases := []struct {
		mut  func(*loadgen.Options)
		want string
	}{
		{func(o *loadgen.Options) { o.URL = "" }, "URL"},
		{func(o *loadgen.Options) { o.URL = "127.0.0.1:8081" }, "URL"},
		{func(o *loadgen.Options) { o.URL = "ftp://h" }, "URL"},
		{func(o *loadgen.Options) { o.Model = "" }, "Model is empty"},
		{func(o *loadgen.Options) { o.StreamFraction = math.NaN() }, "StreamFraction is NaN"},
		{func(o *loadgen.Options) { o.MaxInFlight = -1 }, "MaxInFlight is -1"},
		{func(o *loadgen.Options) { o.MaxPromptBytes = -1 }, "MaxPromptBytes is -1"},
		{func(o *loadgen.Options) { o.MaxOutputTokens = -1 }, "MaxOutputTokens is -1"},
		{func(o *loadgen.Options) { o.Duration = -time.Second }, "Duration is -1s"},
	}
	for _, c := range cases {
		o := good
		c.mut(&o)
		if err := o.Validate(); !errors.Is(err, loadgen.ErrOptions) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate = %v, want an ErrOptions naming %q", err, c.want)
		}
		if _, err := loadgen.Run(t.Context(), o); !errors.Is(err, loadgen.ErrOptions) {
			t.Errorf("Run = %v, want ErrOptions", err)
		}
	}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	if d := good.WithDefaults(); d.MaxInFlight != loadgen.DefaultMaxInFlight || d.MaxPromptBytes != loadgen.DefaultMaxPromptBytes {
		t.Errorf("defaults %+v", d)
	}
}
