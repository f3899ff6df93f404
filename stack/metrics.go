package stack

import (
	"cmp"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Gatherer returns the metrics of the stack's components that keep a
// registry of their own, so that one /metrics can serve the whole process
// beside Options.Registerer's (aggregator, optimizer): each router's, with a
// cluster label, each simulated engine's, with an engine label where a
// series lacks one, and the engine agent's. Routers and engines keep their own registries, served on
// their own ports, because several of them in one process would otherwise
// register the same names.
func (s *Stack) Gatherer() prometheus.Gatherer {
	var gs prometheus.Gatherers
	for i, r := range s.routers {
		gs = append(gs, labelled{g: r.Handler().Metrics(), name: "cluster", value: s.file.Clusters[i].Name})
	}
	for _, e := range s.engines {
		gs = append(gs, labelled{g: e.Registry(), name: "engine", value: e.Name()})
	}
	return append(gs, agentGatherer{s})
}

// agentGatherer gathers the running agent's registry: each StartAgent makes
// a new agent with a registry of its own.
type agentGatherer struct{ s *Stack }

// Gather implements prometheus.Gatherer.
func (g agentGatherer) Gather() ([]*dto.MetricFamily, error) {
	if a := g.s.Agent(); a != nil {
		return a.Registry().Gather()
	}
	return nil, nil
}

// labelled adds the label name=value to every series of g that has no
// label of that name.
type labelled struct {
	g           prometheus.Gatherer
	name, value string
}

// Gather implements prometheus.Gatherer.
func (l labelled) Gather() ([]*dto.MetricFamily, error) {
	fams, err := l.g.Gather()
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			if slices.ContainsFunc(m.GetLabel(), func(p *dto.LabelPair) bool { return p.GetName() == l.name }) {
				continue
			}
			m.Label = append(m.Label, &dto.LabelPair{Name: &l.name, Value: &l.value})
			slices.SortFunc(m.Label, func(a, b *dto.LabelPair) int { return cmp.Compare(a.GetName(), b.GetName()) })
		}
	}
	return fams, err
}

// The embedded NATS server's figures, from its monitoring state (Varz).
var (
	descNATSConnections = prometheus.NewDesc("switchyard_nats_connections", "Client connections to the embedded NATS server.", nil, nil)
	descNATSInMsgs      = prometheus.NewDesc("switchyard_nats_in_messages_total", "Messages the embedded NATS server received.", nil, nil)
	descNATSOutMsgs     = prometheus.NewDesc("switchyard_nats_out_messages_total", "Messages the embedded NATS server sent.", nil, nil)
	descNATSInBytes     = prometheus.NewDesc("switchyard_nats_in_bytes_total", "Bytes of messages the embedded NATS server received.", nil, nil)
	descNATSOutBytes    = prometheus.NewDesc("switchyard_nats_out_bytes_total", "Bytes of messages the embedded NATS server sent.", nil, nil)
	descNATSSlow        = prometheus.NewDesc("switchyard_nats_slow_consumers_total", "Clients the embedded NATS server disconnected as slow consumers.", nil, nil)
	descNATSStore       = prometheus.NewDesc("switchyard_nats_jetstream_storage_bytes", "File storage JetStream uses (streams and buckets).", nil, nil)
	descNATSMemory      = prometheus.NewDesc("switchyard_nats_jetstream_memory_bytes", "Memory storage JetStream uses.", nil, nil)
)

// natsCollector exports the embedded NATS server's figures at each scrape.
type natsCollector struct{ s *Stack }

// Describe implements prometheus.Collector.
func (c natsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descNATSConnections, descNATSInMsgs, descNATSOutMsgs, descNATSInBytes,
		descNATSOutBytes, descNATSSlow, descNATSStore, descNATSMemory} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. A server that cannot report
// (stopping) exports nothing rather than failing the whole scrape.
func (c natsCollector) Collect(ch chan<- prometheus.Metric) {
	v, err := c.s.nats.Server().Varz(nil)
	if err != nil {
		return
	}
	gauge, counter := prometheus.GaugeValue, prometheus.CounterValue
	ch <- prometheus.MustNewConstMetric(descNATSConnections, gauge, float64(v.Connections))
	ch <- prometheus.MustNewConstMetric(descNATSInMsgs, counter, float64(v.InMsgs))
	ch <- prometheus.MustNewConstMetric(descNATSOutMsgs, counter, float64(v.OutMsgs))
	ch <- prometheus.MustNewConstMetric(descNATSInBytes, counter, float64(v.InBytes))
	ch <- prometheus.MustNewConstMetric(descNATSOutBytes, counter, float64(v.OutBytes))
	ch <- prometheus.MustNewConstMetric(descNATSSlow, counter, float64(v.SlowConsumers))
	if st := v.JetStream.Stats; st != nil {
		ch <- prometheus.MustNewConstMetric(descNATSStore, gauge, float64(st.Store))
		ch <- prometheus.MustNewConstMetric(descNATSMemory, gauge, float64(st.Memory))
	}
}
