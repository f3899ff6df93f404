package aggregator_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestDemandKeepsMix: two routers of one cluster report their requests'
// prompt tokens and their completions' output tokens; the cluster's demand
// state sums them, its mix is the requests' mean, and a router that
// reports no mix leaves the windows it does not measure at 0.
func TestDemandKeepsMix(t *testing.T) {
	env := testenv.StartNATS(t)
	defer startAggregator(t, env, prometheus.NewRegistry())()
	kv, err := env.JS.KeyValue(context.Background(), env.Names.DemandBucket)
	if err != nil {
		t.Fatal(err)
	}
	seq := uint64(time.Now().UnixMilli())
	publish := func(router string, rep messages.RouterReport) {
		t.Helper()
		seq++
		rep.Model, rep.Cluster, rep.Router, rep.Time, rep.Seq, rep.IntervalS = "llama", "A", router, time.Now().UnixMilli(), seq, 1
		data, err := messages.Encode(&rep)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.JS.Publish(context.Background(), "sy.report.llama.A."+router, data); err != nil {
			t.Fatal(err)
		}
	}
	// r1: 10 code requests of 2,000 prompt tokens, 8 completions of 30
	// output tokens; r2: 30 chat requests of 100 prompt tokens, no output
	// counted. The cluster: 40 req/s, 23,000/40 = 575 prompt tokens per
	// request, 30 output tokens per counted completion.
	publish("r1", messages.RouterReport{Requests: 10, PromptTokens: 20000, Completed: 8, OutputTokens: 240})
	publish("r2", messages.RouterReport{Requests: 30, PromptTokens: 3000})
	testenv.WaitFor(t, 10*time.Second, "the cluster's mix in its demand state", func() bool {
		d, ok := demandState(t, kv, "llama.A")
		if !ok || len(d.Routers) != 2 {
			return false
		}
		p, o := d.Mix()
		return math.Abs(d.RPS.Slow-40) < 1e-9 && math.Abs(p-575) < 1e-9 && math.Abs(o-30) < 1e-9 &&
			d.Routers["r2"].OutputTPS.IsZero() && d.RPSVar.IsZero()
	})
	// A second interval of r1 at another rate: its variance is measured.
	publish("r1", messages.RouterReport{Requests: 20, PromptTokens: 40000, Completed: 20, OutputTokens: 600})
	testenv.WaitFor(t, 10*time.Second, "r1's variance in the cluster's demand", func() bool {
		d, ok := demandState(t, kv, "llama.A")
		return ok && d.Routers["r1"].RPSVar.Slow > 0 && d.RPSVar.Slow == d.Routers["r1"].RPSVar.Slow+d.Routers["r2"].RPSVar.Slow
	})
}
