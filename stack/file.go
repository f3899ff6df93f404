// Package stack describes and runs a whole Switchyard deployment in one
// process: the stack file (frontend clusters, engines, regions and the network
// between them) and the in-process stack that `switchyard up` and the
// end-to-end tests start from it — an embedded NATS server, provisioning, the
// aggregator and simulated engines.
package stack

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/switchyard-dev/switchyard/messages"
)

// DefaultFile is the built-in stack: the case study of OpenAI's talk on
// routing LLM inference. examples/stack.yaml holds the same text.
//
//go:embed case-study.yaml
var defaultFile []byte

// DefaultFileBytes returns the built-in stack file's text.
func DefaultFileBytes() []byte { return bytes.Clone(defaultFile) }

// Cluster is one frontend cluster of a stack.
type Cluster struct {
	Name   string `yaml:"name"`
	Region string `yaml:"region"`
	// DemandRPS is the cluster's request rate when load is generated, req/s.
	DemandRPS float64 `yaml:"demand_rps"`
	// Router is the listen address of the cluster's router, host:port.
	Router string `yaml:"router"`
	// KeysFile, when set, is the router's API keys file (router/tenant):
	// the cluster's front door takes only its keys. A relative path is the
	// stack file's directory's (Load resolves it).
	KeysFile string `yaml:"keys_file,omitempty"`
}

// Engine is one simulated engine of a stack.
type Engine struct {
	Name   string `yaml:"name"`
	Region string `yaml:"region"`
	// CapacityRPS is the request rate the engine sustains; the simulator's
	// batch size is derived from it.
	CapacityRPS float64 `yaml:"capacity_rps"`
	// Listen is the engine's HTTP address; empty means a free 127.0.0.1 port.
	Listen string `yaml:"listen,omitempty"`
}

// Network gives the one-way network latency between regions, in ms.
type Network struct {
	IntraRegionMs float64 `yaml:"intra_region_ms"`
	InterRegionMs float64 `yaml:"inter_region_ms"`
}

// Sim holds the simulated engines' model parameters shared by every engine of
// the stack; each engine's batch size is then derived from its capacity.
type Sim struct {
	// OutputTokens is the number of tokens a request generates.
	OutputTokens int `yaml:"output_tokens"`
	// PromptTokens is the mean prompt length, tokens.
	PromptTokens int `yaml:"prompt_tokens"`
	// BaseTBTMs is the time between tokens with one running request, ms.
	BaseTBTMs float64 `yaml:"base_tbt_ms"`
	// TBTGrowthMs is how much the time between tokens grows per running request, ms.
	TBTGrowthMs float64 `yaml:"tbt_growth_ms"`
	// PrefillMsPerToken is the prefill cost per prompt token, ms.
	PrefillMsPerToken float64 `yaml:"prefill_ms_per_token"`
}

// File is a parsed stack file.
type File struct {
	// Model is the model every engine serves.
	Model    string    `yaml:"model"`
	Network  Network   `yaml:"network"`
	Sim      Sim       `yaml:"sim"`
	Clusters []Cluster `yaml:"clusters"`
	Engines  []Engine  `yaml:"engines"`
}

// ErrStack is wrapped by every stack file error.
var ErrStack = errors.New("stack file")

// Default returns the built-in stack.
func Default() *File {
	f, err := Parse("(built-in stack)", defaultFile)
	if err != nil {
		panic("built-in stack does not parse: " + err.Error())
	}
	return f
}

// Load reads and parses a stack file.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrStack, err)
	}
	f, err := Parse(path, data)
	if err != nil {
		return nil, err
	}
	for i, c := range f.Clusters {
		if c.KeysFile != "" && !filepath.IsAbs(c.KeysFile) {
			f.Clusters[i].KeysFile = filepath.Join(filepath.Dir(path), c.KeysFile)
		}
	}
	return f, nil
}

// Parse parses and validates a stack file; name is used in errors.
func Parse(name string, data []byte) (*File, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f File
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrStack, name, err)
	}
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrStack, name, err)
	}
	return &f, nil
}

// Validate checks names, numbers and references, naming the field at fault.
func (f *File) Validate() error {
	if err := messages.CheckModelName(f.Model); err != nil {
		return fmt.Errorf("model: %w", err)
	}
	for field, v := range map[string]float64{"network.intra_region_ms": f.Network.IntraRegionMs, "network.inter_region_ms": f.Network.InterRegionMs} {
		if math.IsNaN(v) || v < 0 || v > 10000 {
			return fmt.Errorf("%s: %v, want 0..10000", field, v)
		}
	}
	for field, v := range map[string]float64{"sim.output_tokens": float64(f.Sim.OutputTokens), "sim.prompt_tokens": float64(f.Sim.PromptTokens),
		"sim.base_tbt_ms": f.Sim.BaseTBTMs, "sim.tbt_growth_ms": f.Sim.TBTGrowthMs, "sim.prefill_ms_per_token": f.Sim.PrefillMsPerToken} {
		if math.IsNaN(v) || v <= 0 || v > 1e5 {
			return fmt.Errorf("%s: %v, want a positive number", field, v)
		}
	}
	if len(f.Clusters) == 0 {
		return errors.New("clusters: at least one frontend cluster is needed")
	}
	if len(f.Engines) == 0 {
		return errors.New("engines: at least one engine is needed")
	}
	seen := map[string]string{}
	for i, c := range f.Clusters {
		field := fmt.Sprintf("clusters[%d]", i)
		if !messages.ValidName(c.Name) {
			return fmt.Errorf("%s.name: %q is not a valid name", field, c.Name)
		}
		if !messages.ValidName(c.Region) {
			return fmt.Errorf("%s.region: %q is not a valid name", field, c.Region)
		}
		if math.IsNaN(c.DemandRPS) || c.DemandRPS < 0 || c.DemandRPS > 1e6 {
			return fmt.Errorf("%s.demand_rps: %v, want 0..1e6", field, c.DemandRPS)
		}
		if prev, dup := seen["c"+c.Name]; dup {
			return fmt.Errorf("%s.name: %q already used by %s", field, c.Name, prev)
		}
		seen["c"+c.Name] = field
	}
	for i, e := range f.Engines {
		field := fmt.Sprintf("engines[%d]", i)
		if !messages.ValidName(e.Name) {
			return fmt.Errorf("%s.name: %q is not a valid name", field, e.Name)
		}
		if !messages.ValidName(e.Region) {
			return fmt.Errorf("%s.region: %q is not a valid name", field, e.Region)
		}
		if math.IsNaN(e.CapacityRPS) || e.CapacityRPS <= 0 || e.CapacityRPS > 1e5 {
			return fmt.Errorf("%s.capacity_rps: %v, want 0 < capacity <= 1e5", field, e.CapacityRPS)
		}
		if prev, dup := seen["e"+e.Name]; dup {
			return fmt.Errorf("%s.name: %q already used by %s", field, e.Name, prev)
		}
		seen["e"+e.Name] = field
	}
	return nil
}

// NetworkMs returns the one-way latency from a cluster's region to an engine's region.
func (f *File) NetworkMs(clusterRegion, engineRegion string) float64 {
	if clusterRegion == engineRegion {
		return f.Network.IntraRegionMs
	}
	return f.Network.InterRegionMs
}

// NetworkTable returns the one-way latency in ms from every cluster to every
// engine, by cluster and engine name.
func (f *File) NetworkTable() map[string]map[string]float64 {
	t := make(map[string]map[string]float64, len(f.Clusters))
	for _, c := range f.Clusters {
		row := make(map[string]float64, len(f.Engines))
		for _, e := range f.Engines {
			row[e.Name] = f.NetworkMs(c.Region, e.Region)
		}
		t[c.Name] = row
	}
	return t
}

// DelayFrom returns, for routers of the named cluster, the one-way network
// latency to each engine of the stack (unknown engines: none), or nil when the
// cluster is not in the stack.
func (f *File) DelayFrom(cluster string) func(engine string) time.Duration {
	region := ""
	for _, c := range f.Clusters {
		if c.Name == cluster {
			region = c.Region
		}
	}
	if region == "" {
		return nil
	}
	delays := make(map[string]time.Duration, len(f.Engines))
	for _, e := range f.Engines {
		delays[e.Name] = time.Duration(f.NetworkMs(region, e.Region) * float64(time.Millisecond))
	}
	return func(engine string) time.Duration { return delays[engine] }
}
