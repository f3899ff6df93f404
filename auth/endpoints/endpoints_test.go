package endpoints_test

import (
	"context"
	"errors"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/auth/endpoints"
	"github.com/switchyard-dev/switchyard/messages"
)

// fakeDNS is a Resolver over a fixed table, counting lookups; with block
// set, lookups wait until it is closed.
type fakeDNS struct {
	mu      sync.Mutex
	table   map[string][]string
	block   chan struct{}
	lookups atomic.Int64
}

func (d *fakeDNS) set(host string, addrs ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.table[host] = addrs
}

func (d *fakeDNS) LookupNetIP(ctx context.Context, _, host string) ([]netip.Addr, error) {
	d.lookups.Add(1)
	d.mu.Lock()
	addrs, ok := d.table[host]
	block := d.block
	d.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
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

// settled is p.Check once any resolution it starts has ended.
func settled(t *testing.T, p *endpoints.Policy, model, engine, rawURL, subject string) error {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		err := p.Check(model, engine, rawURL, subject)
		if !errors.Is(err, endpoints.ErrResolving) {
			return err
		}
		if time.Now().After(deadline) {
			t.Fatalf("Check(%s, %s, %q, %q) still resolving after 5 s", model, engine, rawURL, subject)
		}
	}
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
			err := settled(t, p, c.model, c.engine, c.url, c.subject)
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
	if r := endpoints.Reason(p.Check("n", "e", "http://10.0.0.1", "")); r != endpoints.ReasonModel {
		t.Fatalf("reason %q, want %q", r, endpoints.ReasonModel)
	}
	var nilPolicy *endpoints.Policy
	if err := nilPolicy.Check("n", "e", "http://203.0.113.1", "x"); err != nil {
		t.Fatalf("a nil policy refused: %v", err)
	}
}

// Check never waits on DNS: a name is refused as resolving until its
// resolution is known; it is then reused for CacheTTL, and renewed in the
// background after, the previous result answering meanwhile, so that a
// name re-pointed outside the ranges is refused once the renewal ends.
func TestDNSCache(t *testing.T) {
	dns := &fakeDNS{table: map[string][]string{"e.example.com": {"10.0.2.9"}}}
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	p := newPolicy(t, dns, clock)
	const model = "meta-llama/Llama-3.1-8B-Instruct"
	if err := p.Check(model, "e", "http://e.example.com", ""); !errors.Is(err, endpoints.ErrResolving) || !errors.Is(err, endpoints.ErrRefused) {
		t.Fatalf("first check of a name: %v, want refused while resolving", err)
	}
	if err := settled(t, p, model, "e", "http://e.example.com", ""); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := p.Check(model, "e", "http://e.example.com", ""); err != nil {
			t.Fatal(err)
		}
	}
	if n := dns.lookups.Load(); n != 1 {
		t.Fatalf("%d lookups for checks within the TTL, want 1", n)
	}
	dns.set("e.example.com", "127.0.0.1")
	mu.Lock()
	now = now.Add(endpoints.DefaultCacheTTL + time.Second)
	mu.Unlock()
	// The first check past the TTL answers from the old result and renews it.
	if err := p.Check(model, "e", "http://e.example.com", ""); err != nil {
		t.Fatalf("check past the TTL, during the renewal: %v, want the previous answer", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for endpoints.Reason(p.Check(model, "e", "http://e.example.com", "")) != endpoints.ReasonDNS {
		if time.Now().After(deadline) {
			t.Fatal("the name moved to loopback is still allowed 5 s after its renewal started")
		}
		time.Sleep(time.Millisecond)
	}
	// A flood of new names: at most MaxLookups in flight, at most
	// MaxDNSCache names kept, and every check answers at once.
	dns.block = make(chan struct{})
	start := time.Now()
	for i := range endpoints.MaxDNSCache + 50 {
		if err := p.Check(model, "e", "http://n"+itoa(i)+".example.com", ""); err == nil {
			t.Fatalf("name %d allowed before it resolved", i)
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("%d checks of new names took %s while the resolver hangs, want no wait", endpoints.MaxDNSCache+50, d)
	}
	if n := dns.lookups.Load(); n > 2+endpoints.MaxLookups {
		t.Errorf("%d lookups started while the resolver hangs, want at most %d in flight", n-2, endpoints.MaxLookups)
	}
	close(dns.block)
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
		_ = p.Check("meta-llama/Llama-3.1-8B-Instruct", engine, rawURL, subject)
		if err := p.Check("meta-llama/Llama-3.1-8B-Instruct", "engine-c", rawURL, ""); err == nil && rawURL != "" {
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
	if err := settled(t, p, "llama", "engine-a", "http://172.18.0.5:8000", ""); err != nil {
		t.Fatal(err)
	}
	if err := settled(t, p, "llama", "engine-b", "http://172.18.0.5:8000", ""); endpoints.Reason(err) != endpoints.ReasonURL {
		t.Fatalf("engine-b at engine-a's address: %v, want refused", err)
	}
}
