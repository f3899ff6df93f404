package agent_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/services/agent"
)

// TestOptionsValidate: every bad field, an engine's included, is named in
// Validate's error (and New's), which is ErrOptions; Validate needs no
// connection, New does (ErrNoConn).
func TestOptionsValidate(t *testing.T) {
	good := agent.Options{Engines: []agent.EngineConfig{engineConfig("v1", "http://127.0.0.1:8000")}}
	cases := []struct {
		mut  func(*agent.Options)
		want string
	}{
		{func(o *agent.Options) { o.Engines = nil }, "Options.Engines is empty"},
		{func(o *agent.Options) { o.Interval = time.Millisecond }, "Options.Interval is 1ms"},
		{func(o *agent.Options) { o.ScrapeTimeout = -time.Second }, "Options.ScrapeTimeout is -1s"},
		{func(o *agent.Options) { o.StaleAfter = 100 * time.Millisecond }, "Options.StaleAfter is 100ms"},
		{func(o *agent.Options) { o.HealthFailures = -1 }, "Options.HealthFailures is -1"},
		{func(o *agent.Options) { o.MaxBodyBytes = 10 }, "Options.MaxBodyBytes is 10"},
		{func(o *agent.Options) { o.Engines[0].URL = "127.0.0.1:8000" }, "Options.Engines[0].URL"},
		{func(o *agent.Options) { o.Engines[0].Format = "tgi2" }, "Options.Engines[0].Format"},
		{func(o *agent.Options) { o.Engines = append(o.Engines, o.Engines[0]) }, "given twice"},
	}
	for _, c := range cases {
		o := good
		o.Engines = append([]agent.EngineConfig(nil), good.Engines...)
		c.mut(&o)
		if err := o.Validate(); !errors.Is(err, agent.ErrOptions) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate = %v, want an ErrOptions naming %q", err, c.want)
		}
		if _, err := agent.New(o); !errors.Is(err, agent.ErrOptions) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New = %v, want an ErrOptions naming %q", err, c.want)
		}
	}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.New(good); !errors.Is(err, agent.ErrNoConn) {
		t.Errorf("New without Conn = %v, want ErrNoConn", err)
	}
	d := good.WithDefaults()
	if d.Interval != agent.DefaultInterval || d.StaleAfter != agent.DefaultStaleAfter || d.Engines[0].MetricsPath != agent.DefaultMetricsPath || good.Engines[0].MetricsPath != "" {
		t.Errorf("defaults %+v (or WithDefaults changed its receiver's engines)", d)
	}
}
