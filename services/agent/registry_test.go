package agent_test

import (
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/switchyard-dev/switchyard/services/agent"
	"github.com/switchyard-dev/switchyard/testenv"
)

// TestAgentOwnRegistry: without Options.Registerer the agent's metrics live
// in its own registry, and Registry is how an embedding program reads them;
// the counters there agree with the agent's own Stats.
func TestAgentOwnRegistry(t *testing.T) {
	n := testenv.StartNATS(t)
	sim := startVLLMSim(t, "v1")
	a := runAgent(t, agent.Options{Conn: n.Conn, Engines: []agent.EngineConfig{engineConfig("v1", sim.URL())},
		Interval: 50 * time.Millisecond, Logger: zerolog.Nop()})
	testenv.WaitFor(t, 5*time.Second, "signals", func() bool { es, _ := a.Stats("llama", "v1"); return es.Published >= 3 })

	reg := a.Registry()
	if reg == nil {
		t.Fatal("Registry() is nil without Options.Registerer")
	}
	// Stats and the counter are read at different moments of a running
	// agent, and the counter is counted before Stats, so the counter is at
	// least what Stats said before it.
	before, _ := a.Stats("llama", "v1")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]int{}
	for _, mf := range mfs {
		series[mf.GetName()] += len(mf.GetMetric())
	}
	for _, name := range []string{"switchyard_agent_scrapes_total", "switchyard_agent_signals_total", "switchyard_agent_scrape_duration_seconds"} {
		if series[name] == 0 {
			t.Errorf("%s: no series in the agent's registry", name)
		}
	}
	var published float64
	for _, mf := range mfs {
		if mf.GetName() != "switchyard_agent_signals_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["model"] == "llama" && labels["engine"] == "v1" && labels["result"] == "published" {
				published = m.GetCounter().GetValue()
			}
		}
	}
	if published < float64(before.Published) {
		t.Errorf("switchyard_agent_signals_total{result=published} = %v, below Stats().Published = %d", published, before.Published)
	}
}
