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
// cluster label, and each simulated engine's, with an engine label where a
// series lacks one. Routers and engines keep their own registries, served on
// their own ports, because several of them in one process would otherwise
// register the same names.
func (s *Stack) Gatherer() prometheus.Gatherer {
	var gs prometheus.Gatherers
	for i, r := range s.routers {
		gs = append(gs, labelled{g: r.Handler().Registry(), name: "cluster", value: s.file.Clusters[i].Name})
	}
	for _, e := range s.engines {
		gs = append(gs, labelled{g: e.Registry(), name: "engine", value: e.Name()})
	}
	return gs
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
