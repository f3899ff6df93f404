// Package tenant is the router's front door: the API keys file that maps
// each key (stored as its SHA-256 only) to a tenant, each tenant's
// priority ceiling, default priority and rate limit, and the Gate that
// both fronts' pipeline asks for every request: which tenant sent it, at
// what priority it runs, and whether it is within its rate. It does no I/O
// but reading the keys file (Watcher) and counts its decisions in one
// metric whose tenant label is bounded.
package tenant

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/protocol"
)

// Limits of a keys file.
const (
	// MaxFileBytes bounds a keys file.
	MaxFileBytes = 4 << 20
	// MaxTenants bounds the tenants of a file.
	MaxTenants = 10000
	// MaxNameLen bounds a tenant's name.
	MaxNameLen = 64
	// MaxKeyLen bounds an API key as a client sends it.
	MaxKeyLen = 256
	// MaxRPS bounds a tenant's rate, requests/s.
	MaxRPS = 1e6
)

// ErrBadKeys marks a keys file that cannot be used (matched with
// errors.Is; the error names the tenant and field).
var ErrBadKeys = errors.New("invalid keys file")

// File is a keys file as written:
//
//	tenants:
//	  - name: acme
//	    max_priority: standard      # the ceiling: critical, standard (default) or sheddable
//	    default_priority: standard  # without the header (default: standard, capped to the ceiling)
//	    rate_rps: 50                # token bucket refill, requests/s (0: no limit)
//	    burst: 100                  # token bucket size (default: rate_rps rounded up, at least 1)
//	    keys:
//	      - sha256:<64 hex digits>  # printf %s "$KEY" | sha256sum
type File struct {
	Tenants []TenantSpec `yaml:"tenants" json:"tenants"`
}

// TenantSpec is one tenant of a keys file.
type TenantSpec struct {
	Name            string   `yaml:"name" json:"name"`
	MaxPriority     string   `yaml:"max_priority" json:"max_priority"`
	DefaultPriority string   `yaml:"default_priority" json:"default_priority"`
	RateRPS         float64  `yaml:"rate_rps" json:"rate_rps"`
	Burst           int      `yaml:"burst" json:"burst"`
	Keys            []string `yaml:"keys" json:"keys"`
}

// Tenant is one tenant as the gate applies it.
type Tenant struct {
	// Name is the tenant's name, in logs and the metric's label.
	Name string
	// Max is the highest priority the tenant's requests run at: a request
	// asking above it runs at Max.
	Max protocol.Priority
	// Default is the priority of a request without the priority header.
	Default protocol.Priority
	// RPS is the rate limit, requests/s (0: none).
	RPS float64
	// Burst is the token bucket's size (with RPS > 0).
	Burst int
}

// Hash is the SHA-256 of an API key, as the keys file stores it.
type Hash [sha256.Size]byte

// HashKey returns the hash of key.
func HashKey(key string) Hash { return sha256.Sum256([]byte(key)) }

// FormatHash returns h as a keys file writes it ("sha256:" and hex).
func FormatHash(h Hash) string { return "sha256:" + hex.EncodeToString(h[:]) }

// Keys is a parsed keys file: the tenants in file order and the tenant of
// each key hash. It is immutable.
type Keys struct {
	tenants []Tenant
	byHash  map[Hash]int
}

// Tenants returns the tenants in file order.
func (k *Keys) Tenants() []Tenant { return append([]Tenant(nil), k.tenants...) }

// Lookup returns the tenant of the plain API key.
func (k *Keys) Lookup(key string) (Tenant, bool) {
	i, ok := k.byHash[HashKey(key)]
	if !ok {
		return Tenant{}, false
	}
	return k.tenants[i], true
}

// Parse reads a keys file (YAML, of which JSON is a subset), strictly:
// unknown fields, a duplicate tenant or key, a key that is no SHA-256
// hash, a priority that is no class and a default above the ceiling are
// errors naming the tenant and field.
func Parse(data []byte) (*Keys, error) {
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrBadKeys, len(data), MaxFileBytes)
	}
	var f File
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: the file is empty (write tenants: [] to admit no one)", ErrBadKeys)
		}
		return nil, fmt.Errorf("%w: %w", ErrBadKeys, err)
	}
	return f.Keys()
}

// Keys checks f and returns it in the gate's form.
func (f File) Keys() (*Keys, error) {
	if len(f.Tenants) > MaxTenants {
		return nil, fmt.Errorf("%w: tenants: %d, more than %d", ErrBadKeys, len(f.Tenants), MaxTenants)
	}
	k := &Keys{tenants: make([]Tenant, 0, len(f.Tenants)), byHash: make(map[Hash]int)}
	names := make(map[string]bool, len(f.Tenants))
	for i, s := range f.Tenants {
		t, err := s.tenant()
		if err != nil {
			return nil, fmt.Errorf("%w: tenants[%d]: %w", ErrBadKeys, i, err)
		}
		if names[t.Name] {
			return nil, fmt.Errorf("%w: tenants[%d].name: %q appears twice", ErrBadKeys, i, t.Name)
		}
		names[t.Name] = true
		if len(s.Keys) == 0 {
			return nil, fmt.Errorf("%w: tenants[%d] (%s).keys: a tenant needs at least one key", ErrBadKeys, i, t.Name)
		}
		for j, ks := range s.Keys {
			h, err := ParseHash(ks)
			if err != nil {
				return nil, fmt.Errorf("%w: tenants[%d] (%s).keys[%d]: %w", ErrBadKeys, i, t.Name, j, err)
			}
			if prev, dup := k.byHash[h]; dup {
				return nil, fmt.Errorf("%w: tenants[%d] (%s).keys[%d]: the key is also tenant %s's", ErrBadKeys, i, t.Name, j, k.tenants[prev].Name)
			}
			k.byHash[h] = len(k.tenants)
		}
		k.tenants = append(k.tenants, t)
	}
	return k, nil
}

// tenant checks s and applies its defaults.
func (s TenantSpec) tenant() (Tenant, error) {
	if err := checkName(s.Name); err != nil {
		return Tenant{}, fmt.Errorf("name: %w", err)
	}
	t := Tenant{Name: s.Name, Max: protocol.PriorityStandard, RPS: s.RateRPS, Burst: s.Burst}
	if s.MaxPriority != "" {
		p, ok := parseClass(s.MaxPriority)
		if !ok {
			return Tenant{}, fmt.Errorf("(%s).max_priority: %q is not critical, standard or sheddable", s.Name, s.MaxPriority)
		}
		t.Max = p
	}
	t.Default = min(protocol.PriorityStandard, t.Max)
	if s.DefaultPriority != "" {
		p, ok := parseClass(s.DefaultPriority)
		if !ok {
			return Tenant{}, fmt.Errorf("(%s).default_priority: %q is not critical, standard or sheddable", s.Name, s.DefaultPriority)
		}
		if p > t.Max {
			return Tenant{}, fmt.Errorf("(%s).default_priority: %s is above max_priority %s", s.Name, p, t.Max)
		}
		t.Default = p
	}
	if math.IsNaN(t.RPS) || t.RPS < 0 || t.RPS > MaxRPS {
		return Tenant{}, fmt.Errorf("(%s).rate_rps: %v: want 0 (no limit) to %g", s.Name, s.RateRPS, float64(MaxRPS))
	}
	if t.Burst < 0 || t.Burst > int(MaxRPS) {
		return Tenant{}, fmt.Errorf("(%s).burst: %d: want 0 (the default) to %d", s.Name, s.Burst, int(MaxRPS))
	}
	if t.RPS == 0 && t.Burst != 0 {
		return Tenant{}, fmt.Errorf("(%s).burst: %d without rate_rps: a burst needs a rate", s.Name, s.Burst)
	}
	if t.RPS > 0 && t.Burst == 0 {
		t.Burst = max(1, int(math.Ceil(t.RPS)))
	}
	return t, nil
}

// parseClass parses a priority class by name; unlike the header, an empty
// value is none.
func parseClass(v string) (protocol.Priority, bool) {
	if strings.TrimSpace(v) == "" {
		return 0, false
	}
	return protocol.ParsePriority(v)
}

// checkName accepts 1 to MaxNameLen letters, digits, '-', '_' and '.'.
func checkName(s string) error {
	if s == "" || len(s) > MaxNameLen {
		return fmt.Errorf("%q: want 1 to %d characters", s, MaxNameLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("%q: only letters, digits, '-', '_' and '.'", s)
		}
	}
	if s[0] == '_' {
		return fmt.Errorf("%q: a leading '_' is the metric's own labels'", s)
	}
	return nil
}

// ParseHash parses a key hash as the keys file writes it: "sha256:" and
// 64 hex digits.
func ParseHash(s string) (Hash, error) {
	var h Hash
	hx, ok := strings.CutPrefix(s, "sha256:")
	if !ok {
		return h, fmt.Errorf("%.80q: want sha256:<64 hex digits>, the SHA-256 of the key, not the key", s)
	}
	if len(hx) != 2*len(h) {
		return h, fmt.Errorf("%.80q: want 64 hex digits after the sha256: prefix", s)
	}
	if _, err := hex.Decode(h[:], []byte(hx)); err != nil {
		return h, fmt.Errorf("%.80q: %w", s, err)
	}
	return h, nil
}

// Header names a client may send its API key in, canonical (NATS
// clients may write them in lower case, messages.NATSHeaderAuthorization
// and the like).
const (
	HeaderAuthorization = messages.HeaderAuthorization
	HeaderAPIKey        = messages.HeaderAPIKey
	HeaderXAPIKey       = messages.HeaderXAPIKey
)

// KeyFrom returns the API key of a request whose headers get reads
// (canonical names): "Authorization: Bearer <key>" as OpenAI's clients
// send it, else "api-key" (Azure OpenAI's clients), else "x-api-key".
// ok is false when none holds a key of 1 to MaxKeyLen visible ASCII
// characters; an Authorization header of another scheme is no key.
func KeyFrom(get func(name string) (string, bool)) (key string, ok bool) {
	if v, present := get(HeaderAuthorization); present {
		scheme, rest, cut := strings.Cut(strings.TrimSpace(v), " ")
		if cut && strings.EqualFold(scheme, "Bearer") {
			if k := strings.TrimSpace(rest); validKey(k) {
				return k, true
			}
		}
	}
	for _, name := range [...]string{HeaderAPIKey, HeaderXAPIKey} {
		if v, present := get(name); present {
			if k := strings.TrimSpace(v); validKey(k) {
				return k, true
			}
		}
	}
	return "", false
}

func validKey(k string) bool { return protocol.ValidHeaderValue(k, MaxKeyLen) }
