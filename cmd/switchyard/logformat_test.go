package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestResolveLogFormat(t *testing.T) {
	cases := []struct {
		format   string
		terminal bool
		want     string
		wantErr  bool
	}{
		{logAuto, true, logConsole, false},
		{logAuto, false, logJSON, false},
		{logConsole, false, logConsole, false},
		{logJSON, true, logJSON, false},
		{"text", true, "", true},
		{"", false, "", true},
	}
	for _, c := range cases {
		got, err := resolveLogFormat(c.format, c.terminal)
		var ue usageError
		if got != c.want || (err != nil) != c.wantErr || (err != nil && !errors.As(err, &ue)) {
			t.Errorf("resolveLogFormat(%q, terminal=%v) = %q, %v; want %q, error %v (a usage error)", c.format, c.terminal, got, err, c.want, c.wantErr)
		}
	}
}

func TestIsTerminal(t *testing.T) {
	file, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	cases := []struct {
		name string
		w    io.Writer
		want bool
	}{
		{"a log file", file, false},
		{"a pipe (docker logs, | tee)", w, false},
		{"a buffer", &bytes.Buffer{}, false},
	}
	// The master side of a pseudo-terminal is a terminal, as a shell's stderr is.
	if ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0); err == nil {
		defer ptmx.Close()
		cases = append(cases, struct {
			name string
			w    io.Writer
			want bool
		}{"a pseudo-terminal", ptmx, true})
	} else {
		t.Logf("no pseudo-terminal to check the positive case: %v", err)
	}
	for _, c := range cases {
		if got := isTerminal(c.w); got != c.want {
			t.Errorf("isTerminal(%s) = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestLogFormatOutput builds the logger the flags describe and checks the
// lines: JSON without escape codes when stderr is not a terminal, whether
// auto or asked, and console lines without colour there too.
func TestLogFormatOutput(t *testing.T) {
	cases := []struct {
		args     []string
		wantJSON bool
	}{
		{nil, true},
		{[]string{"--log-format", "auto"}, true},
		{[]string{"--log-format", "json"}, true},
		{[]string{"--log-format", "console"}, false},
	}
	for _, c := range cases {
		var stderr bytes.Buffer
		e := &env{stderr: &stderr}
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		mk := logFlags(fs, e)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		log, err := mk()
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		log.Info().Str("component", "test").Msg("hello")
		for _, f := range e.atExit {
			f()
		}
		out := stderr.String()
		if strings.Contains(out, "\x1b[") {
			t.Errorf("%v: escape codes in a log that is not a terminal: %q", c.args, out)
		}
		if isJSON := strings.HasPrefix(out, "{") && strings.Contains(out, `"message":"hello"`); isJSON != c.wantJSON {
			t.Errorf("%v: output %q, want JSON %v", c.args, out, c.wantJSON)
		}
	}
}
