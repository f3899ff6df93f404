package streams

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"
)

// EmbeddedOptions configures an embedded NATS server with JetStream.
type EmbeddedOptions struct {
	// DataDir holds the JetStream file store. Required.
	DataDir string
	// Host is the client listen address. Empty means 127.0.0.1.
	Host string
	// Port is the client port: 0 means no client listener at all (in-process
	// connections only), -1 a random free port.
	Port int
	// ServerName names the server; required in a cluster.
	ServerName string
	// ClusterName, ClusterHost, ClusterPort and Routes make the server one node
	// of a cluster. ClusterPort -1 picks a random port.
	ClusterName string
	ClusterHost string
	ClusterPort int
	Routes      []string
	// HTTPPort, when non-zero, serves the NATS monitoring endpoints (-1 random).
	HTTPPort int
	// Logger, when set, receives the server's log at debug level (warnings and
	// errors at their own levels).
	Logger *zerolog.Logger
	// StartTimeout bounds the wait for the server to accept connections. Zero means 10 s.
	StartTimeout time.Duration
}

// ErrPortInUse is returned by StartEmbedded when the client or cluster port is taken.
var ErrPortInUse = errors.New("streams: port already in use")

// Embedded is a running embedded NATS server.
type Embedded struct {
	srv *server.Server
}

// StartEmbedded starts an embedded NATS server with JetStream on and waits
// until it accepts connections.
func StartEmbedded(opts EmbeddedOptions) (*Embedded, error) {
	if opts.DataDir == "" {
		return nil, errors.New("streams: embedded server needs a data directory")
	}
	if err := os.MkdirAll(opts.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("streams: create data directory %s: %w", opts.DataDir, err)
	}
	host := opts.Host
	if host == "" {
		host = "127.0.0.1"
	}
	so := &server.Options{
		ServerName: opts.ServerName,
		Host:       host,
		Port:       opts.Port,
		JetStream:  true,
		StoreDir:   opts.DataDir,
		NoSigs:     true,
		MaxPayload: 8 << 20,
	}
	if opts.Port == 0 {
		so.DontListen = true
	} else if opts.Port > 0 {
		if err := checkFree(host, opts.Port); err != nil {
			return nil, err
		}
	}
	if opts.HTTPPort != 0 {
		so.HTTPHost = host
		so.HTTPPort = opts.HTTPPort
	}
	if opts.ClusterName != "" {
		ch := opts.ClusterHost
		if ch == "" {
			ch = host
		}
		if opts.ClusterPort > 0 {
			if err := checkFree(ch, opts.ClusterPort); err != nil {
				return nil, err
			}
		}
		so.Cluster = server.ClusterOpts{Name: opts.ClusterName, Host: ch, Port: opts.ClusterPort}
		for _, r := range opts.Routes {
			u, err := url.Parse(r)
			if err != nil {
				return nil, fmt.Errorf("streams: route %q: %w", r, err)
			}
			so.Routes = append(so.Routes, u)
		}
	}
	srv, err := server.NewServer(so)
	if err != nil {
		return nil, fmt.Errorf("streams: configure embedded NATS server: %w", err)
	}
	if opts.Logger != nil {
		srv.SetLoggerV2(&serverLogger{log: *opts.Logger}, false, false, false)
	}
	srv.Start()
	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	if !srv.ReadyForConnections(timeout) {
		srv.Shutdown()
		return nil, fmt.Errorf("streams: embedded NATS server (data dir %s) not ready within %s", opts.DataDir, timeout)
	}
	return &Embedded{srv: srv}, nil
}

func checkFree(host string, port int) error {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrPortInUse, addr, err)
	}
	return l.Close()
}

// Server returns the underlying nats-server, e.g. for in-process connections.
func (e *Embedded) Server() *server.Server { return e.srv }

// ClientURL returns the URL clients connect to, or "" without a client listener.
func (e *Embedded) ClientURL() string {
	if e.srv.Addr() == nil {
		return ""
	}
	return e.srv.ClientURL()
}

// ClusterURL returns the nats-route:// URL of this node's cluster listener, or "".
func (e *Embedded) ClusterURL() string {
	a := e.srv.ClusterAddr()
	if a == nil {
		return ""
	}
	return "nats-route://" + a.String()
}

// Shutdown stops the server and waits until it has stopped.
func (e *Embedded) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

// serverLogger adapts zerolog to the nats-server logger interface.
type serverLogger struct{ log zerolog.Logger }

func (l *serverLogger) Noticef(format string, v ...any) { l.log.Debug().Msgf(format, v...) }
func (l *serverLogger) Warnf(format string, v ...any)   { l.log.Warn().Msgf(format, v...) }
func (l *serverLogger) Fatalf(format string, v ...any)  { l.log.Error().Msgf(format, v...) }
func (l *serverLogger) Errorf(format string, v ...any)  { l.log.Error().Msgf(format, v...) }
func (l *serverLogger) Debugf(format string, v ...any)  { l.log.Trace().Msgf(format, v...) }
func (l *serverLogger) Tracef(format string, v ...any)  { l.log.Trace().Msgf(format, v...) }
