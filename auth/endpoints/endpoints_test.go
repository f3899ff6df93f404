package endpoints_test

import (
	"context"
	"errors"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/auth/endpoints"
	"github.com/switchyard-dev/switchyard/messages"
)

// fakeDNS is a Resolver over a fixed table, counting lookups.
type fakeDNS struct {
	table   map[string][]string
	lookups atomic.Int64
}

func (d *fakeDNS) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	d.lookups.Add(1)
	addrs, ok := d.table[host]
	if !ok {
		return nil, errors.New("no such host")
	}
	var out []netip.Addr
	for _, a := range addrs {
		out = append(out, netip.MustParseAddr(a))
	}
	return out, nil
}

const policyYAML = `
models:
  - model: meta-llama/Llama-3.1-8B-Instruct
    engines:
      - name: engine-a
        urls: [http://127.0.0.1:8001/]
      - name: engine-b
        urls: [http://127.0.0.1:8002]
        subjects: [other.infer.b]
      - name: engine-d
        urls: [http://engine-d:8000]
    cidrs: [10.0.2.0/24, 192.168.7.7]
    hosts: ["*.gpu.internal", "gpu-1.example.com"]
    subjects: ["sy.infer.*.*"]
  - model: "*"
    cidrs: ["fd00::/8"]
`

func newPolicy(t *testing.T, dns *fakeDNS, now func() time.Time) *endpoints.Policy {
	t.Helper()
	f, err := endpoints.Parse([]byte(policyYAML))
	if err != nil {
		t.Fatal(err)
	}
	p, err := endpoints.New(f, endpoints.Options{
		OwnSubject: func(model, engine string) string { return "sy.infer." + messages.ModelToken(model) + "." + engine },
		Resolver:   dns, Now: now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCheck(t *testing.T) {
	dns := &fakeDNS{table: map[string][]string{
		"engine-c.example.com": {"10.0.2.9"},
		"mixed.example.com":    {"10.0.2.9", "203.0.113.5"},
		"loop.example.com":     {"127.0.0.1"},
		"engine-d":             {"172.18.0.5"},
	}}
	p := newPolicy(t, dns, nil)
	const model = "meta-llama/Llama-3.1-8B-Instruct"
	own := "sy.infer." + messages.ModelToken(model) + ".engine-c"
	cases := []struct {
		name, model, engine, url, subject string
		reason                            string // "" when allowed
	}{
		{"nothing advertised", model, "engine-a", "", "", ""},
		{"pinned URL", model, "engine-a", "http://127.0.0.1:8001", "", ""},
		{"pinned URL with its slash and case", model, "engine-a", "HTTP://127.0.0.1:8001/", "", ""},
		{"pinned engine, another loopback port", model, "engine-b", "http://127.0.0.1:8001", "", endpoints.ReasonURL},
		{"pinned engine, an address in a range", model, "engine-a", "http://10.0.2.3:8000", "", endpoints.ReasonURL},
		{"pinned engine, an attacker", model, "engine-b", "http://203.0.113.9:80", "", endpoints.ReasonURL},
		{"pinned engine, its own subject", model, "engine-b", "", "sy.infer." + messages.ModelToken(model) + ".engine-b", ""},
		{"pinned engine, its listed subject", model, "engine-b", "", "other.infer.b", ""},
		{"pinned engine, a pattern's subject", model, "engine-a", "", "sy.infer.x.engine-b", endpoints.ReasonSubject},
		{"pinned by name", model, "engine-d", "http://engine-d:8000", "", ""},
		{"pinned by name, at the name's address", model, "engine-d", "http://172.18.0.5:8000", "", ""},
		{"pinned by name, another address", model, "engine-d", "http://172.18.0.6:8000", "", endpoints.ReasonURL},
		{"pinned by name, another port", model, "engine-d", "http://172.18.0.5:8001", "", endpoints.ReasonURL},
		{"address in a range", model, "engine-c", "http://10.0.2.200:8000", "", ""},
		{"single address", model, "engine-c", "https://192.168.7.7", "", ""},
		{"address outside", model, "engine-c", "http://10.0.3.1:8000", "", endpoints.ReasonURL},
		{"loopback outside", model, "engine-c", "http://127.0.0.1:9", "", endpoints.ReasonURL},
		{"IPv6 of the any-model range", model, "engine-c", "http://[fd00::5]:8000", "", ""},
		{"IPv4-mapped IPv6", model, "engine-c", "http://[::ffff:10.0.2.4]:8000", "", ""},
		{"host pattern", model, "engine-c", "http://node7.gpu.internal:8000", "", ""},
		{"host pattern's domain itself", model, "engine-c", "http://gpu.internal:8000", "", endpoints.ReasonDNS},
		{"exact host", model, "engine-c", "http://GPU-1.example.com:8000", "", ""},
		{"name resolving into a range", model, "engine-c", "http://engine-c.example.com:8000", "", ""},
		{"name resolving partly outside", model, "engine-c", "http://mixed.example.com:8000", "", endpoints.ReasonDNS},
		{"name resolving to loopback", model, "engine-c", "http://loop.example.com:8000", "", endpoints.ReasonDNS},
		{"name not resolving", model, "engine-c", "http://nowhere.example.com", "", endpoints.ReasonDNS},
		{"user information", model, "engine-c", "http://u:p@10.0.2.2", "", endpoints.ReasonURL},
		{"own subject", model, "engine-c", "", own, ""},
		{"pattern subject", model, "engine-c", "", "sy.infer.m.other", ""},
		{"subject outside the pattern", model, "engine-c", "", "sy.req.A.m", endpoints.ReasonSubject},
		{"good URL, bad subject", model, "engine-c", "http://10.0.2.2", "evil.x", endpoints.ReasonSubject},
		{"other model: the any-model range", "other", "engine-a", "http://[fd00::1]:1", "", ""},
		{"other model: no pin there", "other", "engine-a", "http://127.0.0.1:8001", "", endpoints.ReasonURL},
		{"other model: own subject", "other", "engine-a", "", "sy.infer.other.engine-a", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := p.Check(context.Background(), c.model, c.engine, c.url, c.subject)
			if got := endpoints.Reason(err); got != c.reason {
				t.Fatalf("Check(%s, %s, %q, %q) = %v, want reason %q", c.model, c.engine, c.url, c.subject, err, c.reason)
			}
			if c.reason != "" && !errors.Is(err, endpoints.ErrRefused) {
				t.Fatalf("%v is no ErrRefused", err)
			}
		})
	}
}

func TestNoRuleForModel(t *testing.T) {
	p, err := endpoints.New(endpoints.File{Models: []endpoints.Rules{{Model: "m", CIDRs: []string{"10.0.0.0/8"}}}}, endpoints.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r := endpoints.Reason(p.Check(context.Background(), "n", "e", "http://10.0.0.1", "")); r != endpoints.ReasonModel {
		t.Fatalf("reason %q, want %q", r, endpoints.ReasonModel)
	}
	var nilPolicy *endpoints.Policy
	if err := nilPolicy.Check(context.Background(), "n", "e", "http://203.0.113.1", "x"); err != nil {
		t.Fatalf("a nil policy refused: %v", err)
	}
}

// A resolution is reused for CacheTTL, then asked again, so that a name
// re-pointed outside the ranges is refused within it.
func TestDNSCache(t *testing.T) {
	dns := &fakeDNS{table: map[string][]string{"e.example.com": {"10.0.2.9"}}}
	now := time.Unix(1000, 0)
	p := newPolicy(t, dns, func() time.Time { return now })
	ctx := context.Background()
	const model = "meta-llama/Llama-3.1-8B-Instruct"
	for range 5 {
		if err := p.Check(ctx, model, "e", "http://e.example.com", ""); err != nil {
			t.Fatal(err)
		}
	}
	if n := dns.lookups.Load(); n != 1 {
		t.Fatalf("%d lookups for 5 checks within the TTL, want 1", n)
	}
	dns.table["e.example.com"] = []string{"127.0.0.1"}
	now = now.Add(endpoints.DefaultCacheTTL + time.Second)
	if r := endpoints.Reason(p.Check(ctx, model, "e", "http://e.example.com", "")); r != endpoints.ReasonDNS {
		t.Fatalf("reason %q after the name moved to loopback, want %q", r, endpoints.ReasonDNS)
	}
	// A flood of new names is resolved at most MaxDNSCache times per TTL.
	for i := range endpoints.MaxDNSCache + 50 {
		_ = p.Check(ctx, model, "e", "http://n"+strings.Repeat("x", i%7)+itoa(i)+".example.com", "")
	}
	if n := dns.lookups.Load(); n > endpoints.MaxDNSCache+2 {
		t.Fatalf("%d lookups for %d new names, want at most %d", n, endpoints.MaxDNSCache+50, endpoints.MaxDNSCache+2)
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}

func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ name, yaml, want string }{
		{"empty", "", "empty"},
		{"unknown field", "models: [{model: m, cidr: [10.0.0.0/8]}]", "cidr"},
		{"bad range", "models: [{model: m, cidrs: [10.0.0.0/33]}]", "models[0].cidrs[0]"},
		{"bad engine", "models: [{model: m, engines: [{name: a.b, urls: [http://x]}]}]", "models[0].engines[0].name"},
		{"bad URL", "models: [{model: m, engines: [{name: a, urls: [ftp://x]}]}]", "models[0].engines[0].urls[0]"},
		{"bad host", "models: [{model: m, hosts: ['a:80']}]", "models[0].hosts[0]"},
		{"bad pattern", "models: [{model: m, subjects: ['a.>.b']}]", "models[0].subjects[0]"},
		{"no model", "models: [{cidrs: [10.0.0.0/8]}]", "models[0].model"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, err := endpoints.Parse([]byte(c.yaml))
			if err == nil {
				_, err = endpoints.New(f, endpoints.Options{})
			}
			if err == nil || !errors.Is(err, endpoints.ErrBadPolicy) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want ErrBadPolicy naming %q", err, c.want)
			}
		})
	}
}

func TestOf(t *testing.T) {
	u, s := endpoints.Of([]messages.Transport{
		{Kind: messages.TransportNATS, Address: "sy.infer.*"},
		{Kind: messages.TransportHTTP, Address: "not a url"},
		{Kind: messages.TransportHTTP, Address: "http://127.0.0.1:1/"},
		{Kind: messages.TransportNATS, Address: "sy.infer.m.e"},
		{Kind: messages.TransportHTTP, Address: "http://127.0.0.1:2"},
	})
	if u != "http://127.0.0.1:1" || s != "sy.infer.m.e" {
		t.Fatalf("Of = %q, %q", u, s)
	}
}

// FuzzCheck feeds Check what a signal may carry: it never panics, and
// what it allows for an unpinned engine is in the policy's ranges or
// patterns.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{"http://10.0.2.1:8000", "http://[::ffff:10.0.2.1]", "https://a.gpu.internal/x/", "http://127.0.0.1:8001", "http://%zz", "sy.infer.m.e"} {
		f.Add("engine-c", s, "sy.infer.a.b")
	}
	dns := &fakeDNS{table: map[string][]string{}}
	f.Fuzz(func(t *testing.T, engine, rawURL, subject string) {
		p := newPolicy(t, dns, nil)
		_ = p.Check(context.Background(), "meta-llama/Llama-3.1-8B-Instruct", engine, rawURL, subject)
		if err := p.Check(context.Background(), "meta-llama/Llama-3.1-8B-Instruct", "engine-c", rawURL, ""); err == nil && rawURL != "" {
			u, perr := url.Parse(rawURL)
			if perr != nil {
				t.Fatalf("allowed %q, which does not parse: %v", rawURL, perr)
			}
			host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
			if strings.HasSuffix(host, ".gpu.internal") || host == "gpu-1.example.com" {
				return
			}
			a, aerr := netip.ParseAddr(host)
			if aerr != nil {
				t.Fatalf("allowed %q, whose host %q no pattern matches and no name resolves", rawURL, host)
			}
			a = a.Unmap()
			for _, r := range []string{"10.0.2.0/24", "192.168.7.7/32", "fd00::/8"} {
				if netip.MustParsePrefix(r).Contains(a) {
					return
				}
			}
			t.Fatalf("allowed %q, whose address %s is in no range", rawURL, a)
		}
	})
}

// The compose stack's policy (examples/engine-endpoints.yaml) reads, and
// pins each of its engines.
func TestExamplePolicy(t *testing.T) {
	f, err := endpoints.LoadFile("../../examples/engine-endpoints.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dns := &fakeDNS{table: map[string][]string{"engine-a": {"172.18.0.5"}, "engine-b": {"172.18.0.6"}}}
	p, err := endpoints.New(f, endpoints.Options{Resolver: dns})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Check(context.Background(), "llama", "engine-a", "http://172.18.0.5:8000", ""); err != nil {
		t.Fatal(err)
	}
	if err := p.Check(context.Background(), "llama", "engine-b", "http://172.18.0.5:8000", ""); endpoints.Reason(err) != endpoints.ReasonURL {
		t.Fatalf("engine-b at engine-a's address: %v, want refused", err)
	}
}
