package tenant_test

import (
	"strings"
	"testing"

	"github.com/switchyard-dev/switchyard/router/tenant"
)

// FuzzParse: any input parses or fails with ErrBadKeys, never panics, and
// a file that parses finds each of its tenants by none but their keys.
func FuzzParse(f *testing.F) {
	f.Add([]byte(keysFile("sk-a", "sk-b")))
	f.Add([]byte(`{"tenants":[{"name":"j","rate_rps":1e6,"burst":1000000,"keys":["sha256:` + strings.Repeat("0", 64) + `"]}]}`))
	f.Add([]byte("tenants:\n  - name: x\n    keys: [&a sha256:00, *a]\n"))
	f.Add([]byte("tenants: !!binary AAAA"))
	f.Fuzz(func(t *testing.T, data []byte) {
		k, err := tenant.Parse(data)
		if err != nil {
			return
		}
		for _, tn := range k.Tenants() {
			if tn.Default > tn.Max || tn.RPS < 0 || (tn.RPS > 0 && tn.Burst < 1) {
				t.Fatalf("tenant %+v out of its rules", tn)
			}
		}
		if _, ok := k.Lookup(string(data)); ok {
			t.Fatalf("the file's own text is a key of it")
		}
	})
}

// FuzzKeyFrom: any header values give a key of visible ASCII within the
// limit, or none.
func FuzzKeyFrom(f *testing.F) {
	f.Add("Bearer sk-1", "", "")
	f.Add("bearer\tsk", "k", "")
	f.Add("", "", "x\x00y")
	f.Fuzz(func(t *testing.T, auth, apiKey, xKey string) {
		k, ok := tenant.KeyFrom(headers("Authorization", auth, "Api-Key", apiKey, "X-Api-Key", xKey))
		if !ok {
			return
		}
		if k == "" || len(k) > tenant.MaxKeyLen || strings.ContainsFunc(k, func(r rune) bool { return r <= ' ' || r > '~' }) {
			t.Fatalf("key %q", k)
		}
	})
}
