package streams

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
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
	// ReconnectWait is the pause between reconnect attempts. Zero means DefaultReconnectWait.
	ReconnectWait time.Duration
	// Creds is the identity's NATS credentials file (a user JWT and its
	// nkey seed, as `switchyard auth` and nsc write them); empty connects
	// without one. Unless InboxPrefix is set, the identity's inbox prefix
	// is InboxPrefix of the JWT's name, the only inbox its permissions let
	// it read.
	Creds string
	// InboxPrefix replaces nats.go's "_INBOX" as the prefix of this
	// connection's reply subjects.
	InboxPrefix string
	// TLSCA is the certificate authority (PEM file) that signed the
	// servers' certificates; setting it requires TLS. TLSCert and TLSKey
	// are this client's certificate and key for servers that verify
	// clients (mutual TLS); set both or neither. In-process connections
	// use none of them.
	TLSCA   string
	TLSCert string
	TLSKey  string
}

// InboxPrefix is the prefix of the reply subjects of identity (a NATS user
// name): _INBOX_<identity>. Each identity may subscribe below its own
// prefix only, so no one else can read the replies it is sent.
func InboxPrefix(identity string) string { return "_INBOX_" + identity }

// ErrNoURL is returned by Connect when neither URLs nor InProcess is set;
// it wraps ErrOptions.
var ErrNoURL = fmt.Errorf("%w: no NATS URL given", ErrOptions)

// DefaultReconnectWait is ConnectOptions.ReconnectWait's default: short,
// since a router or service without NATS works on stale state.
const DefaultReconnectWait = 250 * time.Millisecond

// WithDefaults returns a copy of o with the URLs split at commas (one per
// element, trimmed, empty ones dropped) and ReconnectWait defaulted.
func (o ConnectOptions) WithDefaults() ConnectOptions {
	var urls []string
	for _, u := range o.URLs {
		for _, p := range strings.Split(u, ",") {
			if p = strings.TrimSpace(p); p != "" {
				urls = append(urls, p)
			}
		}
	}
	o.URLs = urls
	if o.ReconnectWait == 0 {
		o.ReconnectWait = DefaultReconnectWait
	}
	return o
}

// Validate reports the first field of o (after defaults) that is not
// usable, naming it and its value (a URL's password redacted); the error
// wraps ErrOptions (ErrNoURL when there is nothing to connect to).
func (o ConnectOptions) Validate() error {
	o = o.WithDefaults()
	if len(o.URLs) == 0 && o.InProcess == nil {
		return ErrNoURL
	}
	for i, s := range o.URLs {
		full := s
		if !strings.Contains(s, "://") {
			full = "nats://" + s // nats.go's default scheme
		}
		u, err := url.Parse(full)
		if err != nil || u.Hostname() == "" {
			return fmt.Errorf("%w: URLs[%d] %q is not a NATS URL like nats://host:4222", ErrOptions, i, redactURL(s))
		}
	}
	if o.ReconnectWait < 0 {
		return fmt.Errorf("%w: ReconnectWait is %s, want >= 0", ErrOptions, o.ReconnectWait)
	}
	if (o.TLSCert == "") != (o.TLSKey == "") {
		return fmt.Errorf("%w: TLSCert %q and TLSKey %q: set both (mutual TLS) or neither", ErrOptions, o.TLSCert, o.TLSKey)
	}
	if o.InboxPrefix != "" && !validInboxPrefix(o.InboxPrefix) {
		return fmt.Errorf("%w: InboxPrefix %q is not a subject prefix (tokens of A-Z a-z 0-9 _ - separated by dots)", ErrOptions, o.InboxPrefix)
	}
	return nil
}

func validInboxPrefix(p string) bool {
	for _, t := range strings.Split(p, ".") {
		if t == "" || strings.ContainsAny(t, "*> \t") {
			return false
		}
	}
	return true
}

// credsName returns the name in the user JWT of a credentials file.
func credsName(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("streams: read credentials %s: %w", file, err)
	}
	tok, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return "", fmt.Errorf("streams: credentials %s: %w", file, err)
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return "", fmt.Errorf("streams: credentials %s: user JWT: %w", file, err)
	}
	if uc.Name == "" {
		return "", fmt.Errorf("streams: credentials %s: the user JWT has no name to derive an inbox prefix from", file)
	}
	return uc.Name, nil
}

// redactURL returns s with the password of its URL, if any, hidden.
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil {
		if _, has := u.User.Password(); !has {
			return s
		}
		return u.Redacted()
	}
	if at := strings.LastIndex(s, "@"); at >= 0 {
		return "xxxxx" + s[at:]
	}
	return s
}

// connectedURL names the server c is connected to, for the log. An
// in-process connection has no URL of its own (nats.go reports its default,
// nats://127.0.0.1:4222, whatever the server listens on): it is named
// "in-process", with the server's client URL when it listens on one.
func (o ConnectOptions) connectedURL(c *nats.Conn) string {
	if o.InProcess == nil {
		return c.ConnectedUrlRedacted()
	}
	if s, ok := o.InProcess.(interface {
		Addr() net.Addr
		ClientURL() string
	}); ok && s.Addr() != nil {
		return "in-process " + s.ClientURL()
	}
	return "in-process"
}

// Connect dials NATS with reconnect-forever and logs connection events.
func Connect(ctx context.Context, opts ConnectOptions) (*nats.Conn, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	urls, wait := opts.URLs, opts.ReconnectWait
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
			log.Info().Str("url", opts.connectedURL(c)).Msg("nats reconnected")
		}),
		nats.ConnectHandler(func(c *nats.Conn) {
			log.Info().Str("url", opts.connectedURL(c)).Msg("nats connected")
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
	inbox := opts.InboxPrefix
	if opts.Creds != "" {
		nopts = append(nopts, nats.UserCredentials(opts.Creds))
		if inbox == "" {
			name, err := credsName(opts.Creds)
			if err != nil {
				return nil, err
			}
			inbox = InboxPrefix(name)
		}
	}
	if inbox != "" {
		nopts = append(nopts, nats.CustomInboxPrefix(inbox))
	}
	if opts.InProcess == nil && opts.TLSCA != "" {
		nopts = append(nopts, nats.RootCAs(opts.TLSCA))
	}
	if opts.InProcess == nil && opts.TLSCert != "" {
		nopts = append(nopts, nats.ClientCert(opts.TLSCert, opts.TLSKey))
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
			redacted := make([]string, len(urls))
			for i, u := range urls {
				redacted[i] = redactURL(u)
			}
			return nil, fmt.Errorf("streams: connect to NATS at %s: %w", strings.Join(redacted, ","), r.err)
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
