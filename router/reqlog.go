package router

import (
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/router/protocol"
)

// reqLog is one request's logger, built from base with the request's
// fields only when a line is emitted: most requests log nothing at the
// usual levels, and With would cost every request an allocation and the
// encoding of its fields. A nil *zerolog.Event (a level that is off) is a
// no-op in zerolog, as it is from a Logger.
type reqLog struct {
	base   *zerolog.Logger
	model  string
	id     string
	key    protocol.KeySource
	prio   protocol.Priority
	front  string // "" for HTTP
	tenant string // "" without keys
	built  *zerolog.Logger
}

// logger returns the request's logger, building it on first use.
func (r *reqLog) logger() *zerolog.Logger {
	if r.built == nil {
		c := r.base.With().Str("model", r.model).Str("request_id", r.id).Str("key", r.key.String()).
			Str("priority", r.prio.String())
		if r.front != "" {
			c = c.Str("front", r.front)
		}
		if r.tenant != "" {
			c = c.Str("tenant", r.tenant)
		}
		l := c.Logger()
		r.built = &l
	}
	return r.built
}

// on reports whether base logs at lvl: its level, the global level and a
// writer (the zero Logger has none) allow it. Only a logger that does
// log at lvl costs a probe event, which is discarded.
func (r *reqLog) on(lvl zerolog.Level) bool {
	if lvl < r.base.GetLevel() || lvl < zerolog.GlobalLevel() {
		return false
	}
	e := r.base.WithLevel(lvl)
	if e == nil {
		return false
	}
	e.Discard()
	return true
}

// Debug starts a debug line (nil when debug is off).
func (r *reqLog) Debug() *zerolog.Event {
	if !r.on(zerolog.DebugLevel) {
		return nil
	}
	return r.logger().Debug()
}

// Info starts an info line (nil when info is off).
func (r *reqLog) Info() *zerolog.Event {
	if !r.on(zerolog.InfoLevel) {
		return nil
	}
	return r.logger().Info()
}

// Warn starts a warning line (nil when warnings are off).
func (r *reqLog) Warn() *zerolog.Event {
	if !r.on(zerolog.WarnLevel) {
		return nil
	}
	return r.logger().Warn()
}
