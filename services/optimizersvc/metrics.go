package optimizersvc

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	solveDuration *prometheus.HistogramVec
	solveErrors   prometheus.Counter
	outOfTime     *prometheus.CounterVec
	gap           *prometheus.GaugeVec
	generations   prometheus.Counter
	conflicts     prometheus.Counter
	leader        prometheus.Gauge
	problems      prometheus.Gauge
	clusters      prometheus.Gauge
	engines       prometheus.Gauge
	refused       prometheus.Gauge
	bad           *prometheus.CounterVec
	penalised     prometheus.Gauge
	penalties     *prometheus.CounterVec
	operator      *prometheus.GaugeVec
	slowStart     *prometheus.GaugeVec
	// Weights keys whose stored value could not be followed.
	generationAhead prometheus.Counter
	overwritten     prometheus.Counter
	repairs         prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		solveDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "switchyard_optimizer_solve_duration_seconds",
			Help:    "Wall time of one model's solve, by the solver path that answered (optimizer.Diagnostics.Path: levels, newton, auction, each maybe +sweeps, or sweeps).",
			Buckets: prometheus.ExponentialBuckets(1e-5, 4, 12)}, []string{"path"}),
		solveErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_optimizer_solve_errors_total", Help: "Solves that failed (invalid problem)."}),
		outOfTime: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_optimizer_solve_out_of_time_total", Help: "Solves stopped at the solver's time budget (optimizer.Options.TimeBudget) before their gap was within tolerance, by model."},
			[]string{"model"}),
		gap: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_optimizer_relative_gap_ratio", Help: "Relative optimality gap the newest solve certified (before the dead band kept previous weights), by model."},
			[]string{"model"}),
		generations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_optimizer_generations_written_total", Help: "Weight snapshots written."}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_optimizer_write_conflicts_total", Help: "Snapshot writes refused because the key had changed (compare-and-set)."}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_optimizer_leader", Help: "1 while this instance holds the lease and writes, else 0."}),
		problems: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_optimizer_problems", Help: "Models (problems) in the newest round of solves."}),
		clusters: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_optimizer_clusters", Help: "Clusters over all problems in the newest round of solves."}),
		engines: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_optimizer_engines", Help: "Engines over all problems in the newest round of solves."}),
		refused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_optimizer_engines_refused", Help: "Engines left out of the newest round of solves because the endpoint policy refuses the URL or subject their state advertises."}),
		bad: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_optimizer_bad_values_total", Help: "State values that failed to decode or validate, ignored."},
			[]string{"bucket", "reason"}),
		penalised: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_optimizer_penalised_engines", Help: "Engines in a penalty now (not counting slow start)."}),
		penalties: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_optimizer_penalties_total", Help: "Penalties imposed (or made harsher), by reason."},
			[]string{"reason"}),
		operator: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_optimizer_operator_overrides", Help: "Operator overrides in force, by action."},
			[]string{"action"}),
		slowStart: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_optimizer_slow_start_multiplier",
			Help: "Health multiplier of an engine in slow start after its capacity came back from about zero (absent when none)."},
			[]string{"model", "engine"}),
		generationAhead: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_optimizer_generation_ahead_total",
			Help: "Snapshot writes put off because the key's generation was above this clock's ceiling (messages.GenerationCeiling: the clock stepped back)."}),
		overwritten: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_optimizer_weights_overwritten_total",
			Help: "Weights keys found holding a value that could not be followed (undecodable, invalid or from the future) and overwritten with a new generation."}),
		repairs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_optimizer_layout_repairs_total", Help: "Deleted streams and buckets seen back (re-provisioned by this service or another)."}),
	}
	if reg != nil {
		reg.MustRegister(m.generationAhead, m.overwritten)
		reg.MustRegister(m.solveDuration, m.solveErrors, m.outOfTime, m.gap, m.generations, m.conflicts, m.leader,
			m.problems, m.clusters, m.engines, m.refused, m.bad, m.penalised, m.penalties, m.operator, m.slowStart, m.repairs)
	}
	return m
}
