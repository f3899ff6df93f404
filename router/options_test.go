package router

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/router/control"
	"github.com/switchyard-dev/switchyard/router/httpfront"
	"github.com/switchyard-dev/switchyard/router/live"
)

func TestServiceOptionsValidate(t *testing.T) {
	reg := prometheus.NewRegistry()
	wrapped := prometheus.WrapRegistererWith(prometheus.Labels{"cluster": "A"}, reg)
	for _, tc := range []struct {
		name    string
		opts    ServiceOptions
		field   string // "" when valid
		wantErr error
	}{
		{"minimal", ServiceOptions{Cluster: "A"}, "", nil},
		{"no cluster", ServiceOptions{}, "ServiceOptions.Cluster", messages.ErrInvalid},
		{"dotted cluster", ServiceOptions{Cluster: "a.b"}, "ServiceOptions.Cluster", messages.ErrInvalid},
		{"bad router name", ServiceOptions{Cluster: "A", Router: "r 1"}, "ServiceOptions.Router", messages.ErrInvalid},
		{"bad RTT probe", ServiceOptions{Cluster: "A", RTTProbe: "icmp"}, "ServiceOptions.RTTProbe", control.ErrBadRTTProbe},
		{"negative routers", ServiceOptions{Cluster: "A", Protection: live.ProtectionOptions{Routers: -2}}, "ServiceOptions.Protection.Routers", ErrBadOption},
		{"negative slot headroom", ServiceOptions{Cluster: "A", Protection: live.ProtectionOptions{SlotHeadroom: -0.5}}, "ServiceOptions.Protection.SlotHeadroom", ErrBadOption},
		{"no slot headroom", ServiceOptions{Cluster: "A", Protection: live.ProtectionOptions{NoSlotHeadroom: true}}, "", nil},
		{"wrapped registerer without metrics", ServiceOptions{Cluster: "A", Registry: wrapped}, "ServiceOptions.Metrics", ErrBadOption},
		{"wrapped registerer with metrics", ServiceOptions{Cluster: "A", Registry: wrapped, Metrics: reg}, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.opts.withDefaults().Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.field) || !errors.Is(err, tc.wantErr) {
				t.Fatalf("Validate: %v, want an error naming %s that is %v", err, tc.field, tc.wantErr)
			}
		})
	}
}

// TestHandlerSharedRegistry: two handlers registering through registerers
// wrapped with their cluster label into one registry both serve, on
// /metrics, the series of both.
func TestHandlerSharedRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	var hs []*Handler
	for _, c := range []string{"A", "B"} {
		h, err := NewHandler(Options{Tables: NewStaticTables(), Cluster: c,
			Registry: prometheus.WrapRegistererWith(prometheus.Labels{"cluster": c}, reg), Metrics: reg})
		if err != nil {
			t.Fatalf("NewHandler(%s): %v", c, err)
		}
		hs = append(hs, h)
	}
	if _, err := NewHandler(Options{Tables: NewStaticTables(),
		Registry: prometheus.WrapRegistererWith(prometheus.Labels{"cluster": "C"}, reg)}); err == nil {
		t.Fatal("NewHandler with a wrapped Registry and no Metrics succeeded")
	}
	for i, h := range hs {
		url := serveFront(t, httpfront.ServerStd, h, httpfront.ServerOptions{})
		resp, err := testClient(t).Get(url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("handler %d: /metrics status %d", i, resp.StatusCode)
		}
		for _, c := range []string{"A", "B"} {
			if !strings.Contains(string(body), `cluster="`+c+`"`) {
				t.Errorf("handler %d: /metrics lacks cluster %s's series", i, c)
			}
		}
	}
}
