package router

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/switchyard-dev/switchyard/router/httpfront"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/router/upstream"
)

// dialTimeoutTransport fails every attempt at once with a network timeout,
// as a connect that times out does.
type dialTimeoutTransport struct{}

func (dialTimeoutTransport) Forward(ctx context.Context, e selection.Engine, req *upstream.Request) (*upstream.Response, error) {
	return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
}

// TestTimeoutBelowDeadlineSaysWhy: a timeout that is not the attempt's own
// deadline (here, connecting) is answered 504 with the underlying error, not
// with "sent nothing within" the per-attempt deadline, which did not pass.
func TestTimeoutBelowDeadlineSaysWhy(t *testing.T) {
	forEachServer(t, func(t *testing.T, kind httpfront.ServerKind) {
		f := newPFront(t, kind, []int32{modeOK}, []float64{1}, nil, Options{Transport: dialTimeoutTransport{}})
		r := f.do(streamBody("x"), nil)
		if r.status != 504 {
			t.Fatalf("status %d, want 504: %s", r.status, r.body)
		}
		if !strings.Contains(r.body, "upstream_timeout") || !strings.Contains(r.body, "timed out after") ||
			!strings.Contains(r.body, "dial tcp") || strings.Contains(r.body, "sent nothing within") {
			t.Fatalf("body %s: want the connect timeout named", r.body)
		}
	})
}
