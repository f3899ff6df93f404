// Package endpoints is the operator's say over where traffic may go: the
// engine endpoints (HTTP base URLs and NATS inference subjects) an engine's
// signal may advertise, per model — exact per engine (the catalogue), or by
// address range, host name pattern and subject pattern. An engine's
// signals describe it; they never decide on their own where prompts and
// their Authorization headers are sent. Routers ignore a signal whose
// endpoint the policy refuses, and the optimizer service plans no engine
// whose advertised endpoint it refuses. It also holds the one rule that
// picks a signal's usable endpoints (Of).
package endpoints

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/switchyard-dev/switchyard/messages"
)

// AnyModel, as a rule's model, applies the rule to every model.
const AnyModel = "*"

// Limits of a policy file, so that reading one cannot exhaust memory.
const (
	// MaxFileBytes bounds a policy file.
	MaxFileBytes = 4 << 20
	// MaxDNSCache bounds the host names whose resolution a Policy keeps;
	// past it, a name not yet resolved is refused until entries expire
	// (an engine advertising a new name per signal cannot make a router
	// resolve without bound).
	MaxDNSCache = 1024
	// MaxLookups bounds the resolutions in flight at once; past it, a
	// name not yet resolved is refused (ErrResolving) until one ends.
	MaxLookups = 8
)

// Defaults of zero Options fields.
const (
	// DefaultLookupTimeout bounds one resolution of a host name: a check
	// runs on the signal path, which must not wait on a slow resolver.
	DefaultLookupTimeout = time.Second
	// DefaultCacheTTL is how long a name's resolution (or its failure) is
	// reused: long enough that a router resolves each engine's name a
	// few times a minute, not per signal, and short enough that a name
	// re-pointed at a refused address is refused within half a minute.
	DefaultCacheTTL = 30 * time.Second
)

// Refusal reasons, the label values of the metrics that count refusals.
const (
	// ReasonModel: the policy has no rule for the signal's model.
	ReasonModel = "model"
	// ReasonURL: the HTTP URL is not the engine's, nor in an allowed
	// address range or host pattern.
	ReasonURL = "url"
	// ReasonSubject: the NATS subject is neither the engine's own nor
	// allowed.
	ReasonSubject = "subject"
	// ReasonDNS: the URL's host name resolves (also) to an address outside
	// the allowed ranges, or could not be resolved.
	ReasonDNS = "dns"
)

// ErrRefused is wrapped by every refusal of Check (a *Refusal).
var ErrRefused = errors.New("engine endpoint refused by the operator's policy")

// ErrResolving is wrapped, beside ErrRefused, by the refusal of a URL
// whose host name is being resolved: Check never waits on DNS (it runs on
// the signal path), so the endpoint is refused until the resolution is
// known, which the engine's next signal finds a moment later. Callers need
// not alarm on it.
var ErrResolving = errors.New("host name being resolved")

// ErrBadPolicy is wrapped by every error of Parse, LoadFile and New.
var ErrBadPolicy = errors.New("invalid engine endpoint policy")

// Refusal is why Check refused an endpoint.
type Refusal struct {
	// Reason is one of the Reason constants.
	Reason string
	// Model and Engine name the engine.
	Model, Engine string
	// Endpoint is the URL or subject refused.
	Endpoint string
	// Detail says what the policy allows instead, or what the name
	// resolved to.
	Detail string
	// Resolving is set when the host name's resolution is not known yet
	// (errors.Is ErrResolving).
	Resolving bool
}

// Error says what was refused for whom, and why.
func (r *Refusal) Error() string {
	return fmt.Sprintf("%v: engine %s of model %q advertises %q (%s): %s", ErrRefused, r.Engine, r.Model, r.Endpoint, r.Reason, r.Detail)
}

// Unwrap makes errors.Is(err, ErrRefused) hold, and ErrResolving while
// the host name is being resolved.
func (r *Refusal) Unwrap() []error {
	if r.Resolving {
		return []error{ErrRefused, ErrResolving}
	}
	return []error{ErrRefused}
}

// Reason returns the refusal reason of err, a Check error ("" for nil or
// another error).
func Reason(err error) string {
	var r *Refusal
	if errors.As(err, &r) {
		return r.Reason
	}
	return ""
}

// File is a policy file: rules per model.
//
//	models:
//	  - model: meta-llama/Llama-3.1-8B-Instruct
//	    engines:
//	      - name: engine-a
//	        urls: [http://10.0.1.5:8000]
//	    cidrs: [10.0.2.0/24]
//	    hosts: ["*.gpu.internal"]
//	    subjects: ["sy.infer.*.*"]
//	  - model: "*"
//	    cidrs: [10.9.0.0/16]
type File struct {
	// Models are the rules, one or more per model id (AnyModel for all).
	Models []Rules `yaml:"models" json:"models"`
}

// Rules are what engines of one model may advertise. An engine listed in
// Engines (of this model's rules or AnyModel's) is pinned: it may
// advertise only its listed URLs and subjects (and its own subject), so
// that an engine cannot take over another's address in a range both share;
// a listed URL that names its host also admits the URL with an address the
// name resolves to in its place (an engine advertises the address it
// listens on).
// Any other engine of the model may advertise a URL whose host is in
// CIDRs (a name: every address it resolves to) or matches Hosts, and a
// subject that matches Subjects; its own inference subject is always
// allowed (Options.OwnSubject).
type Rules struct {
	// Model is the model id, or AnyModel.
	Model string `yaml:"model" json:"model"`
	// Engines pin engines to their endpoints.
	Engines []EngineRule `yaml:"engines,omitempty" json:"engines,omitempty"`
	// CIDRs are the address ranges an unpinned engine's URL may be in,
	// whatever its port (e.g. 10.0.0.0/8, fd00::/8; a bare address is a
	// single-address range).
	CIDRs []string `yaml:"cidrs,omitempty" json:"cidrs,omitempty"`
	// Hosts are host name patterns an unpinned engine's URL may name: a
	// name, or *.domain for every name below domain. A name allowed here
	// is trusted as the operator's DNS resolves it.
	Hosts []string `yaml:"hosts,omitempty" json:"hosts,omitempty"`
	// Subjects are NATS subject patterns (with * and >) an unpinned
	// engine may advertise.
	Subjects []string `yaml:"subjects,omitempty" json:"subjects,omitempty"`
}

// EngineRule pins one engine to its endpoints.
type EngineRule struct {
	// Name is the engine.
	Name string `yaml:"name" json:"name"`
	// URLs are its HTTP base URLs, exactly (scheme, host, port, path).
	URLs []string `yaml:"urls,omitempty" json:"urls,omitempty"`
	// Subjects are NATS subjects it may advertise beyond its own.
	Subjects []string `yaml:"subjects,omitempty" json:"subjects,omitempty"`
}

// Parse reads a policy file (YAML, of which JSON is a subset), strictly:
// unknown fields are errors.
func Parse(data []byte) (File, error) {
	if len(data) > MaxFileBytes {
		return File{}, fmt.Errorf("%w: %d bytes, more than %d", ErrBadPolicy, len(data), MaxFileBytes)
	}
	var f File
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return File{}, fmt.Errorf("%w: the file is empty (write models: [] to refuse every endpoint)", ErrBadPolicy)
		}
		return File{}, fmt.Errorf("%w: %w", ErrBadPolicy, err)
	}
	return f, nil
}

// LoadFile reads and parses the policy file at path.
func LoadFile(path string) (File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return File{}, fmt.Errorf("%w: %w", ErrBadPolicy, err)
	}
	f, err := Parse(data)
	if err != nil {
		return File{}, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Resolver resolves host names; *net.Resolver implements it.
type Resolver interface {
	// LookupNetIP returns the addresses of host.
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Options configures New.
type Options struct {
	// OwnSubject returns the inference subject an engine serves by the
	// layout (streams.Names.InferSubject), always allowed to it; nil
	// allows only the subjects the rules allow.
	OwnSubject func(model, engine string) string
	// Resolver resolves URL host names checked against CIDRs (default
	// net.DefaultResolver).
	Resolver Resolver
	// LookupTimeout bounds one resolution, made in the background
	// (default DefaultLookupTimeout).
	LookupTimeout time.Duration
	// CacheTTL is how long a resolution is reused (default DefaultCacheTTL).
	CacheTTL time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// WithDefaults returns o with its zero fields set to their defaults.
func (o Options) WithDefaults() Options {
	if o.Resolver == nil {
		o.Resolver = net.DefaultResolver
	}
	if o.LookupTimeout == 0 {
		o.LookupTimeout = DefaultLookupTimeout
	}
	if o.CacheTTL == 0 {
		o.CacheTTL = DefaultCacheTTL
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Validate reports the first field of o no policy can run with.
func (o Options) Validate() error {
	if o.LookupTimeout < 0 {
		return fmt.Errorf("%w: Options.LookupTimeout is %s, want > 0 (0: the default)", ErrBadPolicy, o.LookupTimeout)
	}
	if o.CacheTTL < 0 {
		return fmt.Errorf("%w: Options.CacheTTL is %s, want > 0 (0: the default)", ErrBadPolicy, o.CacheTTL)
	}
	return nil
}

// modelRules are the compiled rules of one model (or AnyModel).
type modelRules struct {
	pinned   map[string]*pin // engine → its endpoints
	prefixes []netip.Prefix
	hosts    []string // lower case; "*.x" matches below x
	subjects []string
}

type pin struct {
	urls     map[string]bool // canonical URLs
	subjects map[string]bool
}

type dnsEntry struct {
	addrs   []netip.Addr
	err     error
	expires time.Time
	known   bool // a resolution ended (addrs, err hold it)
	running bool // a resolution is in flight
}

// Policy decides whether an engine may advertise an endpoint. It is safe
// for concurrent use. A nil *Policy allows every endpoint.
type Policy struct {
	opts   Options
	models map[string]*modelRules

	mu       sync.Mutex
	dns      map[string]dnsEntry
	inflight int // resolutions running
}

// New compiles f into a Policy; the error names the rule and field at fault.
func New(f File, opts Options) (*Policy, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	p := &Policy{opts: opts, models: make(map[string]*modelRules), dns: make(map[string]dnsEntry)}
	for i, r := range f.Models {
		field := fmt.Sprintf("models[%d]", i)
		if strings.TrimSpace(r.Model) == "" || strings.ContainsAny(r.Model, " \t\r\n") {
			return nil, fmt.Errorf("%w: %s.model: %q, want a model id or %q", ErrBadPolicy, field, r.Model, AnyModel)
		}
		m := p.models[r.Model]
		if m == nil {
			m = &modelRules{pinned: make(map[string]*pin)}
			p.models[r.Model] = m
		}
		for j, e := range r.Engines {
			ef := fmt.Sprintf("%s.engines[%d]", field, j)
			if err := messages.CheckName(ef+".name", e.Name); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrBadPolicy, err)
			}
			pn := m.pinned[e.Name]
			if pn == nil {
				pn = &pin{urls: map[string]bool{}, subjects: map[string]bool{}}
				m.pinned[e.Name] = pn
			}
			for k, u := range e.URLs {
				c, err := canonicalURL(u)
				if err != nil {
					return nil, fmt.Errorf("%w: %s.urls[%d]: %w", ErrBadPolicy, ef, k, err)
				}
				pn.urls[c] = true
			}
			for k, s := range e.Subjects {
				if !validSubject(s) {
					return nil, fmt.Errorf("%w: %s.subjects[%d]: %q is no NATS subject (no wildcards)", ErrBadPolicy, ef, k, s)
				}
				pn.subjects[s] = true
			}
		}
		for j, c := range r.CIDRs {
			pr, err := parsePrefix(c)
			if err != nil {
				return nil, fmt.Errorf("%w: %s.cidrs[%d]: %w", ErrBadPolicy, field, j, err)
			}
			m.prefixes = append(m.prefixes, pr)
		}
		for j, h := range r.Hosts {
			h = strings.ToLower(strings.TrimSuffix(h, "."))
			if !validHostPattern(h) {
				return nil, fmt.Errorf("%w: %s.hosts[%d]: %q, want a host name or *.domain (no port)", ErrBadPolicy, field, j, r.Hosts[j])
			}
			m.hosts = append(m.hosts, h)
		}
		for j, s := range r.Subjects {
			if !validPattern(s) {
				return nil, fmt.Errorf("%w: %s.subjects[%d]: %q is no NATS subject pattern", ErrBadPolicy, field, j, s)
			}
			m.subjects = append(m.subjects, s)
		}
	}
	return p, nil
}

// Check returns nil when the engine of model may advertise url and
// subject (either may be empty: nothing to check), else a *Refusal
// (errors.Is ErrRefused). It does not block: a URL whose host is a name
// that CIDRs must cover (or a pinned URL's name) is resolved in the
// background and the result kept for Options.CacheTTL, the previous
// result answering while it is renewed; until the first is known the URL
// is refused with ErrResolving.
func (p *Policy) Check(model, engine, rawURL, subject string) error {
	if p == nil || (rawURL == "" && subject == "") {
		return nil
	}
	rs := make([]*modelRules, 0, 2)
	for _, k := range []string{model, AnyModel} {
		if m := p.models[k]; m != nil {
			rs = append(rs, m)
		}
	}
	refuse := func(reason, endpoint, detail string) error {
		return &Refusal{Reason: reason, Model: model, Engine: engine, Endpoint: endpoint, Detail: detail}
	}
	if len(rs) == 0 {
		ep := rawURL
		if ep == "" {
			ep = subject
		}
		return refuse(ReasonModel, ep, "the policy has no rule for the model")
	}
	var pins []*pin
	for _, m := range rs {
		if pn := m.pinned[engine]; pn != nil {
			pins = append(pins, pn)
		}
	}
	if rawURL != "" {
		if err := p.checkURL(rs, pins, rawURL, refuse); err != nil {
			return err
		}
	}
	if subject != "" && (p.opts.OwnSubject == nil || subject != p.opts.OwnSubject(model, engine)) {
		ok := false
		for _, pn := range pins {
			ok = ok || pn.subjects[subject]
		}
		if len(pins) == 0 {
			for _, m := range rs {
				for _, pat := range m.subjects {
					ok = ok || matchSubject(pat, subject)
				}
			}
		}
		if !ok {
			return refuse(ReasonSubject, subject, "neither the engine's own inference subject nor one the policy allows it")
		}
	}
	return nil
}

func (p *Policy) checkURL(rs []*modelRules, pins []*pin, rawURL string, refuse func(reason, endpoint, detail string) error) error {
	c, err := canonicalURL(rawURL)
	if err != nil {
		return refuse(ReasonURL, rawURL, err.Error())
	}
	u, _ := url.Parse(c) // canonicalURL parsed it
	host := u.Hostname()
	if len(pins) > 0 {
		for _, pn := range pins {
			if pn.urls[c] {
				return nil
			}
		}
		if a, err := netip.ParseAddr(host); err == nil {
			switch match, resolving := p.pinnedByName(pins, u, a.Unmap()); {
			case match:
				return nil
			case resolving:
				return resolvingRefusal(refuse(ReasonDNS, rawURL, "a pinned URL's host name is being resolved"))
			}
		}
		return refuse(ReasonURL, rawURL, "not one of the URLs the policy pins the engine to")
	}
	var prefixes []netip.Prefix
	for _, m := range rs {
		prefixes = append(prefixes, m.prefixes...)
		for _, h := range m.hosts {
			if matchHost(h, host) {
				return nil
			}
		}
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if inAny(prefixes, a.Unmap()) {
			return nil
		}
		return refuse(ReasonURL, rawURL, "the address is in none of the model's allowed ranges")
	}
	if len(prefixes) == 0 {
		return refuse(ReasonURL, rawURL, "the host matches none of the model's host patterns")
	}
	addrs, err := p.resolve(host)
	if err != nil {
		r := refuse(ReasonDNS, rawURL, err.Error())
		if errors.Is(err, ErrResolving) {
			r = resolvingRefusal(r)
		}
		return r
	}
	for _, a := range addrs {
		if !inAny(prefixes, a.Unmap()) {
			return refuse(ReasonDNS, rawURL, fmt.Sprintf("%s resolves to %s, in none of the model's allowed ranges", host, a))
		}
	}
	return nil
}

// resolvingRefusal marks r, a *Refusal, as waiting on a resolution.
func resolvingRefusal(r error) error {
	r.(*Refusal).Resolving = true
	return r
}

// pinnedByName reports whether the advertised URL u, whose host is the
// address a, is a pinned URL that names its host (an engine advertises the
// address it listens on, the catalogue the name it has): same scheme, port
// and path, and the name resolves to a; and, when not, whether such a
// name's resolution is not known yet.
func (p *Policy) pinnedByName(pins []*pin, u *url.URL, a netip.Addr) (match, resolving bool) {
	for _, pn := range pins {
		for pu := range pn.urls {
			v, _ := url.Parse(pu)
			name := v.Hostname()
			if _, err := netip.ParseAddr(name); err == nil || v.Scheme != u.Scheme || v.Port() != u.Port() || v.EscapedPath() != u.EscapedPath() {
				continue
			}
			addrs, err := p.resolve(name)
			if err != nil {
				resolving = resolving || errors.Is(err, ErrResolving)
				continue
			}
			for _, b := range addrs {
				if b.Unmap() == a {
					return true, false
				}
			}
		}
	}
	return false, resolving
}

// resolve returns host's addresses as last resolved, and starts a
// resolution in the background when there is none or it is older than
// CacheTTL; ErrResolving while the first is in flight. It never waits on
// the resolver.
func (p *Policy) resolve(host string) ([]netip.Addr, error) {
	now := p.opts.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.dns[host]
	if ok && (e.running || now.Before(e.expires)) {
		if !e.known {
			return nil, fmt.Errorf("%w: %s", ErrResolving, host)
		}
		return e.addrs, e.err
	}
	if !ok && len(p.dns) >= MaxDNSCache {
		for h, e := range p.dns {
			if !e.running && !now.Before(e.expires) {
				delete(p.dns, h)
			}
		}
		if len(p.dns) >= MaxDNSCache {
			return nil, fmt.Errorf("not resolved: %d host names already resolved within %s", MaxDNSCache, p.opts.CacheTTL)
		}
	}
	if p.inflight >= MaxLookups {
		if e.known {
			return e.addrs, e.err
		}
		return nil, fmt.Errorf("%w: %s (%d resolutions in flight)", ErrResolving, host, p.inflight)
	}
	e.running = true
	p.dns[host] = e
	p.inflight++
	go p.lookup(host)
	if e.known {
		return e.addrs, e.err // the previous result, while it is renewed
	}
	return nil, fmt.Errorf("%w: %s", ErrResolving, host)
}

// lookup resolves host and records the result.
func (p *Policy) lookup(host string) {
	ctx, cancel := context.WithTimeout(context.Background(), p.opts.LookupTimeout)
	addrs, err := p.opts.Resolver.LookupNetIP(ctx, "ip", host)
	cancel()
	if err == nil && len(addrs) == 0 {
		err = fmt.Errorf("%s resolves to no address", host)
	}
	if err != nil {
		err = fmt.Errorf("resolve %s: %w", host, err)
	}
	p.mu.Lock()
	p.dns[host] = dnsEntry{addrs: addrs, err: err, expires: p.opts.Now().Add(p.opts.CacheTTL), known: true}
	p.inflight--
	p.mu.Unlock()
}

// Of picks the endpoints of a signal's transports the router uses: the
// first absolute http(s) base URL (without a trailing slash) and the
// first subject without wildcards or spaces; either is empty when none.
func Of(ts []messages.Transport) (baseURL, subject string) {
	for _, t := range ts {
		switch t.Kind {
		case messages.TransportHTTP:
			if baseURL == "" && validBaseURL(t.Address) {
				baseURL = strings.TrimSuffix(t.Address, "/")
			}
		case messages.TransportNATS:
			if subject == "" && validSubject(t.Address) {
				subject = t.Address
			}
		}
	}
	return baseURL, subject
}

func validBaseURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.RawQuery == "" && u.Fragment == ""
}

func validSubject(s string) bool {
	return validPattern(s) && !strings.ContainsAny(s, "*>")
}

func validPattern(s string) bool {
	if s == "" || len(s) > 256 || strings.ContainsAny(s, " \t\r\n") || strings.HasPrefix(s, ".") ||
		strings.HasSuffix(s, ".") || strings.Contains(s, "..") {
		return false
	}
	toks := strings.Split(s, ".")
	for i, t := range toks {
		if (strings.ContainsAny(t, "*>") && len(t) > 1) || (t == ">" && i != len(toks)-1) {
			return false
		}
	}
	return true
}

// matchSubject reports whether subject matches the NATS pattern pat.
func matchSubject(pat, subject string) bool {
	pt, st := strings.Split(pat, "."), strings.Split(subject, ".")
	for i, t := range pt {
		if t == ">" {
			return len(st) > i
		}
		if i >= len(st) || (t != "*" && t != st[i]) {
			return false
		}
	}
	return len(pt) == len(st)
}

// canonicalURL is u as pinned URLs compare: lower-case scheme and host,
// the scheme's default port made explicit, no trailing slash.
func canonicalURL(s string) (string, error) {
	if !validBaseURL(s) {
		return "", fmt.Errorf("%q is no absolute http(s) base URL without query or fragment", s)
	}
	u, _ := url.Parse(s)
	if u.User != nil {
		return "", fmt.Errorf("%q carries user information", s)
	}
	scheme, host, port := strings.ToLower(u.Scheme), strings.ToLower(u.Hostname()), u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[scheme]
	}
	if host == "" {
		return "", fmt.Errorf("%q names no host", s)
	}
	return scheme + "://" + net.JoinHostPort(host, port) + strings.TrimSuffix(u.EscapedPath(), "/"), nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is no address range (CIDR, e.g. 10.0.0.0/8) nor address", s)
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	pr, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is no address range (CIDR, e.g. 10.0.0.0/8): %v", s, err)
	}
	if pr.Addr().Is4In6() {
		pr = netip.PrefixFrom(pr.Addr().Unmap(), pr.Bits()-96)
	}
	return pr.Masked(), nil
}

func inAny(prefixes []netip.Prefix, a netip.Addr) bool {
	for _, pr := range prefixes {
		if pr.Contains(a) {
			return true
		}
	}
	return false
}

func validHostPattern(h string) bool {
	name := strings.TrimPrefix(h, "*.")
	if name == "" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "-") || strings.Contains(name, "..") {
		return false
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// matchHost reports whether host matches pattern h (lower case).
func matchHost(h, host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if rest, ok := strings.CutPrefix(h, "*."); ok {
		return strings.HasSuffix(host, "."+rest) && len(host) > len(rest)+1
	}
	return host == h
}
