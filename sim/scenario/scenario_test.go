package scenario

import (
	"strings"
	"testing"
)

func TestScenarioErrorsNameTheField(t *testing.T) {
	base := `
name: x
duration_s: 10
engine_types:
  - {name: t, max_batch: 4, tbt_base_ms: 10, kv_blocks: 100}
engines:
  - {name: e, region: r, type: t}
clusters:
  - {name: c, region: r, poisson: {rate: 1}}
`
	for _, tc := range []struct{ edit, want string }{
		{"max_batch: 4", "engine_types[0].max_batch: 0"},
		{"tbt_base_ms: 10", "engine_types[0].tbt_base_ms: -1"},
		{"type: t}", "engines[0].type: \"u\""},
		{"rate: 1}", "clusters[0].poisson.rate: -2"},
		{"duration_s: 10", "field bogus not found"},
	} {
		repl := map[string]string{
			"max_batch: 4": "max_batch: 0", "tbt_base_ms: 10": "tbt_base_ms: -1", "type: t}": "type: u}",
			"rate: 1}": "rate: -2}", "duration_s: 10": "duration_s: 10\nbogus: 1",
		}[tc.edit]
		_, err := ParseScenario("bad.yaml", []byte(strings.Replace(base, tc.edit, repl, 1)))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "bad.yaml") {
			t.Errorf("edit %q: error %v, want it to mention %q and the file", tc.edit, err, tc.want)
		}
	}
	if _, err := ParseScenario("ok.yaml", []byte(base)); err != nil {
		t.Fatal(err)
	}
	tu := base + "policies:\n  switchyard: {target_utilisation: 0.3}\n"
	if _, err := ParseScenario("tu.yaml", []byte(tu)); err == nil || !strings.Contains(err.Error(), "policies.switchyard.target_utilisation: 0.3") {
		t.Errorf("bad target utilisation: %v", err)
	}
	ttu := strings.Replace(base, "kv_blocks: 100}", "kv_blocks: 100, target_utilisation: 1.2}", 1)
	if _, err := ParseScenario("ttu.yaml", []byte(ttu)); err == nil || !strings.Contains(err.Error(), "engine_types[0].target_utilisation: 1.2") {
		t.Errorf("bad engine type target utilisation: %v", err)
	}
	ev := base + "events:\n  - {at_s: 1, fail: {engine: nope}}\n"
	if _, err := ParseScenario("ev.yaml", []byte(ev)); err == nil || !strings.Contains(err.Error(), "events[0].fail.engine") {
		t.Errorf("bad event target: %v", err)
	}
}

// TestGeneratorSource checks the generator source: its errors name the
// field, its preset fields can be overridden, and its arrivals carry the
// family's shared prompt blocks without session ids.
func TestGeneratorSource(t *testing.T) {
	base := `
name: g
duration_s: 30
engine_types:
  - {name: t, max_batch: 4, tbt_base_ms: 10, kv_blocks: 100}
engines:
  - {name: e, region: r, type: t}
clusters:
  - {name: c, region: r, generator: {family: chat, rate: 5, system_tokens: 2048}}
`
	for edit, want := range map[string]string{
		"family: chat": "clusters[0].generator: nope", "rate: 5": "clusters[0].generator: chat: workload: bad generator: Rate -1",
	} {
		repl := map[string]string{"family: chat": "family: nope", "rate: 5": "rate: -1"}[edit]
		if _, err := ParseScenario("bad.yaml", []byte(strings.Replace(base, edit, repl, 1))); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("edit %q: error %v, want it to mention %q", edit, err, want)
		}
	}
	sc, err := ParseScenario("ok.yaml", []byte(base))
	if err != nil {
		t.Fatal(err)
	}
	arr, err := sc.Arrivals(1)
	if err != nil {
		t.Fatal(err)
	}
	if len(arr) < 50 {
		t.Fatalf("%d arrivals at 5 req/s over 30 s", len(arr))
	}
	for _, a := range arr {
		if a.Session != 0 || len(a.Blocks) < 5 || a.Blocks[0] != arr[0].Blocks[0] || a.Blocks[3] != arr[0].Blocks[3] || a.Key == 0 {
			t.Fatalf("arrival %+v: want no session, the 4-block shared prompt first, an affinity key", a)
		}
	}
}
