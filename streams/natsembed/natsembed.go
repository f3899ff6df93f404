package natsembed

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"
)

// Options configures an embedded NATS server, with JetStream unless
// NoJetStream is set.
//
// The ports follow nats-server's own convention (server.RANDOM_PORT is -1),
// which the tests and `switchyard up` rely on to run servers side by side:
// a positive port listens there, -1 picks a free port, and 0 means no
// listener, except for Port, where 0 means in-process connections only.
type Options struct {
	// DataDir holds the JetStream file store. Required unless NoJetStream.
	DataDir string
	// NoJetStream runs the server without JetStream of its own. As a leaf
	// node (LeafRemotes) such a server passes JetStream requests, KV
	// buckets included, on to the hub's JetStream.
	NoJetStream bool
	// Host is the client listen address. Empty means DefaultHost.
	Host string
	// Port is the client port: 0 means no client listener at all (in-process
	// connections only), -1 (RandomPort) a random free port.
	Port int
	// ServerName names the server; required in a cluster.
	ServerName string
	// ClusterName, ClusterHost, ClusterPort and Routes make the server one node
	// of a cluster. ClusterPort -1 picks a random port.
	ClusterName string
	ClusterHost string
	ClusterPort int
	Routes      []string
	// LeafHost and LeafPort, when LeafPort is non-zero, accept leaf-node
	// connections from other servers (-1 picks a random port; the host
	// defaults to Host).
	LeafHost string
	LeafPort int
	// LeafRemotes makes this server a leaf node of the servers listening
	// for leaf nodes at these URLs (nats-leaf://host:7422), all of them one
	// hub: it connects to one and fails over to the next, retrying forever
	// in the background, so the server starts even while the hub is down.
	LeafRemotes []string
	// HTTPPort, when non-zero, serves the NATS monitoring endpoints (-1 random).
	HTTPPort int
	// Logger, when set, receives the server's log at debug level (warnings and
	// errors at their own levels).
	Logger *zerolog.Logger
	// StartTimeout bounds the wait for the server to accept connections.
	// Zero means DefaultStartTimeout.
	StartTimeout time.Duration
	// Auth, when its Operator is set, runs the server in operator mode:
	// every client must present a user JWT signed by one of its accounts,
	// and anonymous clients are refused.
	Auth Auth
	// TLS, when its CertFile is set, requires TLS on the client, cluster
	// and leaf-node listeners; cluster routes always verify each other's
	// certificates against TLS.CAFile, so only nodes holding a certificate
	// of the same authority can join.
	TLS TLS
	// LeafCreds is the credentials file this server presents to its hub
	// (LeafRemotes) when the hub runs in operator mode.
	LeafCreds string
	// LeafRemoteTLS, when its CAFile is set, dials LeafRemotes over TLS,
	// checking the hub's certificate against CAFile and presenting
	// CertFile and KeyFile when set (a hub that requires client
	// certificates); VerifyClients is not used. It lets a server without a
	// certificate of its own (a router's, listening on loopback or
	// nowhere) join a hub over TLS; without it, remotes use TLS with TLS's
	// files.
	LeafRemoteTLS TLS
}

// Auth is the decentralised-auth setup of a server: an operator, the
// accounts it signed (served from memory) and the system account.
type Auth struct {
	// Operator is the operator's JWT.
	Operator string
	// SystemAccount is the public key of the system account.
	SystemAccount string
	// Accounts maps each account's public key to its JWT (the system
	// account's included).
	Accounts map[string]string
	// JetStreamAccount is the public key of the account whose JetStream
	// requests cross leaf-node connections (the default account's without
	// an operator).
	JetStreamAccount string
}

// TLS names the PEM files of a server's TLS setup.
type TLS struct {
	// CAFile is the authority clients' and nodes' certificates are checked
	// against, and that leaf-node remotes check the hub's against.
	CAFile string
	// CertFile and KeyFile are the server's certificate (valid for server
	// and client use, since a node dials its routes and leaf remotes) and
	// its key.
	CertFile string
	KeyFile  string
	// VerifyClients requires client certificates signed by CAFile on the
	// client and leaf-node listeners too (mutual TLS).
	VerifyClients bool
}

// Defaults of zero Options fields.
const (
	// DefaultHost keeps an embedded server on loopback unless asked otherwise.
	DefaultHost = "127.0.0.1"
	// DefaultStartTimeout bounds the wait for a new server: recovering a
	// JetStream store of a few hundred MB takes seconds.
	DefaultStartTimeout = 10 * time.Second
	// RandomPort, as a port, picks a free one (server.RANDOM_PORT).
	RandomPort = server.RANDOM_PORT
)

// MaxControlLine is the control line limit of a server in operator mode
// (max_control_line of a nats-server configuration serving these identities).
const MaxControlLine = 32 << 10

// ErrOptions is wrapped by every error of Validate.
var ErrOptions = errors.New("natsembed: invalid options")

// WithDefaults returns a copy of o with every zero field that has a default set to it.
func (o Options) WithDefaults() Options {
	if o.Host == "" {
		o.Host = DefaultHost
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = DefaultStartTimeout
	}
	return o
}

// Validate reports the first field of o (after defaults) that is not
// usable, naming it and its value; the error wraps ErrOptions.
func (o Options) Validate() error {
	o = o.WithDefaults()
	if !o.NoJetStream && o.DataDir == "" {
		return fmt.Errorf("%w: DataDir is empty, want the JetStream store's directory (or NoJetStream)", ErrOptions)
	}
	for _, p := range []struct {
		field string
		v     int
	}{{"Port", o.Port}, {"ClusterPort", o.ClusterPort}, {"LeafPort", o.LeafPort}, {"HTTPPort", o.HTTPPort}} {
		if p.v < RandomPort || p.v > 65535 {
			return fmt.Errorf("%w: %s is %d, want 1 to 65535, %d (a free port) or 0 (off)", ErrOptions, p.field, p.v, RandomPort)
		}
	}
	if o.ClusterName != "" && o.ServerName == "" {
		return fmt.Errorf("%w: ServerName is empty, want a name for a node of cluster %q", ErrOptions, o.ClusterName)
	}
	for i, r := range o.Routes {
		if u, err := url.Parse(r); err != nil || u.Host == "" {
			return fmt.Errorf("%w: Routes[%d] %q is not a URL like nats-route://host:6222", ErrOptions, i, r)
		}
	}
	for i, r := range o.LeafRemotes {
		if u, err := url.Parse(r); err != nil || u.Host == "" {
			return fmt.Errorf("%w: LeafRemotes[%d] %q is not a URL like nats-leaf://host:7422", ErrOptions, i, r)
		}
	}
	if o.StartTimeout < 0 {
		return fmt.Errorf("%w: StartTimeout is %s, want > 0", ErrOptions, o.StartTimeout)
	}
	if o.Auth.Operator != "" {
		if o.Auth.SystemAccount == "" || o.Auth.Accounts[o.Auth.SystemAccount] == "" {
			return fmt.Errorf("%w: Auth.SystemAccount %q has no JWT in Auth.Accounts", ErrOptions, o.Auth.SystemAccount)
		}
		if o.Auth.JetStreamAccount != "" && o.Auth.Accounts[o.Auth.JetStreamAccount] == "" {
			return fmt.Errorf("%w: Auth.JetStreamAccount %q has no JWT in Auth.Accounts", ErrOptions, o.Auth.JetStreamAccount)
		}
	}
	if o.TLS.CertFile != "" && (o.TLS.KeyFile == "" || o.TLS.CAFile == "") {
		return fmt.Errorf("%w: TLS.CertFile %q wants TLS.KeyFile and TLS.CAFile too", ErrOptions, o.TLS.CertFile)
	}
	if o.TLS.VerifyClients && o.TLS.CertFile == "" {
		return fmt.Errorf("%w: TLS.VerifyClients is set without TLS.CertFile", ErrOptions)
	}
	if t := o.LeafRemoteTLS; t != (TLS{}) {
		if len(o.LeafRemotes) == 0 {
			return fmt.Errorf("%w: LeafRemoteTLS is set without LeafRemotes", ErrOptions)
		}
		if t.CAFile == "" {
			return fmt.Errorf("%w: LeafRemoteTLS.CAFile is empty, want the authority the hub's certificate is checked against", ErrOptions)
		}
		if (t.CertFile == "") != (t.KeyFile == "") {
			return fmt.Errorf("%w: LeafRemoteTLS.CertFile %q and KeyFile %q: want both or neither", ErrOptions, t.CertFile, t.KeyFile)
		}
	}
	return nil
}

// ErrPortInUse is returned by Start when the client or cluster port is taken.
var ErrPortInUse = errors.New("natsembed: port already in use")

// Server is a running embedded NATS server.
type Server struct {
	srv *server.Server
}

// Start starts an embedded NATS server (with JetStream unless
// opts.NoJetStream) and waits until it accepts connections.
func Start(opts Options) (*Server, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if !opts.NoJetStream {
		if err := os.MkdirAll(opts.DataDir, 0o755); err != nil {
			return nil, fmt.Errorf("natsembed: create data directory %s: %w", opts.DataDir, err)
		}
	}
	host := opts.Host
	so := &server.Options{
		ServerName: opts.ServerName,
		Host:       host,
		Port:       opts.Port,
		JetStream:  !opts.NoJetStream,
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
				return nil, fmt.Errorf("natsembed: route %q: %w", r, err)
			}
			so.Routes = append(so.Routes, u)
		}
	}
	if opts.LeafPort != 0 {
		lh := opts.LeafHost
		if lh == "" {
			lh = host
		}
		if opts.LeafPort > 0 {
			if err := checkFree(lh, opts.LeafPort); err != nil {
				return nil, err
			}
		}
		so.LeafNode.Host, so.LeafNode.Port = lh, opts.LeafPort
	}
	if len(opts.LeafRemotes) > 0 {
		remote := &server.RemoteLeafOpts{}
		for _, r := range opts.LeafRemotes {
			u, err := url.Parse(r)
			if err != nil || u.Host == "" {
				return nil, fmt.Errorf("natsembed: leaf-node remote %q is not a URL like nats-leaf://host:7422", r)
			}
			remote.URLs = append(remote.URLs, u)
		}
		so.LeafNode.Remotes = []*server.RemoteLeafOpts{remote}
		so.LeafNode.ReconnectInterval = time.Second
	}
	if opts.LeafPort != 0 || len(opts.LeafRemotes) > 0 {
		// Let JetStream requests of the default account cross leaf-node
		// connections, on both ends: a leaf node without JetStream then
		// reaches its hub's streams and buckets under the usual $JS.API
		// subjects, with no JetStream domain to configure. (nats-server
		// otherwise denies them there, so that a leaf with JetStream of
		// its own cannot answer for the hub.)
		acc := server.DEFAULT_GLOBAL_ACCOUNT
		if opts.Auth.Operator != "" {
			acc = opts.Auth.JetStreamAccount
		}
		if acc != "" {
			so.JsAccDefaultDomain = map[string]string{acc: ""}
		}
	}
	if err := configureAuth(so, opts); err != nil {
		return nil, err
	}
	srv, err := server.NewServer(so)
	if err != nil {
		return nil, fmt.Errorf("natsembed: configure embedded NATS server: %w", err)
	}
	if opts.Logger != nil {
		srv.SetLoggerV2(&serverLogger{log: *opts.Logger}, false, false, false)
	}
	srv.Start()
	timeout := opts.StartTimeout
	if !srv.ReadyForConnections(timeout) {
		srv.Shutdown()
		return nil, fmt.Errorf("natsembed: embedded NATS server (data dir %s) not ready within %s", opts.DataDir, timeout)
	}
	return &Server{srv: srv}, nil
}

// configureAuth sets the operator, the memory resolver and TLS of so.
func configureAuth(so *server.Options, opts Options) error {
	if a := opts.Auth; a.Operator != "" {
		oc, err := jwt.DecodeOperatorClaims(a.Operator)
		if err != nil {
			return fmt.Errorf("natsembed: operator JWT: %w", err)
		}
		res := &server.MemAccResolver{}
		for pub, tok := range a.Accounts {
			if err := res.Store(pub, tok); err != nil {
				return fmt.Errorf("natsembed: account %s: %w", pub, err)
			}
		}
		so.TrustedOperators = []*jwt.OperatorClaims{oc}
		// A user JWT carries its permissions inside CONNECT: a router's
		// list of the JetStream API subjects it may use passes 4 KiB,
		// nats-server's default control line.
		so.MaxControlLine = MaxControlLine
		so.AccountResolver = res
		so.SystemAccount = a.SystemAccount
	}
	if t := opts.TLS; t.CertFile != "" {
		client, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: t.CertFile, KeyFile: t.KeyFile, CaFile: t.CAFile, Verify: t.VerifyClients})
		if err != nil {
			return fmt.Errorf("natsembed: TLS (cert %s, key %s, CA %s): %w", t.CertFile, t.KeyFile, t.CAFile, err)
		}
		so.TLSConfig, so.TLS, so.TLSVerify, so.TLSTimeout = client, true, t.VerifyClients, 2
		so.TLSCaCert = t.CAFile
		if so.Cluster.Name != "" {
			routes, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: t.CertFile, KeyFile: t.KeyFile, CaFile: t.CAFile, Verify: true})
			if err != nil {
				return fmt.Errorf("natsembed: cluster TLS: %w", err)
			}
			routes.RootCAs = routes.ClientCAs // a node dials its routes as a client
			so.Cluster.TLSConfig, so.Cluster.TLSTimeout = routes, 2
		}
		if so.LeafNode.Port != 0 {
			leaf, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: t.CertFile, KeyFile: t.KeyFile, CaFile: t.CAFile, Verify: t.VerifyClients})
			if err != nil {
				return fmt.Errorf("natsembed: leaf-node TLS: %w", err)
			}
			so.LeafNode.TLSConfig, so.LeafNode.TLSTimeout = leaf, 2
		}
		for _, r := range so.LeafNode.Remotes {
			remote, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: t.CertFile, KeyFile: t.KeyFile, CaFile: t.CAFile})
			if err != nil {
				return fmt.Errorf("natsembed: leaf-node remote TLS: %w", err)
			}
			// GenTLSConfig puts the CA in ClientCAs; a remote checks the hub's certificate with RootCAs.
			remote.RootCAs = remote.ClientCAs
			r.TLS, r.TLSConfig, r.TLSTimeout = true, remote, 2
		}
	}
	if t := opts.LeafRemoteTLS; t.CAFile != "" {
		for _, r := range so.LeafNode.Remotes {
			remote, err := remoteTLS(t)
			if err != nil {
				return err
			}
			r.TLS, r.TLSConfig, r.TLSTimeout = true, remote, 2
		}
	}
	for _, r := range so.LeafNode.Remotes {
		r.Credentials = opts.LeafCreds
	}
	return nil
}

// remoteTLS is the client side of a leaf-node connection: the hub's
// certificate checked against t.CAFile, t's certificate presented if any.
func remoteTLS(t TLS) (*tls.Config, error) {
	ca, err := os.ReadFile(t.CAFile)
	if err != nil {
		return nil, fmt.Errorf("natsembed: leaf-node remote TLS: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("natsembed: leaf-node remote TLS: %s holds no PEM certificate", t.CAFile)
	}
	c := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("natsembed: leaf-node remote TLS: certificate %s, key %s: %w", t.CertFile, t.KeyFile, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
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
func (e *Server) Server() *server.Server { return e.srv }

// ClientURL returns the URL clients connect to, or "" without a client listener.
func (e *Server) ClientURL() string {
	if e.srv.Addr() == nil {
		return ""
	}
	return e.srv.ClientURL()
}

// LeafURL returns the nats-leaf:// URL of this server's leaf-node listener, or "".
func (e *Server) LeafURL() string {
	v, err := e.srv.Varz(nil)
	if err != nil || v.LeafNode.Port <= 0 {
		return ""
	}
	return "nats-leaf://" + net.JoinHostPort(v.LeafNode.Host, strconv.Itoa(v.LeafNode.Port))
}

// Shutdown stops the server and waits until it has stopped.
func (e *Server) Shutdown() {
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
