package router_test

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/httpfront"
	"github.com/switchyard-dev/switchyard/router/tenant"
	"github.com/switchyard-dev/switchyard/testenv"
)

// writeKeys writes a keys file of one tenant, "t1", with key.
func writeKeys(t *testing.T, path, key string) {
	t.Helper()
	text := "tenants:\n  - name: t1\n    keys: [\"" + tenant.FormatHash(tenant.HashKey(key)) + "\"]\n"
	// Written aside and renamed, as an operator's tool should: the router
	// never reads half a file.
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServiceFrontDoor runs a router with a keys file and a metrics
// address, on both HTTP servers: /metrics is on its own address, not on
// the inference port; a request needs a key of the file on the HTTP and
// the NATS front alike; a new version of the file takes effect without a
// restart.
func TestServiceFrontDoor(t *testing.T) {
	for _, kind := range []httpfront.ServerKind{httpfront.ServerStd, httpfront.ServerFast} {
		t.Run(string(kind), func(t *testing.T) {
			env := testenv.StartNATS(t)
			e1 := newHTTPEngine(t, "e1")
			publishSignals(t, env.Dial(t, "engines"), env.Names, 100*time.Millisecond,
				fakeSignal{model: "m", engine: "e1", capacity: 10, health: 1, url: e1.srv.URL})
			keys := filepath.Join(t.TempDir(), "keys.yaml")
			writeKeys(t, keys, "sk-one")
			svc := runService(t, router.ServiceOptions{Conn: env.Dial(t, "router"), Cluster: "A", Router: "r1",
				Server: httpfront.ServerOptions{Kind: kind}, MetricsAddr: "127.0.0.1:0", KeysFile: keys})
			testenv.WaitFor(t, 5*time.Second, "routable", func() bool {
				tb, _, ok := svc.Store().Table("m")
				return ok && tb.Slots() > 0
			})

			if st, body := get(t, "http://"+svc.Addr()+"/metrics"); st != http.StatusNotFound {
				t.Fatalf("/metrics on the inference port: %d %.200s", st, body)
			}
			if st, _ := get(t, "http://"+svc.Addr()+"/healthz"); st != http.StatusOK {
				t.Fatalf("/healthz on the inference port: %d", st)
			}

			post := func(key string) int {
				req, _ := http.NewRequest(http.MethodPost, "http://"+svc.Addr()+"/v1/chat/completions", strings.NewReader(chatJSON("m", false, "x")))
				if key != "" {
					req.Header.Set("Authorization", "Bearer "+key)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode
			}
			if st := post(""); st != http.StatusUnauthorized {
				t.Fatalf("no key: %d", st)
			}
			if st := post("sk-one"); st != http.StatusOK {
				t.Fatalf("the file's key: %d", st)
			}
			client := env.Dial(t, "client")
			nats := func(hdr map[string]string) string {
				msgs := natsRequest(t, client, "sy.req.A.m", chatJSON("m", false, "x"), hdr)
				return msgs[len(msgs)-1].Header.Get(messages.HeaderStatus)
			}
			if st := nats(nil); st != "401" {
				t.Fatalf("NATS front, no key: %s", st)
			}
			if st := nats(map[string]string{messages.NATSHeaderAuthorization: "Bearer sk-one"}); st != "200" {
				t.Fatalf("NATS front, the file's key: %s", st)
			}

			writeKeys(t, keys, "sk-two")
			testenv.WaitFor(t, 10*time.Second, "the new keys file in force", func() bool { return post("sk-two") == http.StatusOK })
			if st := post("sk-one"); st != http.StatusUnauthorized {
				t.Fatalf("a key removed from the file: %d", st)
			}

			st, body := get(t, "http://"+svc.MetricsAddr()+"/metrics")
			if st != http.StatusOK || !strings.Contains(body, `switchyard_router_requests_total{code="401",model="_tenant"}`) ||
				!strings.Contains(body, `switchyard_router_tenant_requests_total{result="admitted",tenant="t1"}`) {
				t.Fatalf("/metrics on the metrics address: %d\n%s", st, body)
			}
		})
	}
}
