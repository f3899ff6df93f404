package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/testenv"
)

// readmeCommand is one command line of a README code block: the command,
// its trailing comment, and (in a block that shows a command and what it
// prints) the lines the README says it prints.
type readmeCommand struct {
	line    string
	comment string
	prints  []string
}

// readmeCommands returns the commands of the README's code blocks in
// order: every line of a ```sh block (a line ending in a backslash
// continued on the next), and the first line of an unlabelled
// block that starts with "switchyard " (the rest being its output).
func readmeCommands(readme string) []readmeCommand {
	var out []readmeCommand
	var lang string
	var block []string
	in := false
	for _, l := range strings.Split(readme, "\n") {
		if strings.HasPrefix(l, "```") {
			if !in {
				in, lang, block = true, strings.TrimPrefix(l, "```"), nil
				continue
			}
			in = false
			switch {
			case lang == "sh":
				for i := 0; i < len(block); i++ {
					b := block[i]
					for strings.HasSuffix(b, "\\") && i+1 < len(block) { // a continued line
						i++
						b = strings.TrimSuffix(b, "\\") + strings.TrimSpace(block[i])
					}
					if strings.TrimSpace(b) == "" {
						continue
					}
					cmd, comment, _ := strings.Cut(b, " # ")
					out = append(out, readmeCommand{line: strings.TrimSpace(cmd), comment: strings.TrimSpace(comment)})
				}
			case lang == "" && len(block) > 0 && strings.HasPrefix(block[0], "switchyard "):
				out = append(out, readmeCommand{line: block[0], prints: block[1:]})
			}
			continue
		}
		if in {
			block = append(block, l)
		}
	}
	return out
}

// readmeCheck says how the test treats the README commands that start
// with prefix: not at all (skip, the reason), as the stack (server), as a
// subscription that runs until stopped (stopAfter), and what the output
// must match (want, each a regular expression; poll: retried until it
// does, for a state that takes a moment to change).
type readmeCheck struct {
	prefix    string
	skip      string
	server    bool
	nats      bool
	stopAfter time.Duration
	exit      int
	want      []string
	poll      bool
}

// readmeChecks is what the README says of each command. A README command
// no entry matches fails the test: a new command needs its check here.
var readmeChecks = []readmeCheck{
	{prefix: "go build -o bin/switchyard ./cmd/switchyard"},
	{prefix: `export PATH="$PWD/bin:$PATH"`},
	{prefix: "switchyard version", want: []string{`^switchyard \S+`}},
	{prefix: "switchyard up", server: true},
	{prefix: "go test ", skip: "the test suite itself"},
	{prefix: "curl -s http://127.0.0.1:8082/v1/chat/completions", want: []string{`(?m)^data: \{.*"chat\.completion\.chunk"`, `(?m)^data: \[DONE\]$`}},
	{prefix: "curl -s http://127.0.0.1:8082/v1/responses", want: []string{`"object":"response"`, `"status":"completed"`, `"type":"output_text"`}},
	{prefix: "curl -s http://127.0.0.1:8082/v1/models/llama", want: []string{`^\{"id":"llama","object":"model","created":[1-9]\d*,`}},
	{prefix: "switchyard load --url http://127.0.0.1:8082", want: []string{`requests \d+ in .*: ok [1-9]\d*, errors 0`, `(?m)^  engine-[abc] +\d`}},
	{prefix: "switchyard engine inject engine-b --error-rate 1", want: []string{`engine engine-b failure injection now: .*"error_rate":1`}},
	{prefix: "switchyard engine list", poll: true, want: []string{`STATE`, `(?m)^llama +engine-b +(ejected|degraded)`}},
	{prefix: "switchyard engine inject engine-b --clear", want: []string{`"error_rate":0`}},
	{prefix: "switchyard engine drain engine-c", want: []string{`recorded under sy_engines/operator\.engine-c`}},
	{prefix: "switchyard engine restore engine-c", want: []string{`restored`}},
	{prefix: "go install github.com/nats-io/natscli/nats@", skip: "installs the nats CLI (CI does; the test uses the nats on PATH)"},
	{prefix: "nats --creds ~/.cache/switchyard/up/auth/admin.creds kv ls sy_engines", nats: true, want: []string{`(?m)^llama\.engine-a$`, `(?m)^llama\.engine-b$`, `(?m)^llama\.engine-c$`,
		// Every key is one the comment names.
		`^(?:(?:llama\.engine-[abc]|penalty\.llama\.engine-[abc]|operator\.engine-[abc])\n)+$`}},
	{prefix: "nats --creds ~/.cache/switchyard/up/auth/admin.creds kv get sy_engines llama.engine-b --raw | switchyard decode", nats: true, want: []string{`"engine": "engine-b"`}},
	{prefix: "nats --creds ~/.cache/switchyard/up/auth/admin.creds sub 'sy.signal.>' --translate 'switchyard decode --compact'", nats: true, stopAfter: 3 * time.Second,
		want: []string{`(?m)^\{.*"engine":"engine-a"`, `(?m)^\{.*"engine":"engine-b"`}},
	{prefix: "nats --creds ~/.cache/switchyard/up/auth/admin.creds stream ls -a", nats: true, want: []string{`SY_SIGNALS`, `SY_REPORTS`, `SY_KV`, `KV_sy_engines`, `KV_sy_demand`, `KV_sy_weights`}},
	{prefix: "switchyard aggregator --stale-after 10s --print-config", exit: 2},
	{prefix: "deploy/build-images.sh", skip: "Docker: deploy/smoke.sh builds and runs the compose stack"},
	{prefix: "docker compose ", skip: "Docker: deploy/smoke.sh runs the compose stack"},
	{prefix: "docker-compose ", skip: "Docker: deploy/smoke.sh runs the compose stack"},
}

// TestREADMECommands runs the README's commands in order, as a new user
// would on a clean clone: its install step builds the binary (into a
// temporary directory), `switchyard up` is the stack the other commands
// talk to (on free ports: the commands' fixed ports are rewritten to the
// stack's, and SWITCHYARD_NATS_URL and NATS_URL name its NATS server), and
// every other command that is not a long-running server runs and its
// output is checked against what the README says. The nats CLI commands
// run when nats is on PATH and are skipped, saying so, otherwise. Long
// commands are shortened (load runs 3 s, not 30 s; the subscription stops
// after 3 s).
func TestREADMECommands(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs a stack")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	cmds := readmeCommands(string(readme))
	if len(cmds) < 15 {
		t.Fatalf("found %d README commands; the code blocks were not read", len(cmds))
	}
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "bin")
	natsPort, metricsPort := freePort(t), freePort(t)
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	// up's data directory: the README's ~/.cache/switchyard/up, whose
	// auth/admin.creds the operator's commands use.
	dataDir := filepath.Join(tmp, "up")
	env := append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"SWITCHYARD_NATS_URL="+natsURL, "SWITCHYARD_CREDS="+filepath.Join(dataDir, "auth", "admin.creds"), "NATS_URL="+natsURL, "NATS_CONTEXT=", "XDG_CONFIG_HOME="+tmp, "NO_COLOR=1")
	_, natsErr := exec.LookPath("nats")
	rewrite := readmeRewrite(bin, dataDir, metricsPort, nil)
	var stackDone <-chan error
	for _, c := range cmds {
		chk, ok := readmeCheckFor(c.line)
		if !ok {
			t.Errorf("README command %q has no check in readmeChecks: say what its output shows", c.line)
			continue
		}
		switch {
		case chk.skip != "":
			t.Logf("skipped %q: %s", c.line, chk.skip)
			continue
		case chk.nats && natsErr != nil:
			t.Logf("skipped %q: no nats CLI on PATH (go install github.com/nats-io/natscli/nats@v0.5.0)", c.line)
			continue
		case chk.server:
			var routers map[string]string
			routers, stackDone = startREADMEStack(t, root, env, c.line, dataDir, natsPort, metricsPort)
			rewrite = readmeRewrite(bin, dataDir, metricsPort, routers)
			continue
		}
		if stackDone != nil {
			select {
			case err := <-stackDone:
				t.Fatalf("switchyard up ended before %q: %v", c.line, err)
			default:
			}
		}
		line := rewrite.Replace(c.line)
		runCheck := func() (string, error) {
			out, code, err := runREADMECommand(root, env, line, chk.stopAfter)
			if err != nil {
				return out, err
			}
			if code != chk.exit {
				return out, fmt.Errorf("exit status %d, want %d", code, chk.exit)
			}
			for _, l := range c.prints {
				if !strings.Contains(out, l) {
					return out, fmt.Errorf("output lacks the README's line %q", l)
				}
			}
			for _, w := range chk.want {
				if !regexp.MustCompile(w).MatchString(out) {
					return out, fmt.Errorf("output does not match %s", w)
				}
			}
			return out, nil
		}
		out, err := runCheck()
		if err != nil && chk.poll {
			testenv.WaitFor(t, 5*time.Second, fmt.Sprintf("%q shows what the README says", c.line), func() bool {
				out, err = runCheck()
				return err == nil
			})
		}
		if err != nil {
			t.Errorf("README command %q (run as %q): %v; output:\n%s", c.line, line, err, out)
		} else {
			t.Logf("ran %q", line)
		}
	}
	if stackDone == nil {
		t.Error("the README has no `switchyard up`")
	}
}

// readmeRewrite returns what the test changes in the README's commands:
// the install step builds into bin, the fixed ports are the test stack's
// (routers by cluster, once it runs), up's data directory is the test's,
// and load runs 3 s instead of 30.
func readmeRewrite(bin, dataDir string, metricsPort int, routers map[string]string) *strings.Replacer {
	pairs := []string{"-o bin/switchyard", "-o " + filepath.Join(bin, "switchyard"), "~/.cache/switchyard/up", dataDir,
		"127.0.0.1:9090", fmt.Sprintf("127.0.0.1:%d", metricsPort), "--duration 30s", "--duration 3s"}
	for i, c := range []string{"A", "B", "C"} {
		if u, ok := routers[c]; ok {
			pairs = append(pairs, fmt.Sprintf("http://127.0.0.1:%d", 8081+i), u)
		}
	}
	return strings.NewReplacer(pairs...)
}

// readmeCheckFor returns the check of the README command line.
func readmeCheckFor(line string) (readmeCheck, bool) {
	for _, c := range readmeChecks {
		if line == c.prefix || strings.HasPrefix(line, c.prefix) && (strings.HasSuffix(c.prefix, " ") || len(line) > len(c.prefix) && line[len(c.prefix)] == ' ') {
			return c, true
		}
	}
	return readmeCheck{}, false
}

// runREADMECommand runs line with bash in dir, at most a minute (or
// stopAfter, then interrupted as Ctrl-C would), and returns its output
// (stdout then stderr) and exit status.
func runREADMECommand(dir string, env []string, line string, stopAfter time.Duration) (string, int, error) {
	limit := 3 * time.Minute // the install step compiles
	if stopAfter > 0 {
		limit = stopAfter
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c", line)
	cmd.Dir, cmd.Env = dir, env
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	out := stdout.String() + stderr.String()
	if stopAfter > 0 && ctx.Err() != nil {
		return out, 0, nil // stopped as the README says (Ctrl-C)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out, ee.ExitCode(), nil
	}
	if err != nil {
		return out, -1, fmt.Errorf("run: %w", err)
	}
	return out, 0, nil
}

// routerLine is how `switchyard up` prints a router: its cluster and URL.
var routerLine = regexp.MustCompile(`(?m)^  router ([A-Z])\s+(http://\S+)`)

// startREADMEStack starts the README's `switchyard up` (line) with the
// built binary on free ports and a temporary data directory, waits until
// it prints its three routers and they answer, and returns their URLs by
// cluster and a channel that gets up's end. The stack is interrupted (as
// Ctrl-C) when the test ends.
func startREADMEStack(t *testing.T, dir string, env []string, line, dataDir string, natsPort, metricsPort int) (map[string]string, <-chan error) {
	t.Helper()
	args := append(strings.Fields(line)[1:], "--nats-port", fmt.Sprint(natsPort), "--data-dir", dataDir,
		"--metrics-addr", fmt.Sprintf("127.0.0.1:%d", metricsPort), "--router-addr", "127.0.0.1:0", "--log-level", "warn")
	path, err := exec.LookPath("switchyard")
	for _, e := range env {
		if p, ok := strings.CutPrefix(e, "PATH="); ok {
			path, err = lookPathIn("switchyard", p)
		}
	}
	if err != nil {
		t.Fatalf("switchyard up: the install step did not put switchyard on PATH: %v", err)
	}
	cmd := exec.Command(path, args...)
	cmd.Dir, cmd.Env = dir, env
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", line, err)
	}
	done := make(chan error, 1)
	var printed syncBuffer
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			fmt.Fprintln(&printed, sc.Text())
		}
		done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("switchyard up after Ctrl-C: %v; stderr:\n%s", err, stderr.String())
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("switchyard up did not stop within 20 s of Ctrl-C")
		}
	})
	routers := map[string]string{}
	testenv.WaitFor(t, 30*time.Second, "switchyard up prints its routers A, B and C", func() bool {
		for _, m := range routerLine.FindAllStringSubmatch(printed.String(), -1) {
			routers[m[1]] = m[2]
		}
		return len(routers) == 3
	})
	for _, want := range []string{"Switchyard is up", "dashboard", "engine-a", "engine-b", "engine-c"} {
		if !strings.Contains(printed.String(), want) {
			t.Errorf("switchyard up does not print %q:\n%s", want, printed.String())
		}
	}
	client := &http.Client{Timeout: 2 * time.Second}
	for _, u := range routers {
		testenv.WaitFor(t, 15*time.Second, "router "+u+" ready", func() bool {
			resp, err := client.Get(u + "/readyz")
			if err != nil {
				return false
			}
			_ = resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}
	client.CloseIdleConnections()
	return routers, done
}

// lookPathIn finds the executable name in the directories of path.
func lookPathIn(name, path string) (string, error) {
	for _, d := range filepath.SplitList(path) {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not in %s", name, path)
}
