package stack_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/router/tenant"
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

// TestPlanKeysFile: a cluster's keys_file (relative to the stack file)
// and Options.KeysFile reach the routers, which serve no /metrics of their
// own; a keys file that does not load is refused naming its field.
func TestPlanKeysFile(t *testing.T) {
	dir := t.TempDir()
	good := "tenants:\n  - name: t\n    keys: [\"" + tenant.FormatHash(tenant.HashKey("k")) + "\"]\n"
	if err := os.WriteFile(filepath.Join(dir, "keys.yaml"), []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte("tenants: [{name: t, keys: [plain-key]}]"), 0o600); err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(stack.DefaultFileBytes()), `router: "127.0.0.1:8082"}`, `router: "127.0.0.1:8082", keys_file: keys.yaml}`, 1)
	if !strings.Contains(text, "keys_file") {
		t.Fatal("the default stack file has no cluster on 127.0.0.1:8082 to give a keys file")
	}
	if err := os.WriteFile(filepath.Join(dir, "stack.yaml"), []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := stack.Load(filepath.Join(dir, "stack.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := stack.Options{File: f, DataDir: dir, RouterAddr: "127.0.0.1:0"}.Plan()
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range p.Routers {
		want := ""
		if i == 1 {
			want = filepath.Join(dir, "keys.yaml")
		}
		if r.KeysFile != want || !r.NoMetrics {
			t.Errorf("router %d: keys file %q, no metrics %v; want %q, true", i, r.KeysFile, r.NoMetrics, want)
		}
	}
	p, err = stack.Options{File: f, DataDir: dir, RouterAddr: "127.0.0.1:0", KeysFile: filepath.Join(dir, "keys.yaml")}.Plan()
	if err != nil || p.Routers[0].KeysFile != filepath.Join(dir, "keys.yaml") {
		t.Fatalf("Options.KeysFile: %v, %+v", err, p.Routers)
	}
	f.Clusters[1].KeysFile = filepath.Join(dir, "bad.yaml")
	if _, err := (stack.Options{File: f, DataDir: dir, RouterAddr: "127.0.0.1:0"}).Plan(); !errors.Is(err, stack.ErrOptions) || !strings.Contains(err.Error(), "clusters[1].keys_file") {
		t.Fatalf("a bad keys_file: %v", err)
	}
	if _, err := (stack.Options{File: f, DataDir: dir, RouterAddr: "127.0.0.1:0", KeysFile: filepath.Join(dir, "none.yaml")}).Plan(); !errors.Is(err, stack.ErrOptions) || !strings.Contains(err.Error(), "KeysFile") {
		t.Fatalf("a missing KeysFile: %v", err)
	}
}
