package streams

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// ConnectOptions configures Connect.
type ConnectOptions struct {
	// URLs lists the NATS servers, comma-separated or one per element.
	URLs []string
	// Name is the connection name shown by the server.
	Name string
	// Logger receives connection events (disconnect, reconnect, errors).
	Logger zerolog.Logger
	// WaitForServer makes Connect return at once even if no server is up yet,
	// connecting in the background; by default Connect fails when no server answers.
	WaitForServer bool
	// InProcess, when set, connects to this embedded server without a socket.
	InProcess nats.InProcessConnProvider
	// ReconnectWait is the pause between reconnect attempts. Zero means 250 ms.
	ReconnectWait time.Duration
}

// ErrNoURL is returned by Connect when neither URLs nor InProcess is set.
var ErrNoURL = errors.New("streams: no NATS URL given")

// Connect dials NATS with reconnect-forever and logs connection events.
func Connect(ctx context.Context, opts ConnectOptions) (*nats.Conn, error) {
	var urls []string
	for _, u := range opts.URLs {
		for _, p := range strings.Split(u, ",") {
			if p = strings.TrimSpace(p); p != "" {
				urls = append(urls, p)
			}
		}
	}
	if len(urls) == 0 && opts.InProcess == nil {
		return nil, ErrNoURL
	}
	wait := opts.ReconnectWait
	if wait == 0 {
		wait = 250 * time.Millisecond
	}
	log := opts.Logger
	nopts := []nats.Option{
		nats.Name(opts.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(wait),
		nats.ReconnectJitter(50*time.Millisecond, 250*time.Millisecond),
		nats.ReconnectBufSize(8 << 20),
		nats.PingInterval(5 * time.Second),
		nats.DisconnectErrHandler(func(c *nats.Conn, err error) {
			if err == nil && c.IsClosed() {
				// This process closed the connection (a clean stop): nothing lost.
				log.Info().Msg("nats connection closed")
				return
			}
			log.Warn().Err(err).Msg("nats disconnected")
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info().Str("url", c.ConnectedUrlRedacted()).Msg("nats reconnected")
		}),
		nats.ConnectHandler(func(c *nats.Conn) {
			log.Info().Str("url", c.ConnectedUrlRedacted()).Msg("nats connected")
		}),
		nats.ClosedHandler(func(*nats.Conn) {
			log.Debug().Msg("nats connection closed")
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			ev := log.Warn().Err(err)
			if sub != nil {
				ev = ev.Str("subject", sub.Subject)
			}
			ev.Msg("nats async error")
		}),
	}
	if opts.WaitForServer {
		nopts = append(nopts, nats.RetryOnFailedConnect(true))
	}
	if opts.InProcess != nil {
		nopts = append(nopts, nats.InProcessServer(opts.InProcess))
	}
	type result struct {
		nc  *nats.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		nc, err := nats.Connect(strings.Join(urls, ","), nopts...)
		done <- result{nc, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, fmt.Errorf("streams: connect to NATS at %s: %w", strings.Join(urls, ","), r.err)
		}
		return r.nc, nil
	case <-ctx.Done():
		go func() {
			if r := <-done; r.nc != nil {
				r.nc.Close()
			}
		}()
		return nil, ctx.Err()
	}
}
