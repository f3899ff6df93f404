package testenv

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// MetricSum sums the counter and gauge samples of the metric family name in
// reg whose labels include every pair of match (nil or empty: every sample).
// It fails the test when reg cannot be gathered.
func MetricSum(t testing.TB, reg prometheus.Gatherer, name string, match map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	sum := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	samples:
		for _, m := range f.GetMetric() {
			for k, v := range match {
				found := false
				for _, l := range m.GetLabel() {
					found = found || (l.GetName() == k && l.GetValue() == v)
				}
				if !found {
					continue samples
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}
