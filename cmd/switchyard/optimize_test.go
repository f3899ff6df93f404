package main

import (
	"bytes"
	"context"
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

// TestEngineTargetFlag checks --engine-target-utilisation's parsing: NAME=U
// with U in (0, 1], and a usage error naming the bad value otherwise.
func TestEngineTargetFlag(t *testing.T) {
	for _, tc := range []struct {
		in   string
		name string
		u    float64
		err  string
	}{
		{in: "a100-1=0.9", name: "a100-1", u: 0.9},
		{in: "e=1", name: "e", u: 1},
		{in: "a=b=0.5", err: "not a share"},
		{in: "e", err: "want NAME=U"},
		{in: "=0.5", err: "want NAME=U"},
		{in: "e=0", err: "not a share"},
		{in: "e=1.5", err: "not a share"},
		{in: "e=NaN", err: "not a share"},
	} {
		name, u, err := parseEngineTarget(tc.in)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want one saying %q", tc.in, err, tc.err)
			}
		case err != nil || name != tc.name || u != tc.u:
			t.Errorf("%q: got %q, %v, %v; want %q, %v", tc.in, name, u, err, tc.name, tc.u)
		}
	}
	var stdout, stderr syncBuffer
	args := []string{"optimizer", "--network", "/dev/null", "--engine-target-utilisation", "e=2"}
	if code := run(context.Background(), args, strings.NewReader(""), &stdout, &stderr); code != exitUsage {
		t.Fatalf("exit %d, want %d (usage); stderr:\n%s", code, exitUsage, stderr.String())
	}
	if !strings.Contains(stderr.String(), `"e=2"`) {
		t.Fatalf("stderr does not name the bad value:\n%s", stderr.String())
	}
}
