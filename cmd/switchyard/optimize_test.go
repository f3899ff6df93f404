package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestOptimizeCommand: the case study solves with and without a time budget
// to the same weights, and a negative budget is a usage error.
func TestOptimizeCommand(t *testing.T) {
	solve := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := run(t.Context(), append([]string{"optimize", "-f", "../../examples/case-study.yaml"}, args...), strings.NewReader(""), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	code, def, stderr := solve()
	if code != 0 || !strings.Contains(def, "engine-c=") {
		t.Fatalf("default solve: exit %d, stdout %q, stderr %q", code, def, stderr)
	}
	// The tables agree; the last line (the time taken) may not.
	table := func(s string) string { before, _, _ := strings.Cut(s, "policy "); return before }
	if code, none, stderr := solve("--time-budget", "0"); code != 0 || table(none) != table(def) {
		t.Fatalf("--time-budget 0: exit %d, stderr %q, stdout\n%s\nwant the default solve's\n%s", code, stderr, none, def)
	}
	if code, _, stderr := solve("--time-budget", "-1s"); code != 2 || !strings.Contains(stderr, "time-budget") {
		t.Fatalf("--time-budget -1s: exit %d, stderr %q; want exit 2 naming the flag", code, stderr)
	}
}
