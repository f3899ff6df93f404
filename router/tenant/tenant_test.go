package tenant_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-dev/switchyard/router/protocol"
	"github.com/switchyard-dev/switchyard/router/tenant"
)

// keysFile returns a keys file of tenants "gold" (critical ceiling,
// default critical, key goldKey) and "basic" (standard ceiling, default
// sheddable, 2 req/s with a burst of 2, key basicKey).
func keysFile(goldKey, basicKey string) string {
	return `tenants:
  - name: gold
    max_priority: critical
    default_priority: critical
    keys: ["` + tenant.FormatHash(tenant.HashKey(goldKey)) + `"]
  - name: basic
    default_priority: sheddable
    rate_rps: 2
    burst: 2
    keys:
      - ` + tenant.FormatHash(tenant.HashKey(basicKey)) + `
`
}

func headers(kv ...string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		for i := 0; i < len(kv); i += 2 {
			if kv[i] == name {
				return kv[i+1], true
			}
		}
		return "", false
	}
}

func TestParseKeysFile(t *testing.T) {
	k, err := tenant.Parse([]byte(keysFile("sk-gold", "sk-basic")))
	if err != nil {
		t.Fatal(err)
	}
	gold, ok := k.Lookup("sk-gold")
	if !ok || gold.Name != "gold" || gold.Max != protocol.PriorityCritical || gold.Default != protocol.PriorityCritical || gold.RPS != 0 {
		t.Fatalf("gold: %+v %v", gold, ok)
	}
	basic, ok := k.Lookup("sk-basic")
	if !ok || basic.Max != protocol.PriorityStandard || basic.Default != protocol.PrioritySheddable || basic.RPS != 2 || basic.Burst != 2 {
		t.Fatalf("basic: %+v %v", basic, ok)
	}
	if _, ok := k.Lookup("sk-other"); ok {
		t.Fatal("an unknown key found a tenant")
	}
	// JSON is YAML; a burst defaults to the rate rounded up.
	k, err = tenant.Parse([]byte(`{"tenants":[{"name":"j","rate_rps":2.5,"keys":["` + tenant.FormatHash(tenant.HashKey("k")) + `"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if j, _ := k.Lookup("k"); j.Burst != 3 || j.Default != protocol.PriorityStandard {
		t.Fatalf("json tenant: %+v", j)
	}
	h := tenant.FormatHash(tenant.HashKey("k"))
	for _, bad := range []struct{ text, want string }{
		{``, "empty"},
		{`tenants: [{name: a, keys: [sk-plain]}]`, "tenants[0] (a).keys[0]"},
		{`tenants: [{name: a, keys: ["sha256:00"]}]`, "64 hex digits"},
		{`tenants: [{name: a, keys: ["` + h + `"]}, {name: b, keys: ["` + h + `"]}]`, "also tenant a's"},
		{`tenants: [{name: a, keys: ["` + h + `"]}, {name: a, keys: []}]`, "tenants[1].name"},
		{`tenants: [{name: a}]`, "at least one key"},
		{`tenants: [{name: "a b", keys: ["` + h + `"]}]`, "tenants[0]: name"},
		{`tenants: [{name: _none, keys: ["` + h + `"]}]`, "leading '_'"},
		{`tenants: [{name: a, max_priority: urgent, keys: ["` + h + `"]}]`, "max_priority"},
		{`tenants: [{name: a, default_priority: critical, keys: ["` + h + `"]}]`, "above max_priority"},
		{`tenants: [{name: a, rate_rps: -1, keys: ["` + h + `"]}]`, "rate_rps"},
		{`tenants: [{name: a, burst: 5, keys: ["` + h + `"]}]`, "a burst needs a rate"},
		{`tenants: [{name: a, limit: 5, keys: ["` + h + `"]}]`, "limit"},
	} {
		_, err := tenant.Parse([]byte(bad.text))
		if !errors.Is(err, tenant.ErrBadKeys) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Parse(%q) = %v, want ErrBadKeys naming %q", bad.text, err, bad.want)
		}
	}
}

func TestKeyFrom(t *testing.T) {
	for _, c := range []struct {
		hdr  []string
		want string
	}{
		{[]string{"Authorization", "Bearer sk-1"}, "sk-1"},
		{[]string{"Authorization", "bearer   sk-1 "}, "sk-1"},
		{[]string{"Api-Key", "sk-2"}, "sk-2"},
		{[]string{"X-Api-Key", "sk-3"}, "sk-3"},
		{[]string{"Authorization", "Basic dXNlcjpwYXNz", "X-Api-Key", "sk-3"}, "sk-3"},
		{[]string{"Authorization", "Bearer"}, ""},
		{[]string{"Authorization", "Bearer sk 1"}, ""},
		{[]string{"Authorization", "Bearer " + strings.Repeat("k", tenant.MaxKeyLen+1)}, ""},
		{nil, ""},
	} {
		got, ok := tenant.KeyFrom(headers(c.hdr...))
		if got != c.want || ok != (c.want != "") {
			t.Errorf("KeyFrom(%q) = %q, %v; want %q", c.hdr, got, ok, c.want)
		}
	}
}

func TestGateAdmit(t *testing.T) {
	k, err := tenant.Parse([]byte(keysFile("sk-gold", "sk-basic")))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	g, err := tenant.NewGate(k, reg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	for _, bad := range []func(string) (string, bool){headers(), headers("Authorization", "Bearer sk-nope")} {
		_, e, _ := g.Admit(now, bad, protocol.PriorityStandard, false)
		if e == nil || e.Status != 401 || e.Code == nil || *e.Code != "invalid_api_key" {
			t.Fatalf("bad key: %+v", e)
		}
	}
	gold := headers("Authorization", "Bearer sk-gold")
	basic := headers("Api-Key", "sk-basic")
	for _, c := range []struct {
		hdr     func(string) (string, bool)
		asked   protocol.Priority
		present bool
		want    protocol.Priority
		capped  bool
	}{
		{gold, protocol.PriorityStandard, false, protocol.PriorityCritical, false},  // gold's default
		{gold, protocol.PrioritySheddable, true, protocol.PrioritySheddable, false}, // below the ceiling: as asked
		{basic, protocol.PriorityCritical, true, protocol.PriorityStandard, true},   // capped, never elevated
	} {
		v, e, _ := g.Admit(now, c.hdr, c.asked, c.present)
		if e != nil || v.Priority != c.want || v.Capped != c.capped {
			t.Fatalf("asked %v (present %v): %+v %v, want %v capped %v", c.asked, c.present, v, e, c.want, c.capped)
		}
	}
	// basic's bucket held 2: one is left; then 429 until it refills.
	if v, e, _ := g.Admit(now, basic, 0, false); e != nil || v.Priority != protocol.PrioritySheddable || v.Tenant != "basic" {
		t.Fatalf("basic's default: %+v %v", v, e)
	}
	_, e, retry := g.Admit(now, basic, 0, false)
	if e == nil || e.Status != 429 || *e.Code != "rate_limit_exceeded" || retry != "1" {
		t.Fatalf("over the rate: %+v retry %q", e, retry)
	}
	if _, e, _ := g.Admit(now.Add(500*time.Millisecond), basic, 0, false); e != nil {
		t.Fatalf("after the refill of one token: %v", e)
	}
	for _, c := range []struct {
		tenant, result string
		want           float64
	}{{tenant.LabelNone, tenant.ResultBadKey, 2}, {"gold", tenant.ResultAdmitted, 2}, {"basic", tenant.ResultCapped, 1},
		{"basic", tenant.ResultAdmitted, 2}, {"basic", tenant.ResultRateLimited, 1}} {
		if got := count(t, reg, c.tenant, c.result); got != c.want {
			t.Errorf("%s %s: %v, want %v", c.tenant, c.result, got, c.want)
		}
	}
	// A reload with basic unchanged keeps its (empty) bucket; a changed
	// rate starts a full one.
	g.Set(k)
	if _, e, _ := g.Admit(now.Add(500*time.Millisecond), basic, 0, false); e == nil {
		t.Fatal("a reload refilled an unchanged tenant's bucket")
	}
	k2, err := tenant.Parse([]byte(strings.Replace(keysFile("sk-gold", "sk-basic"), "burst: 2", "burst: 3", 1)))
	if err != nil {
		t.Fatal(err)
	}
	g.Set(k2)
	if _, e, _ := g.Admit(now.Add(500*time.Millisecond), basic, 0, false); e != nil {
		t.Fatalf("a changed burst kept the old bucket: %v", e)
	}
	// A nil gate is open.
	var open *tenant.Gate
	if v, e, _ := open.Admit(now, headers(), protocol.PriorityCritical, true); e != nil || v.Priority != protocol.PriorityCritical {
		t.Fatalf("open gate: %+v %v", v, e)
	}
}

// count returns the gate metric's value for tenant and result (0 for a
// series not there).
func count(t *testing.T, reg *prometheus.Registry, name, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["tenant"] == name && labels["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// series returns the number of the gate metric's series.
func series(t *testing.T, reg *prometheus.Registry) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		n += len(mf.GetMetric())
	}
	return n
}

// TestLabelsBounded: past MaxLabelled tenant names, over any number of
// reloads, requests count under _other.
func TestLabelsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("tenants:\n")
	n := tenant.MaxLabelled + 20
	for i := range n {
		b.WriteString("  - {name: t" + itoa(i) + ", keys: [\"" + tenant.FormatHash(tenant.HashKey("k"+itoa(i))) + "\"]}\n")
	}
	k, err := tenant.Parse([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	g, err := tenant.NewGate(k, reg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, e, _ := g.Admit(time.Now(), headers("X-Api-Key", "k"+itoa(i)), 0, false); e != nil {
			t.Fatal(e)
		}
	}
	if got := series(t, reg); got != tenant.MaxLabelled+1 {
		t.Fatalf("%d series, want %d", got, tenant.MaxLabelled+1)
	}
	if got := count(t, reg, tenant.LabelOther, tenant.ResultAdmitted); got != 20 {
		t.Fatalf("_other: %v, want 20", got)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestWatcherReload: a new version of the file takes effect on Reload; a
// version that does not parse leaves the one in force.
func TestWatcherReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.yaml")
	if err := os.WriteFile(path, []byte(keysFile("sk-gold", "sk-basic")), 0o600); err != nil {
		t.Fatal(err)
	}
	k, data, err := tenant.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	g, err := tenant.NewGate(k, nil)
	if err != nil {
		t.Fatal(err)
	}
	w, err := tenant.NewWatcher(tenant.WatcherOptions{Path: path, Gate: g}, data)
	if err != nil {
		t.Fatal(err)
	}
	if w.Reload() {
		t.Fatal("an unchanged file reloaded")
	}
	if err := os.WriteFile(path, []byte(keysFile("sk-gold2", "sk-basic")), 0o600); err != nil {
		t.Fatal(err)
	}
	if !w.Reload() {
		t.Fatal("a new version did not reload")
	}
	if _, ok := g.Keys().Lookup("sk-gold"); ok {
		t.Fatal("the old key still works")
	}
	if _, ok := g.Keys().Lookup("sk-gold2"); !ok {
		t.Fatal("the new key does not work")
	}
	if err := os.WriteFile(path, []byte("tenants: [{name: broken}]"), 0o600); err != nil {
		t.Fatal(err)
	}
	if w.Reload() {
		t.Fatal("a broken version was applied")
	}
	if _, ok := g.Keys().Lookup("sk-gold2"); !ok {
		t.Fatal("a broken version took the tenants in force away")
	}
	if _, err := tenant.NewWatcher(tenant.WatcherOptions{Gate: g}, nil); !errors.Is(err, tenant.ErrBadKeys) || !strings.Contains(err.Error(), "WatcherOptions.Path") {
		t.Fatalf("no path: %v", err)
	}
}

// TestDocExample: the keys file of docs/deployment.md ("The front door")
// parses, and its keys are the SHA-256 of the words it was made from.
func TestDocExample(t *testing.T) {
	doc, err := os.ReadFile("../../docs/deployment.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(doc), "## The front door\n")
	if !ok {
		t.Fatal(`docs/deployment.md has no section "The front door"`)
	}
	_, block, ok := strings.Cut(sec, "```yaml\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatal("the front door section has no yaml block")
	}
	k, err := tenant.Parse([]byte(block))
	if err != nil {
		t.Fatalf("the documented keys file: %v", err)
	}
	acme, ok := k.Lookup("foo")
	if !ok || acme.Name != "acme" || acme.Max != protocol.PriorityCritical || acme.RPS != 50 || acme.Burst != 100 {
		t.Fatalf("acme: %+v %v", acme, ok)
	}
	if batch, ok := k.Lookup("bar"); !ok || batch.Max != protocol.PrioritySheddable || batch.Default != protocol.PrioritySheddable {
		t.Fatalf("batch: %+v %v", batch, ok)
	}
}
