package agent

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseEngineSpec reads one engine from the comma-separated key=value form
// the --engine flag takes, for example
//
//	name=v1,url=http://10.0.0.5:8000,metrics=vllm,model=llama,capacity_rps=40,max_running=8,region=r1
//
// Keys: name, model, url, metrics (vllm, sglang, tgi, llamacpp), region,
// served_model, metrics_path, health_path, advertise, capacity_rps,
// max_running, base_latency_ms, replicas, kv_events (vLLM's ZMQ KV event
// endpoint, tcp://host:port), kv_topic, kv_replay. defaultModel and defaultRegion fill
// model and region when the spec leaves them out. The result is not yet
// validated (Options.Validate does that, naming the field).
func ParseEngineSpec(spec, defaultModel, defaultRegion string) (EngineConfig, error) {
	e := EngineConfig{Model: defaultModel, Region: defaultRegion}
	if strings.TrimSpace(spec) == "" {
		return e, fmt.Errorf("%w: engine spec is empty, want name=NAME,url=URL,metrics=FORMAT", ErrOptions)
	}
	seen := map[string]bool{}
	for _, kv := range strings.Split(spec, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" {
			return e, fmt.Errorf("%w: engine spec %q: %q is not key=value", ErrOptions, spec, kv)
		}
		if seen[k] {
			return e, fmt.Errorf("%w: engine spec %q: key %q given twice", ErrOptions, spec, k)
		}
		seen[k] = true
		num := func() (float64, error) {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || !finite(f) {
				return 0, fmt.Errorf("%w: engine spec %q: %s=%q is not a number", ErrOptions, spec, k, v)
			}
			return f, nil
		}
		integer := func() (int, error) {
			n, err := strconv.Atoi(v)
			if err != nil {
				return 0, fmt.Errorf("%w: engine spec %q: %s=%q is not an integer", ErrOptions, spec, k, v)
			}
			return n, nil
		}
		var err error
		switch k {
		case "name":
			e.Name = v
		case "model":
			e.Model = v
		case "url":
			e.URL = v
		case "metrics":
			e.Format, err = ParseFormat(v)
		case "region":
			e.Region = v
		case "served_model":
			e.ServedModel = v
		case "metrics_path":
			e.MetricsPath = v
		case "health_path":
			e.HealthPath = v
		case "advertise":
			e.Advertise = v
		case "capacity_rps":
			e.Known.CapacityRPS, err = num()
		case "base_latency_ms":
			e.Known.BaseLatencyMs, err = num()
		case "max_running":
			e.Known.MaxRunning, err = integer()
		case "replicas":
			e.Replicas, err = integer()
		case "kv_events", "kv-events":
			e.KVEvents = v
		case "kv_topic", "kv-topic":
			e.KVTopic = v
		case "kv_replay", "kv-replay":
			e.KVReplay = v
		default:
			err = fmt.Errorf("%w: engine spec %q: unknown key %q", ErrOptions, spec, k)
		}
		if err != nil {
			return e, err
		}
	}
	return e, nil
}
