// Package stack describes and runs a whole Switchyard deployment in one
// process: the stack file (frontend clusters, engines, regions and the network
// between them) and the in-process stack that `switchyard up` and the
// end-to-end tests start from it — an embedded NATS server, provisioning, the
// aggregator, the optimizer, routers, simulated engines and, for engines
// given by URL, an engine agent.
package stack

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/switchyard-dev/switchyard/internal/zmtp"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/services/agent"
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

// Engine is one engine of a stack: simulated, or given by URL (an engine
// of the operator's that the stack's agent scrapes and publishes signals
// for, see services/agent).
type Engine struct {
	Name   string `yaml:"name"`
	Region string `yaml:"region"`
	// CapacityRPS is the request rate the engine sustains. A simulated
	// engine's batch size is derived from it (required); for an engine by
	// URL it is what the agent publishes, and zero lets the agent learn it.
	CapacityRPS float64 `yaml:"capacity_rps"`
	// Listen is a simulated engine's HTTP address; empty means a free 127.0.0.1 port.
	Listen string `yaml:"listen,omitempty"`
	// ServedModelName is the name the engine serves the model under when
	// it is not the stack's model id (vLLM's --served-model-name); routers
	// write it into the requests they send the engine.
	ServedModelName string `yaml:"served_model_name,omitempty"`
	// URL, when set, makes this an engine by URL: its base URL, http:// or
	// https://, where it serves the OpenAI API, its metrics and its health.
	URL string `yaml:"url,omitempty"`
	// Metrics is an engine by URL's metrics dialect: vllm, sglang, tgi or
	// llamacpp (required with url).
	Metrics string `yaml:"metrics,omitempty"`
	// MaxRunning is an engine by URL's largest batch (vLLM --max-num-seqs,
	// SGLang --max-running-requests); zero lets the agent learn it.
	MaxRunning int `yaml:"max_running,omitempty"`
	// KVEvents is an engine by URL's vLLM KV event endpoint,
	// tcp://host:port, relayed by the agent (optional).
	KVEvents string `yaml:"kv_events,omitempty"`
}

// ByURL reports whether the engine is given by URL rather than simulated.
func (e Engine) ByURL() bool { return e.URL != "" }

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
	// Model is the model id every engine serves, as clients name it
	// (messages.ValidModelName: "meta-llama/Llama-3.1-8B-Instruct").
	Model string `yaml:"model"`
	// Aliases are other names clients may give the model: the routers
	// route them on the model and list them in /v1/models.
	Aliases  []string  `yaml:"aliases,omitempty"`
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
	if err := router.CheckAliases(f.AliasMap()); err != nil {
		return fmt.Errorf("aliases: %w", err)
	}
	for i, a := range f.Aliases {
		if slices.Index(f.Aliases, a) != i {
			return fmt.Errorf("aliases[%d]: %q listed twice", i, a)
		}
	}
	for field, v := range map[string]float64{"network.intra_region_ms": f.Network.IntraRegionMs, "network.inter_region_ms": f.Network.InterRegionMs} {
		if math.IsNaN(v) || v < 0 || v > 10000 {
			return fmt.Errorf("%s: %v, want 0..10000", field, v)
		}
	}
	if f.Sim == (Sim{}) && f.Simulated() > 0 {
		i := slices.IndexFunc(f.Engines, func(e Engine) bool { return !e.ByURL() })
		return fmt.Errorf("sim: missing, want the simulator's model: engines[%d] (%q) has no url, so it is simulated", i, f.Engines[i].Name)
	}
	if f.Sim != (Sim{}) {
		// The simulator's model is needed only by simulated engines; a
		// stack of engines by URL may leave it out.
		for field, v := range map[string]float64{"sim.output_tokens": float64(f.Sim.OutputTokens), "sim.prompt_tokens": float64(f.Sim.PromptTokens),
			"sim.base_tbt_ms": f.Sim.BaseTBTMs, "sim.tbt_growth_ms": f.Sim.TBTGrowthMs, "sim.prefill_ms_per_token": f.Sim.PrefillMsPerToken} {
			if math.IsNaN(v) || v <= 0 || v > 1e5 {
				return fmt.Errorf("%s: %v, want a positive number", field, v)
			}
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
		if e.ServedModelName != "" {
			if err := messages.CheckModelName(e.ServedModelName); err != nil {
				return fmt.Errorf("%s.served_model_name: %w", field, err)
			}
		}
		if err := e.validateKind(field); err != nil {
			return err
		}
		if c := componentIdentity(f, e.Name); c != "" {
			// Every engine publishes as an identity of its own name
			// (Identities), the engines by URL through the agent; one
			// rule for both keeps a file valid whichever way an engine
			// is served.
			return fmt.Errorf("%s.name: %q is the identity name of %s, want another engine name", field, e.Name, c)
		}
		if prev, dup := seen["e"+e.Name]; dup {
			return fmt.Errorf("%s.name: %q already used by %s", field, e.Name, prev)
		}
		seen["e"+e.Name] = field
	}
	return nil
}

// AliasMap returns the aliases as the routers take them (alias → model
// id), nil when there are none.
func (f *File) AliasMap() map[string]string {
	if len(f.Aliases) == 0 {
		return nil
	}
	m := make(map[string]string, len(f.Aliases))
	for _, a := range f.Aliases {
		m[a] = f.Model
	}
	return m
}

// validateKind checks the fields of a simulated engine or of one by URL.
func (e Engine) validateKind(field string) error {
	if !e.ByURL() {
		if math.IsNaN(e.CapacityRPS) || e.CapacityRPS <= 0 || e.CapacityRPS > 1e5 {
			return fmt.Errorf("%s.capacity_rps: %v, want 0 < capacity <= 1e5", field, e.CapacityRPS)
		}
		for _, g := range []struct {
			name string
			set  bool
		}{{"metrics", e.Metrics != ""}, {"max_running", e.MaxRunning != 0}, {"kv_events", e.KVEvents != ""}} {
			if g.set {
				return fmt.Errorf("%s.%s: only an engine given by url has it (a simulated engine's comes from sim and capacity_rps)", field, g.name)
			}
		}
		return nil
	}
	if u, err := url.Parse(e.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%s.url: %q, want an http:// or https:// base URL", field, e.URL)
	}
	if e.Listen != "" {
		return fmt.Errorf("%s.listen: %q, but the engine is given by url: it listens where it runs (remove listen)", field, e.Listen)
	}
	if e.Metrics == "" {
		return fmt.Errorf("%s.metrics: missing, want one of %v (the engine's metrics dialect)", field, agent.Formats())
	}
	if _, err := agent.ParseFormat(e.Metrics); err != nil {
		return fmt.Errorf("%s.metrics: %v", field, err)
	}
	if math.IsNaN(e.CapacityRPS) || e.CapacityRPS < 0 || e.CapacityRPS > 1e5 {
		return fmt.Errorf("%s.capacity_rps: %v, want 0..1e5 (0: learned by the agent)", field, e.CapacityRPS)
	}
	if e.MaxRunning < 0 || e.MaxRunning > 1<<20 {
		return fmt.Errorf("%s.max_running: %d, want 0..%d (0: learned by the agent)", field, e.MaxRunning, 1<<20)
	}
	if e.KVEvents != "" {
		if _, err := zmtp.TCPAddr(e.KVEvents); err != nil {
			return fmt.Errorf("%s.kv_events: %v", field, err)
		}
	}
	return nil
}

// Simulated returns how many of the stack's engines are simulated.
func (f *File) Simulated() int {
	n := 0
	for _, e := range f.Engines {
		if !e.ByURL() {
			n++
		}
	}
	return n
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
