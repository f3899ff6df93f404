//go:build linux

package router

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/switchyard-dev/switchyard/router/control"
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

	tables := NewStaticTables()
	tables.Set("m", mustTable(t, []selection.Engine{{Name: "e", URL: engineURL, Weight: 1}}, selection.TableOptions{}), control.Info{Mode: control.ModeSnapshot})
	h, err := NewHandler(Options{Tables: tables, Transport: upstream.NewHTTPTransport(upstream.HTTPTransportOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(h, ServerOptions{Kind: ServerFast})
	if err != nil {
		t.Fatal(err)
	}
	fs := srv.(*fastServer)
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

	resp, err := testClient(t).Post("http://"+ln.Addr().String()+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != answer {
		t.Fatalf("through the router: %d %q, want 200 and the engine's answer", resp.StatusCode, body)
	}

	fs.mu.Lock()
	n := len(fs.conns)
	for c := range fs.conns {
		if typ := fmt.Sprintf("%T", c); typ != "*upstream.rawConn" {
			t.Errorf("the fasthttp front serves a client over a %s, want upstream's rawConn", typ)
		}
	}
	fs.mu.Unlock()
	if n == 0 {
		t.Error("the fasthttp front has no client connection open after a keep-alive request")
	}
}
