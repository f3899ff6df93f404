package tenant

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/rs/zerolog"
)

// DefaultReloadInterval is how often a Watcher re-reads the keys file.
const DefaultReloadInterval = 2 * time.Second

// LoadFile reads and parses the keys file at path.
func LoadFile(path string) (*Keys, []byte, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, nil, err
	}
	k, err := Parse(data)
	if err != nil {
		return nil, nil, fmt.Errorf("tenant: keys file %s: %w", path, err)
	}
	return k, data, nil
}

// readFile reads at most MaxFileBytes+1 bytes of path, so that Parse
// refuses a larger file without it being read whole.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tenant: keys file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("tenant: keys file %s: %w", path, err)
	}
	return data, nil
}

// WatcherOptions configures NewWatcher. Path and Gate are required.
type WatcherOptions struct {
	// Path is the keys file.
	Path string
	// Gate receives every version of the file that parses.
	Gate *Gate
	// Interval is how often the file is re-read (default
	// DefaultReloadInterval).
	Interval time.Duration
	// Logger receives reloads and refused versions.
	Logger zerolog.Logger
}

// WithDefaults returns o with its zero fields set to their defaults.
func (o WatcherOptions) WithDefaults() WatcherOptions {
	if o.Interval <= 0 {
		o.Interval = DefaultReloadInterval
	}
	return o
}

// Validate names the first field of o no watcher can run with.
func (o WatcherOptions) Validate() error {
	if o.Path == "" {
		return fmt.Errorf("%w: WatcherOptions.Path is empty", ErrBadKeys)
	}
	if o.Gate == nil {
		return fmt.Errorf("%w: WatcherOptions.Gate is nil", ErrBadKeys)
	}
	return nil
}

// Watcher keeps a gate on the current version of a keys file: a version
// that does not parse is logged and the one in force stays (a typo does
// not lock every tenant out).
type Watcher struct {
	opts WatcherOptions
	log  zerolog.Logger
	last []byte
}

// NewWatcher returns a watcher for opts; data is the file's text the gate
// holds now (LoadFile's), so that an unchanged file is not parsed again.
func NewWatcher(opts WatcherOptions, data []byte) (*Watcher, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	return &Watcher{opts: opts, log: opts.Logger.With().Str("component", "router").Str("keys_file", opts.Path).Logger(), last: data}, nil
}

// Run re-reads the file every Interval until ctx ends; it returns nil.
func (w *Watcher) Run(ctx context.Context) error {
	t := time.NewTicker(w.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			w.Reload()
		}
	}
}

// Reload reads the file once and applies it when it changed and parses.
// It reports whether a new version is in force.
func (w *Watcher) Reload() bool {
	data, err := readFile(w.opts.Path)
	if err != nil {
		w.log.Warn().Err(err).Msg("keys file unreadable; the tenants in force stay")
		return false
	}
	if bytes.Equal(data, w.last) {
		return false
	}
	k, err := Parse(data)
	if err != nil {
		w.log.Error().Err(err).Msg("keys file refused; the tenants in force stay")
		w.last = data // logged once per version
		return false
	}
	w.last = data
	w.opts.Gate.Set(k)
	w.log.Info().Int("tenants", len(k.tenants)).Msg("keys file reloaded")
	return true
}
