package dashboard_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/switchyard-dev/switchyard/dashboard"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestPoisonValues starts the dashboard on buckets that hold undecodable
// values beside valid ones: it watches every bucket, shows the valid state,
// and counts each bad value.
func TestPoisonValues(t *testing.T) {
	n := testenv.StartNATS(t)
	f := newFixture(t, n)
	f.caseStudy()
	ctx := context.Background()
	for _, p := range []struct {
		bucket, key string
		value       []byte
	}{
		{n.Names.EnginesBucket, model + ".poison", []byte("\x83\xa1v\x01\xa1k\xacengine_state\xa2tx")},
		{n.Names.EnginesBucket, model + ".engine-v", []byte("\x82\xa1v\x09\xa1k\xacengine_state")},
		{n.Names.WeightsBucket, model + ".Z", []byte{0xc1}},
		{n.Names.DemandBucket, model + ".Z", []byte("not msgpack")},
	} {
		kv, err := n.JS.KeyValue(ctx, p.bucket)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, p.key, p.value); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	d := startDashboard(t, n, dashboard.Options{Registerer: reg})
	testenv.WaitFor(t, 5*time.Second, "every bucket watched", func() bool {
		st := d.State()
		return len(st.Watching) == 3 && st.Watching[n.Names.EnginesBucket] && st.Watching[n.Names.WeightsBucket] &&
			st.Watching[n.Names.DemandBucket]
	})
	st := d.State()
	if len(st.Models) != 1 || !slices.Equal(st.Models[0].Engines, []string{"engine-a", "engine-b", "engine-c"}) {
		t.Fatalf("models %+v, want llama with engines a, b, c", st.Models)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byReason := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "switchyard_dashboard_bad_values_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" {
					byReason[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	if byReason["decode"] != 3 || byReason["version"] != 1 {
		t.Fatalf("bad values by reason %v, want 3 decode and 1 version", byReason)
	}
}
