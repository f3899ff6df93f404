package optimizersvc_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/services/optimizersvc"
	"github.com/switchyard-dev/switchyard/streams"
)

// TestOptionsValidate: every bad field, the penalty rules' included, is
// named in Validate's error (and New's), which is ErrOptions.
func TestOptionsValidate(t *testing.T) {
	pen := func(p optimizersvc.PenaltyOptions) optimizersvc.Options { return optimizersvc.Options{Penalties: p} }
	cases := []struct {
		name string
		o    optimizersvc.Options
		want string
	}{
		{"instance", optimizersvc.Options{Instance: "a b"}, "Instance"},
		{"cluster", optimizersvc.Options{Clusters: []string{"a.b"}}, "Clusters"},
		{"network", optimizersvc.Options{NetworkMs: map[string]map[string]float64{"A": {"e1": math.Inf(1)}}}, "NetworkMs[A][e1]"},
		{"min demand", optimizersvc.Options{MinDemandRPS: -1}, "MinDemandRPS is -1"},
		{"target", optimizersvc.Options{TargetUtilisation: 1.5}, "TargetUtilisation is 1.5"},
		{"engine target", optimizersvc.Options{EngineTargetUtilisation: map[string]float64{"e1": 0}}, "EngineTargetUtilisation[e1]"},
		{"intervals", optimizersvc.Options{MinInterval: 3 * time.Second}, "MinInterval 3s and MaxInterval 2s"},
		{"heartbeat", optimizersvc.Options{Heartbeat: time.Second}, "Heartbeat 1s is shorter than MaxInterval"},
		{"lease", optimizersvc.Options{LeaseTTL: time.Millisecond}, "LeaseTTL 1ms"},
		{"provision", optimizersvc.Options{Provision: streams.ProvisionOptions{WeightsHistory: 100}}, "Provision: streams: invalid options: WeightsHistory is 100"},
		{"error floor", pen(optimizersvc.PenaltyOptions{ErrorRateFloor: 2}), "Penalties.ErrorRateFloor is 2"},
		{"max share", pen(optimizersvc.PenaltyOptions{MaxShare: math.NaN()}), "Penalties.MaxShare is NaN"},
		{"growth", pen(optimizersvc.PenaltyOptions{Growth: 0.5}), "Penalties.Growth is 0.5"},
		{"failed intervals", pen(optimizersvc.PenaltyOptions{FailedIntervals: -1}), "Penalties.FailedIntervals is -1"},
		{"slow start negative", pen(optimizersvc.PenaltyOptions{SlowStart: -time.Second}), "Penalties.SlowStart is -1s"},
		{"strike decay negative", pen(optimizersvc.PenaltyOptions{StrikeDecay: -time.Second}), "Penalties.StrikeDecay is -1s"},
		{"base over max", pen(optimizersvc.PenaltyOptions{Base: 10 * time.Minute}), "Penalties.Base 10m0s is longer than Penalties.Max 5m0s"},
		{"max span", pen(optimizersvc.PenaltyOptions{Max: 48 * time.Hour}), "Penalties.Max is 48h0m0s"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.o.Validate()
			if !errors.Is(err, optimizersvc.ErrOptions) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Validate = %v, want an ErrOptions naming %q", err, c.want)
			}
			if _, err := optimizersvc.New(c.o); !errors.Is(err, optimizersvc.ErrOptions) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("New = %v, want an ErrOptions naming %q", err, c.want)
			}
		})
	}
	for _, ok := range []optimizersvc.Options{{}, pen(optimizersvc.PenaltyOptions{NoSlowStart: true, NoStrikeDecay: true})} {
		if err := ok.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", ok.Penalties, err)
		}
	}
	if _, err := optimizersvc.New(optimizersvc.Options{}); !errors.Is(err, optimizersvc.ErrOptions) || !strings.Contains(err.Error(), "Conn") {
		t.Errorf("New without Conn = %v, want an ErrOptions naming Conn", err)
	}
	d := optimizersvc.Options{}.WithDefaults()
	if d.Instance == "" || d.TargetUtilisation != 1 || d.Heartbeat != 10*time.Second || d.Penalties.SlowStart != 10*time.Second ||
		d.Penalties.StrikeDecay != time.Minute || d.Provision.WeightsHistory != 16 {
		t.Errorf("defaults %+v", d)
	}
}
