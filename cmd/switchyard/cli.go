package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/switchyard-dev/switchyard/streams"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
	"go.yaml.in/yaml/v3"

	"github.com/switchyard-dev/switchyard/internal/logthrottle"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// env carries the process's standard streams to a command.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	// printOnly is --print-config: a command that runs a component prints
	// its effective configuration (see printConfig) and starts nothing.
	printOnly bool
	// flags are the command's parsed flags.
	flags *flag.FlagSet
	// atExit runs, last added first, when the command returns.
	atExit []func()
}

// printConfig writes the command's effective configuration to stdout: the
// sections (each component's options after defaults and validation), then
// "flags", every flag's value after the command line, the environment and
// the config file.
func (e *env) printConfig(sections ...section) error {
	var flags object
	e.flags.VisitAll(func(f *flag.Flag) {
		v := redactURL(f.Value.String())
		if secret(flagField(f.Name)) && v != "" {
			v = redacted
		}
		flags = append(flags, member{f.Name, v})
	})
	return printConfig(e.stdout, append(sections, section{"flags", flags})...)
}

// flagField turns a flag name into a Go-style name ("nats-token" is
// NatsToken), for the secret check.
func flagField(name string) string {
	var b strings.Builder
	for _, w := range strings.FieldsFunc(name, func(r rune) bool { return r == '-' || r == '.' || r == '_' }) {
		b.WriteString(strings.ToUpper(w[:1]) + w[1:])
	}
	return b.String()
}

// command is one subcommand: its flags are defined by setup, and run executes it.
type command struct {
	name    string
	summary string
	usage   string
	// setup defines the command's flags and returns the function that runs it
	// once flags are parsed; args are the remaining positional arguments.
	setup func(fs *flag.FlagSet, e *env) func(ctx context.Context, args []string) error
	// printsConfig gives the command --print-config: it runs a component,
	// and its run function honours env.printOnly.
	printsConfig bool
}

func commands() []command {
	return []command{
		upCommand(),
		natsCommand(),
		authCommand(),
		aggregatorCommand(),
		optimizeCommand(),
		optimizerCommand(),
		routerCommand(),
		engineCommand(),
		engineSimCommand(),
		agentCommand(),
		decodeCommand(),
		encodeCommand(),
		loadCommand(),
		simCommand(),
		versionCommand(),
	}
}

// usageError is returned by a command for bad input; it exits with status 2.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := &env{stdin: stdin, stdout: stdout, stderr: stderr}
	cmds := commands()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		printHelp(stdout, cmds)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	if args[0] == "--version" {
		args[0] = "version"
	}
	for _, c := range cmds {
		if c.name != args[0] {
			continue
		}
		fs := flag.NewFlagSet("switchyard "+c.name, flag.ContinueOnError)
		fs.SetOutput(stderr)
		configFile := fs.String("config", "", "read flag values from this YAML or JSON `file` (keys are flag names)")
		if c.printsConfig {
			fs.BoolVar(&e.printOnly, "print-config", false, "print the effective configuration (every component's options after defaults and validation, then every flag) as JSON and exit without starting anything")
		}
		e.flags = fs
		runFn := c.setup(fs, e)
		fs.Usage = func() {
			fmt.Fprintf(stderr, "Usage: switchyard %s %s\n\n%s\n\nFlags (each also read from SWITCHYARD_<FLAG> in the environment, e.g. SWITCHYARD_NATS_URL):\n", c.name, c.usage, c.summary)
			fs.PrintDefaults()
		}
		if err := fs.Parse(args[1:]); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return exitOK
			}
			return exitUsage
		}
		if err := applyEnvAndConfig(fs, *configFile); err != nil {
			fmt.Fprintf(stderr, "switchyard %s: %v\n", c.name, err)
			return exitUsage
		}
		err := runFn(ctx, fs.Args())
		for i := len(e.atExit) - 1; i >= 0; i-- {
			e.atExit[i]()
		}
		if err != nil {
			fmt.Fprintf(stderr, "switchyard %s: %v\n", c.name, err)
			var ue usageError
			if errors.As(err, &ue) {
				return exitUsage
			}
			return exitError
		}
		return exitOK
	}
	fmt.Fprintf(stderr, "switchyard: unknown command %q\n\n", args[0])
	printHelp(stderr, cmds)
	return exitUsage
}

func printHelp(w io.Writer, cmds []command) {
	fmt.Fprintf(w, "switchyard — a global load balancer for LLM inference\n\nUsage: switchyard <command> [flags]\n\nCommands:\n")
	for _, c := range cmds {
		fmt.Fprintf(w, "  %-12s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun 'switchyard <command> --help' for a command's flags.\n")
}

// envName is the environment variable for a flag: SWITCHYARD_ + upper case,
// dashes and dots as underscores.
func envName(flagName string) string {
	return "SWITCHYARD_" + strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(flagName))
}

// applyEnvAndConfig fills flags not given on the command line, first from the
// environment, then from the config file. Precedence: flag, env, file, default.
func applyEnvAndConfig(fs *flag.FlagSet, configFile string) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var cfg map[string]any
	if configFile != "" {
		data, err := os.ReadFile(configFile)
		if err != nil {
			return fmt.Errorf("config file: %w", err)
		}
		if err := yaml.Unmarshal(data, &cfg); err != nil {
			return fmt.Errorf("config file %s: %w", configFile, err)
		}
		var unknown []string
		for k := range cfg {
			if fs.Lookup(k) == nil {
				unknown = append(unknown, k)
			}
		}
		if len(unknown) > 0 {
			sort.Strings(unknown)
			return fmt.Errorf("config file %s: unknown keys %s for this command", configFile, strings.Join(unknown, ", "))
		}
	}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || set[f.Name] || f.Name == "config" {
			return
		}
		if f.Name == "print-config" {
			return // a one-off question, never a setting kept in the environment or a file
		}
		if v, ok := os.LookupEnv(envName(f.Name)); ok {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("environment %s=%q: %v", envName(f.Name), v, e)
			}
			return
		}
		if v, ok := cfg[f.Name]; ok {
			s := fmt.Sprint(v)
			if list, isList := v.([]any); isList {
				parts := make([]string, len(list))
				for i, p := range list {
					parts[i] = fmt.Sprint(p)
				}
				s = strings.Join(parts, ",")
			}
			if e := f.Value.Set(s); e != nil {
				err = fmt.Errorf("config file %s: %s=%q: %v", configFile, f.Name, s, e)
			}
		}
	})
	return err
}

// Log formats of --log-format.
const (
	logAuto    = "auto"
	logConsole = "console"
	logJSON    = "json"
)

// logFlags adds --log-level and --log-format and returns a function building
// the logger. Lines at info and above are aggregated per source
// (logthrottle.Writer), so a warning repeated per request becomes a line and
// a count every 10 s; the summaries still pending are written when the
// command returns.
func logFlags(fs *flag.FlagSet, e *env) func() (zerolog.Logger, error) {
	level := fs.String("log-level", "info", "log level: trace, debug, info, warn, error")
	format := fs.String("log-format", logAuto, "log format: auto (console on a terminal, else json), console (for people) or json")
	return func() (zerolog.Logger, error) {
		lvl, err := zerolog.ParseLevel(*level)
		if err != nil {
			return zerolog.Nop(), usagef("--log-level %q: %v", *level, err)
		}
		terminal := isTerminal(e.stderr)
		f, err := resolveLogFormat(*format, terminal)
		if err != nil {
			return zerolog.Nop(), err
		}
		var w io.Writer = e.stderr
		if f == logConsole {
			// Colour only on a terminal: escape codes in a file or `docker logs` are noise.
			w = zerolog.ConsoleWriter{Out: e.stderr, TimeFormat: time.TimeOnly, NoColor: !terminal || os.Getenv("NO_COLOR") != ""}
		}
		tw := logthrottle.NewWriter(w, logthrottle.WriterOptions{})
		e.atExit = append(e.atExit, func() { _ = tw.Close() })
		return zerolog.New(tw).Level(lvl).With().Timestamp().Logger(), nil
	}
}

// resolveLogFormat returns the format --log-format names: auto is console
// on a terminal and JSON otherwise (a log file, a pipe, `docker logs`).
func resolveLogFormat(format string, terminal bool) (string, error) {
	switch format {
	case logAuto:
		if terminal {
			return logConsole, nil
		}
		return logJSON, nil
	case logConsole, logJSON:
		return format, nil
	}
	return "", usagef("--log-format %q: want auto, console or json", format)
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

// natsConn is the NATS connection flags every component shares: the
// servers, the identity's credentials and the TLS files.
type natsConn struct {
	url, creds, ca, cert, key *string
}

// natsFlags adds the NATS connection flags shared by the components.
func natsFlags(fs *flag.FlagSet) natsConn {
	return natsFlagsURL(fs, "nats://127.0.0.1:4222", "NATS server `URLs`, comma-separated (several for a cluster)")
}

// natsFlagsURL is natsFlags with --nats-url's default and usage.
func natsFlagsURL(fs *flag.FlagSet, url, usage string) natsConn {
	return natsConn{
		url:   fs.String("nats-url", url, usage),
		creds: fs.String("creds", "", "NATS credentials `file` of this component's identity (switchyard auth writes them; up's are in <data-dir>/auth)"),
		ca:    fs.String("tls-ca", "", "CA certificate `file` the NATS servers' certificates are checked against (requires TLS)"),
		cert:  fs.String("tls-cert", "", "client certificate `file` for servers that require mutual TLS (with --tls-key)"),
		key:   fs.String("tls-key", "", "client key `file` for --tls-cert"),
	}
}

// options returns the connection options of the flags for a connection named name.
func (n natsConn) options(name string, log zerolog.Logger) streams.ConnectOptions {
	return streams.ConnectOptions{URLs: []string{*n.url}, Name: name, Logger: log,
		Creds: *n.creds, TLSCA: *n.ca, TLSCert: *n.cert, TLSKey: *n.key}
}

// withWait returns o connecting in the background until a server answers.
func withWait(o streams.ConnectOptions) streams.ConnectOptions {
	o.WaitForServer = true
	return o
}
