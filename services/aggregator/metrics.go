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
	dropped   prometheus.Counter
	repairs   prometheus.Counter
	recreated prometheus.Counter
	forgotten *prometheus.CounterVec
	// refused counts signals not folded in because the endpoint policy
	// refuses what they advertise, by auth/endpoints reason.
	refused *prometheus.CounterVec
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
		repairs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_aggregator_layout_repairs_total", Help: "Deleted streams and buckets the aggregator re-provisioned."}),
		recreated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_aggregator_consumers_recreated_total", Help: "Durable consumers re-created after they or their stream were deleted."}),
		forgotten: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_aggregator_forgotten_total", Help: "State entries dropped after ForgetAfter of silence, by kind (engine, demand, rtt)."},
			[]string{"kind"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_aggregator_endpoints_refused_total",
			Help: "Engine signals not folded in because the operator's endpoint policy refuses the URL or subject they advertise, by reason (model, url, subject, dns)."},
			[]string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.signals, m.reports, m.duplicates, m.bad, m.writes, m.lag, m.engines, m.repairs, m.recreated, m.forgotten, m.dropped, m.refused)
	}
	return m
}
