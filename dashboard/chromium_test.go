package dashboard_test

import (
	"errors"
	"fmt"
	"image/png"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/dashboard"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/testenv"
)

// envScreenshot names the file the browser test's screenshot is saved to
// (default: in the test's temporary directory).
const envScreenshot = "SWITCHYARD_DASHBOARD_SCREENSHOT"

var (
	reWeightCell = regexp.MustCompile(`<td[^>]*\bdata-weight="[^"]*"[^>]*>`)
	reRow        = regexp.MustCompile(`<tr[^>]*\bdata-generation="[^"]*"[^>]*>`)
	reAttr       = regexp.MustCompile(`([a-z][a-z0-9-]*)="([^"]*)"`)
)

func attrs(tag string) map[string]string {
	m := map[string]string{}
	for _, a := range reAttr.FindAllStringSubmatch(tag, -1) {
		m[a[1]] = a[2]
	}
	return m
}

// TestPageInChromium serves the dashboard on loopback, lets headless
// Chromium load and poll it, and checks that the weights matrix on the page
// shows exactly what sy_weights holds; it saves a screenshot.
func TestPageInChromium(t *testing.T) {
	bin := testenv.Chromium(t)
	n := testenv.StartNATS(t)
	f := newFixture(t, n)
	f.caseStudy()
	d := startDashboard(t, n, dashboard.Options{SampleInterval: 100 * time.Millisecond, History: 15 * time.Second,
		Routers: func() []dashboard.RouterStatus {
			return []dashboard.RouterStatus{
				{Cluster: "A", Router: "A-1", Model: model, Generation: 7, AgeSeconds: 0.4, Mode: "snapshot"},
				{Cluster: "B", Router: "B-1", Model: model, Generation: 9 + 12, AgeSeconds: 0.3, Mode: "snapshot"},
				{Cluster: "C", Router: "C-1", Model: model, AgeSeconds: -1, Mode: "local-policy"},
			}
		}})
	testenv.WaitFor(t, 5*time.Second, "dashboard to see the snapshots", func() bool {
		st := d.State()
		return len(st.Models) == 1 && len(st.Models[0].Snapshots) == 3
	})
	// Let the history show a change: engine-b's load climbs and B's overflow
	// moves to engine-c over a dozen snapshots.
	for i := 1; i <= 12; i++ {
		x := 0.25 * float64(i) / 12
		f.snapshot("B", uint64(9+i), 0, map[string]float64{"engine-a": 0.02 * float64(12-i) / 12, "engine-b": 1 - x - 0.02*float64(12-i)/12, "engine-c": x})
		f.engine("engine-b", messages.StatusUp, 100, 1, 80+float64(i))
		f.engine("engine-c", messages.StatusStale, 80, 1, 30+3*float64(i))
		time.Sleep(100 * time.Millisecond)
	}

	// httptest serves on 127.0.0.1.
	srv := httptest.NewServer(d.Handler())
	defer srv.Close()
	if host, _, _ := net.SplitHostPort(srv.Listener.Addr().String()); host != "127.0.0.1" {
		t.Fatalf("server on %s, want loopback", host)
	}
	resp, err := http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	start := time.Now()
	dom := testenv.RunChromium(t, bin, srv.URL+"/", 3000, "--dump-dom")
	t.Logf("chromium --dump-dom took %s", time.Since(start).Round(time.Millisecond))

	want := f.sySnapshots()
	engines := d.State().Models[0].Engines
	cells := reWeightCell.FindAllString(dom, -1)
	if len(cells) != len(want)*len(engines) {
		t.Fatalf("page shows %d weight cells, want %d clusters × %d engines; DOM:\n%s", len(cells), len(want), len(engines), dom)
	}
	seen := map[string]bool{}
	for _, c := range cells {
		a := attrs(c)
		s, ok := want[a["data-cluster"]]
		if !ok || a["data-model"] != model {
			t.Errorf("weight cell for %s/%s, not in sy_weights: %s", a["data-model"], a["data-cluster"], c)
			continue
		}
		if w := fmt.Sprintf("%.4f", s.Weights[a["data-engine"]]); a["data-weight"] != w {
			t.Errorf("cluster %s engine %s: page shows %s, sy_weights (generation %d) has %s",
				a["data-cluster"], a["data-engine"], a["data-weight"], s.Generation, w)
		}
		seen[a["data-cluster"]+"/"+a["data-engine"]] = true
	}
	for c, s := range want {
		for e := range s.Weights {
			if !seen[c+"/"+e] {
				t.Errorf("cluster %s engine %s (weight %.4f in sy_weights) not on the page", c, e, s.Weights[e])
			}
		}
	}
	rows := reRow.FindAllString(dom, -1)
	if len(rows) < len(want) {
		t.Errorf("page shows %d snapshot rows, want %d", len(rows), len(want))
	}
	for _, r := range rows {
		a := attrs(r)
		if s, ok := want[a["data-cluster"]]; ok && a["data-generation"] != fmt.Sprint(s.Generation) {
			t.Errorf("cluster %s: page shows generation %s, sy_weights has %d", a["data-cluster"], a["data-generation"], s.Generation)
		}
	}
	for _, needle := range []string{`data-engine="engine-c" data-status="stale"`, `class="pill pill-live"`, `pill-local-policy`} {
		if !strings.Contains(dom, needle) {
			t.Errorf("page lacks %s", needle)
		}
	}

	shot := filepath.Join(t.TempDir(), "dashboard.png")
	if p := os.Getenv(envScreenshot); p != "" {
		// Chromium resolves a relative path against its own directory.
		if shot, err = filepath.Abs(p); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(shot), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	start = time.Now()
	testenv.RunChromium(t, bin, srv.URL+"/", 3000, "--screenshot="+shot, "--window-size=1280,900")
	t.Logf("chromium --screenshot took %s", time.Since(start).Round(time.Millisecond))
	checkPNG(t, shot)
	t.Logf("screenshot saved to %s", shot)
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	file, err := os.Open(path)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	defer file.Close()
	cfg, err := png.DecodeConfig(file)
	if err != nil {
		t.Fatalf("screenshot %s: %v", path, err)
	}
	if cfg.Width < 1000 || cfg.Height < 700 {
		t.Errorf("screenshot is %d×%d, want about 1280×900", cfg.Width, cfg.Height)
	}
	if fi, err := file.Stat(); err == nil && fi.Size() < 10<<10 {
		t.Error(errors.New("screenshot is suspiciously small: blank page?"))
	}
}
