package upstream

import (
	"net/http"
	"testing"

	"github.com/switchyard-dev/switchyard/messages"
)

func TestCanonicalKeyMatchesHTTP(t *testing.T) {
	for _, k := range []string{messages.NATSHeaderRequestID, messages.NATSHeaderSessionID, messages.NATSHeaderPriority, messages.NATSHeaderEngine, "x-other-thing"} {
		if got, want := canonicalKey(k), http.CanonicalHeaderKey(k); got != want {
			t.Errorf("canonicalKey(%q) = %q, want %q", k, got, want)
		}
	}
}
