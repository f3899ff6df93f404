//go:build unix

package httpfront

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/testenv"
)

// TestPeerClosed: an open connection is not gone; one whose peer sent bytes
// is not gone and keeps them unread (so a pipelined request hides a close
// behind it); one whose peer closed, with nothing unread, is gone.
func TestPeerClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	if peerClosed(server) {
		t.Fatal("an open, quiet connection reads as gone")
	}
	if _, err := client.Write([]byte("GET")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // let the bytes arrive; the peek must not take them
	if peerClosed(server) {
		t.Fatal("a connection with bytes to read reads as gone")
	}
	buf := make([]byte, 3)
	if _, err := io.ReadFull(server, buf); err != nil || string(buf) != "GET" {
		t.Fatalf("after a peek the connection reads %q, %v; want the bytes sent, unconsumed", buf, err)
	}
	_ = client.Close()
	testenv.WaitFor(t, 2*time.Second, "a connection whose peer closed reads as gone", func() bool { return peerClosed(server) })
}
