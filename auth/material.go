package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/switchyard-dev/switchyard/streams"
	"github.com/switchyard-dev/switchyard/streams/natsembed"
)

// Options configures Generate.
type Options struct {
	// Dir receives the material. Required.
	Dir string
	// Names is the layout the permissions are for; zero means streams.DefaultNames().
	Names streams.Names
	// Identities are the users to issue credentials for. An admin
	// identity named "admin" is added when none has that name.
	Identities []Identity
	// Hosts are the names and addresses the server certificate is valid
	// for; localhost, 127.0.0.1 and ::1 are always included.
	Hosts []string
	// CertValidity is how long issued certificates are valid; zero means
	// DefaultCertValidity.
	CertValidity time.Duration
}

// DefaultCertValidity is Options.CertValidity's default.
const DefaultCertValidity = 365 * 24 * time.Hour

// ErrOptions is wrapped by every error of Options.Validate.
var ErrOptions = errors.New("auth: invalid options")

// WithDefaults returns a copy of o with Names, CertValidity and the admin
// identity defaulted and the loopback names added to Hosts.
func (o Options) WithDefaults() Options {
	if o.Names == (streams.Names{}) {
		o.Names = streams.DefaultNames()
	}
	if o.CertValidity == 0 {
		o.CertValidity = DefaultCertValidity
	}
	if !slices.ContainsFunc(o.Identities, func(id Identity) bool { return id.Name == "admin" }) {
		o.Identities = append(slices.Clone(o.Identities), Identity{Name: "admin", Role: RoleAdmin})
	}
	hosts := []string{"localhost", "127.0.0.1", "::1"}
	for _, h := range o.Hosts {
		if h = strings.TrimSpace(h); h != "" && !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	o.Hosts = hosts
	return o
}

// Validate reports the first field of o (after defaults) that is not
// usable; the error wraps ErrOptions.
func (o Options) Validate() error {
	o = o.WithDefaults()
	if o.Dir == "" {
		return fmt.Errorf("%w: Dir is empty, want the directory to write credentials and certificates to", ErrOptions)
	}
	if err := o.Names.Validate(); err != nil {
		return fmt.Errorf("%w: Names: %w", ErrOptions, err)
	}
	seen := map[string]bool{}
	for i, id := range o.Identities {
		if err := id.Validate(); err != nil {
			return fmt.Errorf("%w: Identities[%d]: %w", ErrOptions, i, err)
		}
		if seen[id.Name] {
			return fmt.Errorf("%w: Identities[%d]: name %q given twice", ErrOptions, i, id.Name)
		}
		seen[id.Name] = true
	}
	if o.CertValidity < 0 {
		return fmt.Errorf("%w: CertValidity is %s, want > 0", ErrOptions, o.CertValidity)
	}
	return nil
}

// Material is generated auth material on disk and what a server needs of it.
type Material struct {
	// Dir holds it all.
	Dir string
	// Operator is the operator's JWT; Account and System are the JWTs of
	// the Switchyard account and of the system account, AccountKey and
	// SystemKey their public keys.
	Operator, Account, System string
	AccountKey, SystemKey     string
}

// The files of a material directory, relative to it.
const (
	OperatorFile   = "operator.jwt"
	AccountFile    = "account.jwt"
	SystemFile     = "system.jwt"
	ServerConfFile = "nats-server.conf"
	CAFile         = "tls/ca.pem"
	ServerCertFile = "tls/server.pem"
	ServerKeyFile  = "tls/server-key.pem"
	ClientCertFile = "tls/client.pem"
	ClientKeyFile  = "tls/client-key.pem"
	keysDir        = "keys"
	caKeyFile      = "keys/ca-key.pem"
)

// Path returns the absolute path of one of the material's files.
func (m *Material) Path(file string) string { return filepath.Join(m.Dir, file) }

// CredsFile returns the path of identity's credentials file.
func (m *Material) CredsFile(identity string) string {
	return filepath.Join(m.Dir, identity+".creds")
}

// ServerAuth returns the natsembed operator setup of the material.
func (m *Material) ServerAuth() natsembed.Auth {
	return natsembed.Auth{Operator: m.Operator, SystemAccount: m.SystemKey, JetStreamAccount: m.AccountKey,
		Accounts: map[string]string{m.AccountKey: m.Account, m.SystemKey: m.System}}
}

// ServerTLS returns the natsembed TLS setup of the material; verifyClients
// asks for mutual TLS.
func (m *Material) ServerTLS(verifyClients bool) natsembed.TLS {
	return natsembed.TLS{CAFile: m.Path(CAFile), CertFile: m.Path(ServerCertFile), KeyFile: m.Path(ServerKeyFile), VerifyClients: verifyClients}
}

// Connect returns o with identity's credentials and the material's CA set
// (and its client certificate when mutual is set).
func (m *Material) Connect(identity string, mutual bool, o streams.ConnectOptions) streams.ConnectOptions {
	o.Creds, o.InboxPrefix, o.TLSCA = m.CredsFile(identity), streams.InboxPrefix(identity), m.Path(CAFile)
	if mutual {
		o.TLSCert, o.TLSKey = m.Path(ClientCertFile), m.Path(ClientKeyFile)
	}
	return o
}

// Generate writes the material of opts under opts.Dir. The operator,
// account and CA keys already there are reused, so that credentials and
// certificates issued before stay valid; every identity's credentials and
// the certificates are issued afresh, so that they follow opts.
func Generate(opts Options) (*Material, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	for _, d := range []string{opts.Dir, filepath.Join(opts.Dir, keysDir), filepath.Join(opts.Dir, "tls")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("auth: create %s: %w", d, err)
		}
	}
	okp, err := loadOrCreateKey(filepath.Join(opts.Dir, keysDir, "operator.nk"), nkeys.CreateOperator)
	if err != nil {
		return nil, err
	}
	akp, err := loadOrCreateKey(filepath.Join(opts.Dir, keysDir, "account.nk"), nkeys.CreateAccount)
	if err != nil {
		return nil, err
	}
	skp, err := loadOrCreateKey(filepath.Join(opts.Dir, keysDir, "system.nk"), nkeys.CreateAccount)
	if err != nil {
		return nil, err
	}
	m := &Material{Dir: opts.Dir}
	opub, _ := okp.PublicKey()
	m.AccountKey, _ = akp.PublicKey()
	m.SystemKey, _ = skp.PublicKey()

	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "switchyard"
	oc.SystemAccount = m.SystemKey
	if m.Operator, err = oc.Encode(okp); err != nil {
		return nil, fmt.Errorf("auth: sign operator JWT: %w", err)
	}
	ac := jwt.NewAccountClaims(m.AccountKey)
	ac.Name = "switchyard"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1, MaxAckPending: -1}
	if m.Account, err = ac.Encode(okp); err != nil {
		return nil, fmt.Errorf("auth: sign account JWT: %w", err)
	}
	sc := jwt.NewAccountClaims(m.SystemKey)
	sc.Name = "SYS"
	if m.System, err = sc.Encode(okp); err != nil {
		return nil, fmt.Errorf("auth: sign system account JWT: %w", err)
	}
	for file, tok := range map[string]string{OperatorFile: m.Operator, AccountFile: m.Account, SystemFile: m.System} {
		if err := writeFile(m.Path(file), []byte(tok+"\n"), 0o644); err != nil {
			return nil, err
		}
	}
	for _, id := range opts.Identities {
		creds, err := userCreds(akp, id, opts.Names)
		if err != nil {
			return nil, err
		}
		if err := writeFile(m.CredsFile(id.Name), creds, 0o600); err != nil {
			return nil, err
		}
	}
	if err := writeServerConf(m); err != nil {
		return nil, err
	}
	if err := issueCerts(m, opts); err != nil {
		return nil, err
	}
	return m, nil
}

// Load reads the material Generate wrote to dir.
func Load(dir string) (*Material, error) {
	m := &Material{Dir: dir}
	for _, f := range []struct {
		file string
		dst  *string
	}{{OperatorFile, &m.Operator}, {AccountFile, &m.Account}, {SystemFile, &m.System}} {
		b, err := os.ReadFile(m.Path(f.file))
		if err != nil {
			return nil, fmt.Errorf("auth: load material from %s (run `switchyard auth`): %w", dir, err)
		}
		*f.dst = strings.TrimSpace(string(b))
	}
	ac, err := jwt.DecodeAccountClaims(m.Account)
	if err != nil {
		return nil, fmt.Errorf("auth: %s: %w", m.Path(AccountFile), err)
	}
	sc, err := jwt.DecodeAccountClaims(m.System)
	if err != nil {
		return nil, fmt.Errorf("auth: %s: %w", m.Path(SystemFile), err)
	}
	m.AccountKey, m.SystemKey = ac.Subject, sc.Subject
	return m, nil
}

// userCreds issues id's user JWT, signed by the account, with its role's
// permissions, and returns it as a credentials file.
func userCreds(akp nkeys.KeyPair, id Identity, names streams.Names) ([]byte, error) {
	perm, err := id.Permissions(names)
	if err != nil {
		return nil, err
	}
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("auth: create user key of %s: %w", id.Name, err)
	}
	upub, _ := ukp.PublicKey()
	seed, _ := ukp.Seed()
	uc := jwt.NewUserClaims(upub)
	uc.Name = id.Name
	uc.Tags.Add("role:" + string(id.Role))
	uc.Pub.Allow.Add(perm.PubAllow...)
	uc.Pub.Deny.Add(perm.PubDeny...)
	uc.Sub.Allow.Add(perm.SubAllow...)
	uc.Sub.Deny.Add(perm.SubDeny...)
	if perm.Responses {
		// Streamed answers are many messages; the longest request a router
		// forwards is bounded well below the expiry.
		uc.Resp = &jwt.ResponsePermission{MaxMsgs: -1, Expires: 15 * time.Minute}
	}
	tok, err := uc.Encode(akp)
	if err != nil {
		return nil, fmt.Errorf("auth: sign user JWT of %s: %w", id.Name, err)
	}
	creds, err := jwt.FormatUserConfig(tok, seed)
	if err != nil {
		return nil, fmt.Errorf("auth: format credentials of %s: %w", id.Name, err)
	}
	return creds, nil
}

// writeServerConf writes a nats-server configuration with the operator and
// a memory resolver preloaded with both accounts, for running a plain
// nats-server with the same material.
func writeServerConf(m *Material) error {
	conf := fmt.Sprintf("# The operator and accounts of this directory, for nats-server -c.\noperator: %q\nsystem_account: %s\nresolver: MEMORY\nresolver_preload: {\n  %s: %q\n  %s: %q\n}\n# User JWTs carry their permissions in CONNECT.\nmax_control_line: %d\n",
		m.Path(OperatorFile), m.SystemKey, m.AccountKey, m.Account, m.SystemKey, m.System, natsembed.MaxControlLine)
	return writeFile(m.Path(ServerConfFile), []byte(conf), 0o644)
}

func loadOrCreateKey(path string, create func() (nkeys.KeyPair, error)) (nkeys.KeyPair, error) {
	if b, err := os.ReadFile(path); err == nil {
		kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
		if err != nil {
			return nil, fmt.Errorf("auth: key %s: %w", path, err)
		}
		return kp, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("auth: read key %s: %w", path, err)
	}
	kp, err := create()
	if err != nil {
		return nil, fmt.Errorf("auth: create key %s: %w", path, err)
	}
	seed, _ := kp.Seed()
	if err := writeFile(path, append(seed, '\n'), 0o600); err != nil {
		return nil, err
	}
	return kp, nil
}

// writeFile writes b to path through a temporary file and a rename, so that
// a reader never sees half a file.
func writeFile(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return fmt.Errorf("auth: write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("auth: write %s: %w", path, err)
	}
	return nil
}

// issueCerts loads or creates the CA and issues the server and client
// certificates. The server certificate is valid for client and server use:
// a node dials its routes and leaf remotes with it.
func issueCerts(m *Material, opts Options) error {
	caKey, caCert, err := loadOrCreateCA(m, opts.CertValidity)
	if err != nil {
		return err
	}
	var dns []string
	var ips []net.IP
	for _, h := range opts.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, h)
		}
	}
	server := &x509.Certificate{Subject: pkix.Name{CommonName: "switchyard-nats"}, DNSNames: dns, IPAddresses: ips,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	if err := issue(m, caKey, caCert, server, ServerCertFile, ServerKeyFile, opts.CertValidity); err != nil {
		return err
	}
	client := &x509.Certificate{Subject: pkix.Name{CommonName: "switchyard-client"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	return issue(m, caKey, caCert, client, ClientCertFile, ClientKeyFile, opts.CertValidity)
}

func loadOrCreateCA(m *Material, validity time.Duration) (*ecdsa.PrivateKey, *x509.Certificate, error) {
	keyPEM, kerr := os.ReadFile(m.Path(caKeyFile))
	certPEM, cerr := os.ReadFile(m.Path(CAFile))
	if kerr == nil && cerr == nil {
		kb, _ := pem.Decode(keyPEM)
		cb, _ := pem.Decode(certPEM)
		if kb == nil || cb == nil {
			return nil, nil, fmt.Errorf("auth: %s or %s is not PEM", m.Path(caKeyFile), m.Path(CAFile))
		}
		key, err := x509.ParseECPrivateKey(kb.Bytes)
		if err != nil {
			return nil, nil, fmt.Errorf("auth: CA key %s: %w", m.Path(caKeyFile), err)
		}
		cert, err := x509.ParseCertificate(cb.Bytes)
		if err != nil {
			return nil, nil, fmt.Errorf("auth: CA certificate %s: %w", m.Path(CAFile), err)
		}
		return key, cert, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("auth: CA key: %w", err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "switchyard local CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(10 * validity),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("auth: CA certificate: %w", err)
	}
	cert, _ := x509.ParseCertificate(der)
	kder, _ := x509.MarshalECPrivateKey(key)
	if err := writeFile(m.Path(caKeyFile), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return nil, nil, err
	}
	if err := writeFile(m.Path(CAFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return nil, nil, err
	}
	return key, cert, nil
}

func issue(m *Material, caKey *ecdsa.PrivateKey, ca, tmpl *x509.Certificate, certFile, keyFile string, validity time.Duration) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("auth: key for %s: %w", certFile, err)
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(validity)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("auth: issue %s: %w", certFile, err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	if err := writeFile(m.Path(keyFile), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return err
	}
	return writeFile(m.Path(certFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}
