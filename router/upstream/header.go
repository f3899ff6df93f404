package upstream

import (
	"net/http"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-dev/switchyard/messages"
)

// Header returns the value of key (lower-case) in h, also under its
// canonical HTTP form, and whether it is present.
func Header(h nats.Header, key string) (string, bool) {
	if len(h) == 0 {
		return "", false
	}
	if vs, ok := h[key]; ok && len(vs) > 0 {
		return vs[0], true
	}
	if vs, ok := h[canonicalKey(key)]; ok && len(vs) > 0 {
		return vs[0], true
	}
	return "", false
}

// canonicalKey is http.CanonicalHeaderKey(key), without its allocation for
// the headers the router reads.
func canonicalKey(key string) string {
	switch key {
	case messages.NATSHeaderRequestID:
		return messages.HeaderRequestID
	case messages.NATSHeaderSessionID:
		return messages.HeaderSessionID
	case messages.NATSHeaderPriority:
		return messages.HeaderPriority
	case messages.NATSHeaderEngine:
		return messages.HeaderEngine
	}
	return http.CanonicalHeaderKey(key)
}
