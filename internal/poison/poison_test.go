package poison

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/switchyard-dev/switchyard/internal/logthrottle"
	"github.com/switchyard-dev/switchyard/messages"
)

// panics reads the panic counter of handler from reg.
func panics(t *testing.T, reg *prometheus.Registry, handler string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "switchyard_test_handler_panics_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "handler" && l.GetValue() == handler {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func TestRecover(t *testing.T) {
	var buf bytes.Buffer
	reg := prometheus.NewRegistry()
	g, err := New(Options{Component: "test", Logger: zerolog.New(&buf), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	// A second guard of the component shares the counter.
	g2, err := New(Options{Component: "test", Registerer: reg})
	if err != nil {
		t.Fatalf("second guard on one registry: %v", err)
	}
	dropped := 0
	handle := func(subject string, boom bool) {
		defer g.Recover("signals", subject, func() { dropped++ })
		if boom {
			var none []byte
			_ = none[len(subject)] // a real runtime panic: index out of range
		}
	}
	handle("sy.signal.m.a", false)
	if dropped != 0 || panics(t, reg, "signals") != 0 {
		t.Fatalf("no panic: dropped %d, counted %v", dropped, panics(t, reg, "signals"))
	}
	handle("sy.signal.m.a", true)
	handle("sy.signal.m.b", true)
	if dropped != 2 || panics(t, reg, "signals") != 2 {
		t.Fatalf("after 2 panics: dropped %d, counted %v", dropped, panics(t, reg, "signals"))
	}
	out := buf.String()
	for _, want := range []string{"sy.signal.m.a", "sy.signal.m.b", "index out of range", "poison_test.go", `"handler":"signals"`} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	// A drop function that panics is contained too.
	func() {
		defer g.Recover("signals", "x", func() { panic("drop failed") })
		panic("first")
	}()
	if panics(t, reg, "signals") != 3 {
		t.Fatalf("counted %v, want 3", panics(t, reg, "signals"))
	}
	func() {
		defer g2.Recover("signals", "y", nil)
		panic("in the second guard")
	}()
	if panics(t, reg, "signals") != 4 {
		t.Fatalf("counted %v after the second guard's panic, want 4 (one shared counter)", panics(t, reg, "signals"))
	}
}

func TestLogBounded(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	g, err := New(Options{Component: "test", Logger: zerolog.New(&buf),
		Throttle: logthrottle.Options{Interval: 10 * time.Second, MaxLines: 3},
		Now:      func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3000 {
		now = now.Add(time.Millisecond)
		g.Log(fmt.Sprint("sy.signal.m.e", i)).Str("subject", "s").Msg("bad")
	}
	if n := strings.Count(buf.String(), "\n"); n != 3 {
		t.Fatalf("%d lines for 3000 sources in 3s, want 3:\n%s", n, buf.String())
	}
	now = now.Add(10 * time.Second)
	g.Flush()
	out := buf.String()
	if !strings.Contains(out, "dropped 2997 log lines for 2997 sources") {
		t.Fatalf("no summary line:\n%s", out)
	}
	g.Flush()
	if n := strings.Count(buf.String(), "\n"); n != 4 {
		t.Fatalf("%d lines, want 4 (3 and one summary)", n)
	}
}

func TestReason(t *testing.T) {
	cases := []struct {
		err  error
		want string
	}{
		{fmt.Errorf("x: %w", messages.ErrDecode), ReasonDecode},
		{fmt.Errorf("x: %w", messages.ErrVersion), ReasonVersion},
		{fmt.Errorf("x: %w", messages.ErrTooLarge), ReasonTooLarge},
		{fmt.Errorf("x: %w", messages.ErrKind), ReasonKind},
		{fmt.Errorf("x: %w", messages.ErrInvalid), ReasonInvalid},
		{fmt.Errorf("other"), ReasonInvalid},
	}
	for _, c := range cases {
		if got := Reason(c.err); got != c.want {
			t.Errorf("Reason(%v) = %q, want %q", c.err, got, c.want)
		}
	}
	if _, err := New(Options{Component: "a.b"}); err == nil {
		t.Error("component with a dot accepted")
	}
}

var sink int

// BenchmarkRecover measures what a handler pays for the deferred recovery
// when nothing panics, against the same handler without it.
func BenchmarkRecover(b *testing.B) {
	g, err := New(Options{Component: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	work := func(i int) { sink += i }
	b.Run("without", func(b *testing.B) {
		for i := range b.N {
			func() { work(i) }()
		}
	})
	b.Run("with", func(b *testing.B) {
		for i := range b.N {
			func() {
				defer g.Recover("bench", "sy.signal.m.e", func() { sink-- })
				work(i)
			}()
		}
	})
}
