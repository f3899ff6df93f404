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
