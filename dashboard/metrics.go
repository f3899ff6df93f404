package dashboard

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-dev/switchyard/internal/enginestate"
)

// stateCollector exports every engine's state as
// switchyard_dashboard_engine_state{model,engine,state}: 1 for the state
// the engine is in, 0 for the others, computed when scraped from the same
// records as /api/state.
type stateCollector struct {
	d    *Dashboard
	desc *prometheus.Desc
}

func newStateCollector(d *Dashboard) *stateCollector {
	return &stateCollector{d: d, desc: prometheus.NewDesc("switchyard_dashboard_engine_state",
		"Each engine's state as the dashboard and switchyard engine list show it: 1 for its state, 0 for the others.",
		[]string{"model", "engine", "state"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	d := c.d
	now := d.opts.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, e := range d.engines {
		v := d.verdictLocked(e, now)
		for _, s := range enginestate.All {
			val := 0.0
			if s == v.State {
				val = 1
			}
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, val, e.Model, e.Engine, string(s))
		}
	}
}
