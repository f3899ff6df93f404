package router

import (
	"net/http"
	"time"
)

// ServerOptions are the http.Server settings for a router front. Zero fields
// take defaults.
type ServerOptions struct {
	// Addr is the listen address, e.g. "127.0.0.1:8081".
	Addr string
	// ReadHeaderTimeout bounds reading request headers (default 10s): a
	// client that never finishes its headers is disconnected.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes idle keep-alive client connections (default 120s).
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds request header size (default 64 KiB).
	MaxHeaderBytes int
}

// NewServer returns an http.Server for h with the router's limits. It sets
// no ReadTimeout or WriteTimeout, which would cut long streamed responses:
// the body read is bounded by Options.BodyReadTimeout in the handler and
// the body size by Options.MaxBodyBytes.
func NewServer(h http.Handler, opts ServerOptions) *http.Server {
	if opts.ReadHeaderTimeout <= 0 {
		opts.ReadHeaderTimeout = 10 * time.Second
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = 120 * time.Second
	}
	if opts.MaxHeaderBytes <= 0 {
		opts.MaxHeaderBytes = 64 << 10
	}
	return &http.Server{
		Addr:              opts.Addr,
		Handler:           h,
		ReadHeaderTimeout: opts.ReadHeaderTimeout,
		IdleTimeout:       opts.IdleTimeout,
		MaxHeaderBytes:    opts.MaxHeaderBytes,
	}
}
