package router

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/guard"
	"github.com/switchyard-dev/switchyard/router/httpfront"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/router/tenant"
)

// frontDoorKeys is a keys file of tenants "gold" (critical ceiling and
// default, key sk-gold), "team" (standard ceiling, default sheddable, key
// sk-team) and "basic" (standard ceiling and default, 2 req/s with a burst
// of 2, key sk-basic).
func frontDoorKeys(t testing.TB) *tenant.Gate {
	t.Helper()
	k, err := tenant.Parse([]byte(`tenants:
  - name: gold
    max_priority: critical
    default_priority: critical
    keys: ["` + tenant.FormatHash(tenant.HashKey("sk-gold")) + `"]
  - name: team
    default_priority: sheddable
    keys: ["` + tenant.FormatHash(tenant.HashKey("sk-team")) + `"]
  - name: basic
    rate_rps: 2
    burst: 2
    keys: ["` + tenant.FormatHash(tenant.HashKey("sk-basic")) + `"]
`))
	if err != nil {
		t.Fatal(err)
	}
	g, err := tenant.NewGate(k, nil)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// errorCode returns the code of an OpenAI-shaped error body.
func errorCode(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error struct {
			Code    *string `json:"code"`
			Type    string  `json:"type"`
			Message string  `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code == nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("not an OpenAI error body: %q (%v)", body, err)
	}
	return *e.Error.Code
}

// TestFrontDoorKeys: with keys, a missing or unknown key gets 401
// invalid_api_key and reaches no engine; a known one, in Authorization or
// api-key, is served and is not forwarded to the engine. Without keys the
// front is open and forwards the client's Authorization as before.
func TestFrontDoorKeys(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		var mu sync.Mutex
		var seen []string // the engine's Authorization, api-key and x-api-key of each request
		eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body)
			mu.Lock()
			seen = append(seen, r.Header.Get("Authorization")+"|"+r.Header.Get("Api-Key")+"|"+r.Header.Get("X-Api-Key"))
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"object":"chat.completion"}`)
		}))
		t.Cleanup(eng.Close)
		serve := func(gate *tenant.Gate) string {
			tables := NewStaticTables()
			tables.Set("m", mustTable(t, []selection.Engine{{Name: "e", URL: eng.URL, Weight: 1}}, selection.TableOptions{}), control.Info{Mode: control.ModeSnapshot})
			h, err := NewHandler(Options{Tables: tables, Tenants: gate})
			if err != nil {
				t.Fatal(err)
			}
			return serveFront(t, kind, h, httpfront.ServerOptions{})
		}
		client := testClient(t)
		post := func(url string, hdr map[string]string) (int, string) {
			req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatBody))
			req.Header.Set("Content-Type", "application/json")
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		closed := serve(frontDoorKeys(t))
		for _, hdr := range []map[string]string{nil, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "Basic c2stZ29sZA=="}} {
			st, body := post(closed, hdr)
			if st != http.StatusUnauthorized || errorCode(t, body) != "invalid_api_key" {
				t.Fatalf("%v: %d %s, want 401 invalid_api_key", hdr, st, body)
			}
			if strings.Contains(body, "sk-wrong") {
				t.Fatalf("the 401 quotes the whole key: %s", body)
			}
		}
		mu.Lock()
		if len(seen) != 0 {
			t.Fatalf("refused requests reached the engine: %q", seen)
		}
		mu.Unlock()
		for _, hdr := range []map[string]string{{"Authorization": "Bearer sk-gold"}, {"Api-Key": "sk-gold"}, {"X-Api-Key": "sk-gold"}} {
			if st, body := post(closed, hdr); st != http.StatusOK {
				t.Fatalf("%v: %d %s", hdr, st, body)
			}
		}
		mu.Lock()
		if strings.Join(seen, ",") != "||,||,||" {
			t.Fatalf("the engine saw the tenant's key: %q", seen)
		}
		seen = nil
		mu.Unlock()
		open := serve(nil)
		if st, body := post(open, map[string]string{"Authorization": "Bearer engine-key"}); st != http.StatusOK {
			t.Fatalf("open front: %d %s", st, body)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(seen) != 1 || seen[0] != "Bearer engine-key||" {
			t.Fatalf("the open front forwarded %q, want the client's Authorization", seen)
		}
	})
}

// TestFrontDoorPriorityCeiling: under an overload that sheds every
// standard and sheddable request and no critical one, a tenant whose
// ceiling is standard asking critical is shed as standard, while a tenant
// allowed critical is served, with or without the header (its default).
func TestFrontDoorPriorityCeiling(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		figs := &guard.Figures{ShedFraction: 0.5, HasShedByPriority: true, ShedByPriority: [3]float64{1, 1, 0}}
		f := newPFront(t, kind, []int32{modeOK, modeOK}, []float64{0.5, 0.5}, figs, Options{Tenants: frontDoorKeys(t)})
		open := newPFront(t, kind, []int32{modeOK}, []float64{1}, figs, Options{})
		const n = 20
		count := func(pf *pfront, key, prio string) (map[int]int, string) {
			got := map[int]int{}
			last := ""
			for i := range n {
				hdr := map[string]string{messages.HeaderSessionID: fmt.Sprint("k", i)}
				if key != "" {
					hdr["Authorization"] = "Bearer " + key
				}
				if prio != "" {
					hdr[messages.HeaderPriority] = prio
				}
				r := pf.do(streamBody("x"), hdr)
				if r.err != nil {
					t.Fatal(r.err)
				}
				got[r.status]++
				last = r.body
			}
			return got, last
		}
		// The header alone would get critical treatment on an open front.
		if got, _ := count(open, "", "critical"); got[200] != n {
			t.Fatalf("open front, critical: %v", got)
		}
		for _, c := range []struct {
			key, prio string
			status    int
			code      string
		}{
			{"sk-team", "critical", 429, "overloaded"}, // capped to standard, and shed as standard is
			{"sk-team", "standard", 429, "overloaded"},
			{"sk-team", "", 429, "overloaded"}, // team's default, sheddable
			{"sk-gold", "critical", 200, ""},
			{"sk-gold", "", 200, ""}, // gold's default, critical
		} {
			got, body := count(f, c.key, c.prio)
			if got[c.status] != n || (c.code != "" && errorCode(t, body) != c.code) {
				t.Fatalf("%s asking %q: %v (last %s), want %d × %d %s", c.key, c.prio, got, body, n, c.status, c.code)
			}
		}
	})
}

// TestFrontDoorRateLimit: a tenant over its rate gets an OpenAI-shaped 429
// rate_limit_exceeded with Retry-After, and is served again once its
// bucket refills (on the handler's clock), while another tenant is not
// held back.
func TestFrontDoorRateLimit(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		c := &clock{}
		f := newPFront(t, kind, []int32{modeOK}, []float64{1}, nil, Options{Tenants: frontDoorKeys(t), Now: c.now})
		basic := map[string]string{"Authorization": "Bearer sk-basic"}
		for i := range 2 { // the burst
			if r := f.do(streamBody("x"), basic); r.status != 200 {
				t.Fatalf("request %d within the burst: %d %s", i, r.status, r.body)
			}
		}
		r := f.do(streamBody("x"), basic)
		if r.status != 429 || errorCode(t, r.body) != "rate_limit_exceeded" || r.header.Get("Retry-After") != "1" {
			t.Fatalf("over the rate: %d %s Retry-After %q", r.status, r.body, r.header.Get("Retry-After"))
		}
		if r := f.do(streamBody("x"), map[string]string{"Authorization": "Bearer sk-gold"}); r.status != 200 {
			t.Fatalf("another tenant: %d %s", r.status, r.body)
		}
		c.advance(time.Second) // 2 tokens at 2 req/s
		for i := range 2 {
			if r := f.do(streamBody("x"), basic); r.status != 200 {
				t.Fatalf("request %d after the refill: %d %s", i, r.status, r.body)
			}
		}
		if r := f.do(streamBody("x"), basic); r.status != 429 {
			t.Fatalf("over the rate again: %d", r.status)
		}
		if got := metricValue(f.h.metrics.requests.WithLabelValues(labelTenant, "429")); got != 2 {
			t.Fatalf("requests{model=%q,code=429} = %v, want 2", labelTenant, got)
		}
	})
}
