package aggregator

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	signals    prometheus.Counter
	reports    prometheus.Counter
	duplicates prometheus.Counter
	bad        *prometheus.CounterVec
	writes     prometheus.Counter
	lag        prometheus.Gauge
	engines    *prometheus.GaugeVec
	// dropped counts router entries removed from a demand state that did
	// not encode.
	dropped prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		signals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_aggregator_signals_total", Help: "Engine signals folded in."}),
		reports: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_aggregator_reports_total", Help: "Router reports folded in."}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_aggregator_duplicates_total", Help: "Redelivered or out-of-order messages skipped."}),
		bad: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_aggregator_bad_messages_total", Help: "Messages that failed to decode or validate, terminated."},
			[]string{"stream", "reason"}),
		writes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_aggregator_kv_writes_total", Help: "State values written to KV."}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_aggregator_lag_seconds", Help: "Age of the newest signal when it was folded in."}),
		engines: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_aggregator_engines", Help: "Engines by status."}, []string{"status"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_aggregator_demand_routers_dropped_total",
			Help: "Routers' entries dropped from a cluster's demand state because it did not encode with them."}),
	}
	if reg != nil {
		reg.MustRegister(m.dropped)
		reg.MustRegister(m.signals, m.reports, m.duplicates, m.bad, m.writes, m.lag, m.engines)
	}
	return m
}
