package protocol

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// OpenAI error types used in error bodies.
const (
	ErrTypeInvalidRequest = "invalid_request_error"
	ErrTypeNotFound       = "not_found_error"
	ErrTypeServer         = "server_error"
	ErrTypeUnavailable    = "service_unavailable"
)

// APIError is an error answered to a client in the OpenAI error shape:
// {"error": {"message", "type", "param", "code"}} with an HTTP status.
type APIError struct {
	// Status is the HTTP status code to answer with.
	Status int `json:"-"`
	// Message says what failed, for people.
	Message string `json:"message"`
	// Type is the OpenAI error type, e.g. ErrTypeInvalidRequest.
	Type string `json:"type"`
	// Param names the offending request parameter, if any.
	Param *string `json:"param"`
	// Code is a short machine-readable code, if any.
	Code *string `json:"code"`
}

// Error returns the message with its status.
func (e *APIError) Error() string {
	return "status " + strconv.Itoa(e.Status) + ": " + e.Message
}

// NewAPIError builds an APIError; empty param or code render as null.
func NewAPIError(status int, typ, code, param, msg string) *APIError {
	e := &APIError{Status: status, Message: msg, Type: typ}
	if param != "" {
		e.Param = &param
	}
	if code != "" {
		e.Code = &code
	}
	return e
}

// InvalidRequest is a 400 invalid_request_error about param.
func InvalidRequest(param, msg string) *APIError {
	return NewAPIError(http.StatusBadRequest, ErrTypeInvalidRequest, "", param, msg)
}

// WriteError writes e as an OpenAI error body with e.Status (500 when unset).
func WriteError(w http.ResponseWriter, e *APIError) {
	status := e.Status
	if status == 0 {
		status = http.StatusInternalServerError
	}
	body, err := json.Marshal(struct {
		Error *APIError `json:"error"`
	}{e})
	if err != nil { // cannot happen with string fields; keep the shape anyway
		body = []byte(`{"error":{"message":"internal error","type":"server_error","param":null,"code":null}}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	h.Del("Content-Encoding")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
