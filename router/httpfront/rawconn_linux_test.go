//go:build linux

package httpfront_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/switchyard-dev/switchyard/router"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/httpfront"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/router/upstream"
)

// TestRawSocketsInUse: the fasthttp front serves clients over upstream's
// raw connections (upstream.Listen), and a request through it works.
func TestRawSocketsInUse(t *testing.T) {
	answer := `{"id":"x","object":"chat.completion","choices":[]}`
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer)
	}))
	t.Cleanup(engine.Close)
	engineURL := engine.URL

	table, err := selection.NewTable([]selection.Engine{{Name: "e", URL: engineURL, Weight: 1}}, selection.TableOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tables := router.NewStaticTables()
	tables.Set("m", table, control.Info{Mode: control.ModeSnapshot})
	h, err := router.NewHandler(router.Options{Tables: tables, Transport: upstream.NewHTTPTransport(upstream.HTTPTransportOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := router.NewServer(h, httpfront.ServerOptions{Kind: httpfront.ServerFast})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})

	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	resp, err := client.Post("http://"+ln.Addr().String()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != answer {
		t.Fatalf("through the router: %d %q, want 200 and the engine's answer", resp.StatusCode, body)
	}

	conns := httpfront.OpenConns(srv)
	for _, c := range conns {
		if typ := fmt.Sprintf("%T", c); typ != "*upstream.rawConn" {
			t.Errorf("the fasthttp front serves a client over a %s, want upstream's rawConn", typ)
		}
	}
	if len(conns) == 0 {
		t.Error("the fasthttp front has no client connection open after a keep-alive request")
	}
}
