package protocol

import (
	"fmt"
	"net/http"
)

// ClientRequest is what the router's request pipeline reads of a client's
// request, whichever front took it (HTTP on net/http or fasthttp, NATS).
type ClientRequest interface {
	// RequestHeader returns the first value of the named header (canonical
	// HTTP form) and whether the header is present.
	RequestHeader(name string) (string, bool)
	// PassHeaders returns the client headers forwarded to engines.
	PassHeaders() http.Header
	// RequestBody reads the request body within the front's size and time
	// limits.
	RequestBody() ([]byte, *APIError)
	// Check vets a parsed request against what the front's address says
	// of it (the NATS front: the model its subject names); nil when sound.
	Check(req *Request) *APIError
}

// BodyTooLarge is the 413 for a request body over limit bytes.
func BodyTooLarge(limit int64) *APIError {
	return NewAPIError(http.StatusRequestEntityTooLarge, ErrTypeInvalidRequest, "request_too_large", "",
		fmt.Sprintf("request body is larger than the limit of %d bytes", limit))
}

// ValidHeaderValue reports whether v is 1..max visible ASCII characters:
// what the router accepts of a client's id, session or API key header.
func ValidHeaderValue(v string, max int) bool {
	if v == "" || len(v) > max {
		return false
	}
	for i := 0; i < len(v); i++ {
		if v[i] <= ' ' || v[i] > '~' {
			return false
		}
	}
	return true
}
