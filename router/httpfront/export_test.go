package httpfront

import "net"

// OpenConns returns the client connections a fasthttp Server holds open,
// for the tests of package httpfront_test, which serve a router's
// pipeline.
func OpenConns(srv Server) []net.Conn {
	fs := srv.(*fastServer)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	out := make([]net.Conn, 0, len(fs.conns))
	for c := range fs.conns {
		out = append(out, c)
	}
	return out
}
