package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestAgentCommandRejectsBadSpecs: a bad --engine spec is a usage error
// naming what is wrong, reported before any NATS connection is tried (the
// URL here points nowhere).
func TestAgentCommandRejectsBadSpecs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no --engine"},
		{[]string{"--engine", "name=a.b,url=http://127.0.0.1:1,metrics=vllm"}, "Options.Engines[0].Name"},
		{[]string{"--engine", "name=v1,url=http://127.0.0.1:1,metrics=triton"}, `unknown metrics format "triton"`},
		{[]string{"--engine", "name=v1,url=ftp://x,metrics=vllm"}, "Options.Engines[0].URL"},
		{[]string{"--engine", "name=v1,url=http://127.0.0.1:1,metrics=vllm,capacity_rps=-1"}, "Known.CapacityRPS"},
		{[]string{"--engine", "name=v1,url=http://127.0.0.1:1,metrics=vllm", "--engine", "name=v1,url=http://127.0.0.1:2,metrics=vllm"}, "given twice"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var stdout, stderr bytes.Buffer
		args := append([]string{"agent", "--nats-url", "nats://127.0.0.1:1", "--metrics-addr", ""}, tc.args...)
		code := run(ctx, args, strings.NewReader(""), &stdout, &stderr)
		cancel()
		if code != exitUsage || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("agent %q: exit %d, stderr %q; want exit %d naming %q", tc.args, code, stderr.String(), exitUsage, tc.want)
		}
	}
}
