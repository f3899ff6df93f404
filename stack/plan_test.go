package stack_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/services/aggregator"
	"github.com/switchyard-dev/switchyard/services/optimizersvc"
	"github.com/switchyard-dev/switchyard/stack"
)

// TestPlan: Plan derives every component's options from the stack file with
// their defaults applied, and names the component and field of a bad one;
// Start refuses the same options before starting anything.
func TestPlan(t *testing.T) {
	dir := t.TempDir()
	p, err := stack.Options{DataDir: dir, NATSPort: -1, RouterAddr: "127.0.0.1:0"}.Plan()
	if err != nil {
		t.Fatal(err)
	}
	f := stack.Default()
	if len(p.Engines) != len(f.Engines) || len(p.Routers) != len(f.Clusters) || p.Optimizer == nil {
		t.Fatalf("plan of %d engines, %d routers, optimizer %v; want %d, %d and one", len(p.Engines), len(p.Routers), p.Optimizer != nil, len(f.Engines), len(f.Clusters))
	}
	if p.Optimizer.Instance != "up" || !p.Optimizer.PreferConfiguredNetwork || len(p.Optimizer.Clusters) != len(f.Clusters) || p.Optimizer.Heartbeat != 10*time.Second {
		t.Errorf("optimizer options %+v", *p.Optimizer)
	}
	if p.Aggregator.DownAfter != 6*time.Second || p.NATS.Host != "127.0.0.1" || p.NATS.Port != -1 || p.Routers[0].HTTPAddr != "127.0.0.1:0" {
		t.Errorf("aggregator down-after %s, NATS %s:%d, router %q", p.Aggregator.DownAfter, p.NATS.Host, p.NATS.Port, p.Routers[0].HTTPAddr)
	}
	for i, e := range p.Engines {
		if e.Name != f.Engines[i].Name || e.Model != f.Model || e.MaxBatch < 1 || e.OutputTokens != f.Sim.OutputTokens {
			t.Errorf("engine %d options %+v", i, e)
		}
	}
	if p, err := (stack.Options{DataDir: dir, NoOptimizer: true, NoRouters: true}).Plan(); err != nil || p.Optimizer != nil || len(p.Routers) != 0 {
		t.Errorf("NoOptimizer, NoRouters: plan %+v, %v", p, err)
	}

	bad := &stack.File{Model: "llama"}
	cases := []struct {
		name string
		o    stack.Options
		is   error
		want string
	}{
		{"data dir", stack.Options{}, stack.ErrOptions, "DataDir is empty"},
		{"nats port", stack.Options{DataDir: dir, NATSPort: 70000}, stack.ErrOptions, "NATS: natsembed: invalid options: Port is 70000"},
		{"signal interval", stack.Options{DataDir: dir, SignalInterval: -time.Second}, stack.ErrOptions, "SignalInterval is -1s"},
		{"router addr", stack.Options{DataDir: dir, RouterAddr: "127.0.0.1:8081"}, stack.ErrOptions, `RouterAddr "127.0.0.1:8081"`},
		{"aggregator", stack.Options{DataDir: dir, Aggregator: aggregator.Options{StaleAfter: time.Minute}}, aggregator.ErrOptions, "Aggregator: aggregator: invalid options: StaleAfter 1m0s"},
		{"optimizer", stack.Options{DataDir: dir, Optimizer: optimizersvc.Options{TargetUtilisation: 2}}, optimizersvc.ErrOptions, "Optimizer: optimizersvc: invalid options: TargetUtilisation is 2"},
		{"stack file", stack.Options{DataDir: dir, File: bad}, stack.ErrStack, "stack file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := c.o.Validate(); !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Validate = %v, want %v naming %q", err, c.is, c.want)
			}
			if s, err := stack.Start(t.Context(), c.o); !errors.Is(err, c.is) {
				if s != nil {
					s.Close()
				}
				t.Errorf("Start = %v, want %v", err, c.is)
			}
		})
	}
}
