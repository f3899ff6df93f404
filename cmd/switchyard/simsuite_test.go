package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSimSuiteCommand runs `switchyard sim --suite` on a directory of one
// tiny scenario and checks the table, the verdicts, the JSON and that
// flags of the single-scenario mode are refused.
func TestSimSuiteCommand(t *testing.T) {
	dir := t.TempDir()
	yaml := `name: tiny
duration_s: 8
warmup_s: 2
drain_s: 20
engine_types:
  - {name: t, max_batch: 16, prefill_ms_per_token: 0.01, tbt_base_ms: 12, tbt_per_request_ms: 0.1, kv_blocks: 400}
engines:
  - {name: e, region: r1, type: t, count: 3}
clusters:
  - {name: c, region: r1, poisson: {rate: 20}, prompt_tokens: 100, output_tokens: 8}
`
	if err := os.WriteFile(filepath.Join(dir, "tiny.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	js := filepath.Join(dir, "out.json")
	out, errOut, code := runBounded(t, "sim", "--suite", dir, "--policies", "round-robin,llmd-weighted,switchyard", "--quiet", "--json", js)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"scenario", "tiny", "llmd-weighted", "criteria for switchyard", "e2e mean", "kv hit", "remap", "1 scenarios pass every criterion"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(out, "PASS tiny") && !strings.Contains(out, "FAIL tiny") {
		t.Errorf("no verdict line:\n%s", out)
	}
	data, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var doc []struct {
		Report   map[string]any   `json:"report"`
		Verdicts []map[string]any `json:"verdicts"`
	}
	if err := json.Unmarshal(data, &doc); err != nil || len(doc) != 1 || len(doc[0].Verdicts) != 5 || doc[0].Report["scenario"] != "tiny" {
		t.Fatalf("JSON %v: %d entries (%s)", err, len(doc), data[:min(len(data), 200)])
	}
	if _, errOut, code := runBounded(t, "sim", "--suite", dir, "--plots", dir); code != exitUsage || !strings.Contains(errOut, "--plots") {
		t.Errorf("--suite with --plots: exit %d, %q", code, errOut)
	}
}
