package control

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestCheckRTTProbe checks which probes the router accepts, and that a
// refused one names the input.
func TestCheckRTTProbe(t *testing.T) {
	for _, s := range []string{"tcp", "http:/health", "http:/healthz", "http:/v1/models", "http:/health?ready=1"} {
		if err := CheckRTTProbe(s); err != nil {
			t.Errorf("CheckRTTProbe(%q): %v", s, err)
		}
	}
	for _, s := range []string{"TCP", "udp", "http", "http:", "http:health", "http://host/health", "https:/health",
		"/health", "http:/he alth", "http:/health#x", " tcp", "tcp "} {
		err := CheckRTTProbe(s)
		if !errors.Is(err, ErrBadRTTProbe) || !strings.Contains(err.Error(), fmt.Sprintf("%q", s)) {
			t.Errorf("CheckRTTProbe(%q) = %v, want ErrBadRTTProbe naming the input", s, err)
		}
	}
}
