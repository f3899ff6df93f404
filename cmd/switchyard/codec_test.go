package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
)

func TestEncodeDecodeRoundTrip(t *testing.T) {
	in := `{"model":"llama","engine":"engine-b","ttft_ms":120,"tbt_ms":20,"queue":1,"running":8,"kv_use":0.25,"capacity_rps":100,"load_rps":80,"replicas":1,"health":1}`
	var wire, out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"encode", "signal"}, strings.NewReader(in), &wire, &errOut); code != 0 {
		t.Fatalf("encode exited %d: %s", code, errOut.String())
	}
	if code := run(t.Context(), []string{"decode"}, &wire, &out, &errOut); code != 0 {
		t.Fatalf("decode exited %d: %s", code, errOut.String())
	}
	var got map[string]any
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got["engine"] != "engine-b" || got["ttft_ms"] != 120.0 || got["k"] != "signal" || got["time_ms"].(float64) <= 0 {
		t.Fatalf("round trip gave %s", out.String())
	}
}

func TestCodecErrors(t *testing.T) {
	cases := []struct {
		name  string
		args  []string
		stdin string
		code  int
		want  string
	}{
		{"decode garbage", []string{"decode"}, "not msgpack", 1, "malformed"},
		{"decode nothing", []string{"decode"}, "", 2, "no input"},
		// A signal whose tx claims 2^31-1 elements: rejected by the
		// structure check, not an out-of-memory crash.
		{"decode array32 poison", []string{"decode"}, "\x83\xa1v\x01\xa1k\xa6signal\xa2tx\xdd\x7f\xff\xff\xff", 1, "claims 2147483647"},
		{"decode map32 poison", []string{"decode"}, "\x83\xa1v\x01\xa1k\xa6report\xa2eo\xdf\x7f\xff\xff\xff", 1, "claims 2147483647 entries"},
		{"decode trailing bytes", []string{"decode"}, "\x82\xa1v\x01\xa1k\xa6signal\xc0", 1, "after the message"},
		{"encode unknown kind", []string{"encode", "gizmo"}, "{}", 2, "gizmo"},
		{"encode NaN-like", []string{"encode", "signal"}, `{"model":"m","engine":"e","health":2}`, 2, "health"},
		{"encode bad name", []string{"encode", "signal"}, `{"model":"m","engine":"e.x"}`, 2, "e.x"},
		{"encode not JSON", []string{"encode", "signal"}, `{`, 2, "JSON"},
		{"unknown command", []string{"frobnicate"}, "", 2, "frobnicate"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(t.Context(), c.args, strings.NewReader(c.stdin), &out, &errOut)
			if code != c.code || !strings.Contains(errOut.String(), c.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d mentioning %q", code, errOut.String(), c.code, c.want)
			}
		})
	}
}

func TestFlagsFromEnvAndConfig(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(cfg, []byte("compact: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	in := `{"model":"llama","engine":"e","health":1}`
	var wire, out, errOut bytes.Buffer
	run(t.Context(), []string{"encode", "signal"}, strings.NewReader(in), &wire, &errOut)
	data := wire.Bytes()
	if code := run(t.Context(), []string{"decode", "--config", cfg}, bytes.NewReader(data), &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if strings.Count(strings.TrimSpace(out.String()), "\n") != 0 {
		t.Fatalf("config compact: true not applied: %s", out.String())
	}
	t.Setenv("SWITCHYARD_COMPACT", "false")
	out.Reset()
	run(t.Context(), []string{"decode", "--config", cfg}, bytes.NewReader(data), &out, &errOut)
	if strings.Count(out.String(), "\n") < 3 {
		t.Fatalf("environment did not override the config file: %s", out.String())
	}
	if err := os.WriteFile(cfg, []byte("bogus: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	errOut.Reset()
	if code := run(t.Context(), []string{"decode", "--config", cfg}, bytes.NewReader(data), &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "bogus") {
		t.Fatalf("unknown config key: exit %d, %s", code, errOut.String())
	}
}

func TestHelpOnEveryCommand(t *testing.T) {
	for _, c := range commands() {
		var out, errOut bytes.Buffer
		if code := run(t.Context(), []string{c.name, "--help"}, strings.NewReader(""), &out, &errOut); code != 0 {
			t.Errorf("%s --help exited %d", c.name, code)
		}
		if !strings.Contains(errOut.String(), "Usage: switchyard "+c.name) {
			t.Errorf("%s --help printed %q", c.name, errOut.String())
		}
	}
}

func TestDecodeSummarisesSlots(t *testing.T) {
	slots := make([]byte, 2*messages.MinSnapshotSlots)
	for i := 0; i < messages.MinSnapshotSlots/4; i++ {
		slots[2*i] = 1 // a quarter of the slots on engine-c
	}
	snap := &messages.WeightSnapshot{Model: "llama", Cluster: "B", Generation: 3, Time: time.Now().UnixMilli(),
		Weights: map[string]float64{"engine-b": 0.75, "engine-c": 0.25}, SlotEngines: []string{"engine-b", "engine-c"}, Slots: slots}
	data, err := messages.Encode(snap)
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"decode"}, bytes.NewReader(data), &out, &errOut); code != 0 {
		t.Fatalf("decode exited %d: %s", code, errOut.String())
	}
	var got map[string]any
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	counts, _ := got["slot_counts"].(map[string]any)
	if _, full := got["slots"]; full || counts["engine-c"] != float64(messages.MinSnapshotSlots/4) || counts["engine-b"] != float64(3*messages.MinSnapshotSlots/4) {
		t.Fatalf("decode printed %s; want slot_counts and no slots", out.String())
	}
	out.Reset()
	run(t.Context(), []string{"decode", "--slots"}, bytes.NewReader(data), &out, &errOut)
	if !strings.Contains(out.String(), `"slots"`) {
		t.Fatalf("decode --slots left the table out: %s", out.String())
	}
}
