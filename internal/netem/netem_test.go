package netem_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-dev/switchyard/internal/netem"
	"github.com/switchyard-dev/switchyard/router/selection"
	"github.com/switchyard-dev/switchyard/router/upstream"
)

type instantTransport struct{}

func (instantTransport) Forward(context.Context, selection.Engine, *upstream.Request) (*upstream.Response, error) {
	return &upstream.Response{Status: http.StatusOK, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok"))}, nil
}

func TestDelayTransport(t *testing.T) {
	d := &netem.DelayTransport{Next: instantTransport{}, Delay: func(engine string) time.Duration {
		if engine == "far" {
			return 30 * time.Millisecond
		}
		return 0
	}}
	for _, c := range []struct {
		engine   string
		min, max time.Duration
	}{{"near", 0, 25 * time.Millisecond}, {"far", 60 * time.Millisecond, time.Second}} {
		start := time.Now()
		resp, err := d.Forward(context.Background(), selection.Engine{Name: c.engine}, &upstream.Request{})
		took := time.Since(start)
		if err != nil || resp.Status != http.StatusOK {
			t.Fatalf("%s: %v", c.engine, err)
		}
		if took < c.min || took > c.max {
			t.Fatalf("%s: took %s, want %s..%s (one round trip of emulated delay)", c.engine, took, c.min, c.max)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	if _, err := d.Forward(ctx, selection.Engine{Name: "far"}, &upstream.Request{}); err == nil {
		t.Fatal("a request whose context ends during the emulated delay was forwarded")
	}
}
