package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Environment variables of the browser tests.
const (
	// EnvRequireChromium, set to 1, fails a browser test instead of
	// skipping it when Chromium cannot be found or installed.
	EnvRequireChromium = "SWITCHYARD_REQUIRE_CHROMIUM"
)

// Chromium returns the path of a Chromium binary, running
// testenv/testdata/install-chromium.sh (Debian's chromium package) when none
// is installed, or skips the test when none can be had (fails it when
// EnvRequireChromium is 1).
func Chromium(tb testing.TB) string {
	tb.Helper()
	find := func() string {
		for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
			if p, err := exec.LookPath(name); err == nil {
				return p
			}
		}
		return ""
	}
	if p := find(); p != "" {
		return p
	}
	skip := func(format string, args ...any) {
		tb.Helper()
		if os.Getenv(EnvRequireChromium) == "1" {
			tb.Fatalf(format, args...)
		}
		tb.Skipf(format, args...)
	}
	if runtime.GOOS != "linux" {
		skip("chromium not found, and install-chromium.sh installs it on Debian only; install chromium to run this test")
	}
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		skip("chromium not found, and the install script cannot be located")
	}
	script := filepath.Join(filepath.Dir(self), "testdata", "install-chromium.sh")
	tb.Logf("chromium not found; running %s", script)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "sh", script).CombinedOutput()
	if err != nil {
		skip("chromium not found and could not be installed (%v): %s\ninstall it with: apt-get install chromium", err, strings.TrimSpace(string(out)))
	}
	if p := find(); p != "" {
		return p
	}
	skip("install-chromium.sh succeeded but chromium is still not on PATH")
	return ""
}

// RunChromium runs headless Chromium (bin, from Chromium) on url with extra
// flags and returns its standard output. The page's timers run on virtual
// time, so that its polls happen within budgetMs of virtual time without
// waiting for them.
func RunChromium(tb testing.TB, bin, url string, budgetMs int, extra ...string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := append([]string{"--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--no-default-browser-check",
		"--disable-dev-shm-usage", "--disable-extensions", "--disable-background-networking", "--disable-sync",
		"--hide-scrollbars", "--mute-audio", "--user-data-dir=" + tb.TempDir(),
		fmt.Sprintf("--virtual-time-budget=%d", budgetMs)}, extra...)
	args = append(args, url)
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}
