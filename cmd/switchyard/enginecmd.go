package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	neturl "net/url"
	"os"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/internal/enginestate"
	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/services/enginesim"
	"github.com/switchyard-dev/switchyard/stack"
	"github.com/switchyard-dev/switchyard/streams"
)

// engineCommand is `switchyard engine`: operator overrides (drain, cordon,
// health, restore), the engine list, and failure injection into simulated
// engines.
func engineCommand() command {
	return command{
		name:    "engine",
		summary: "operate on engines: drain, cordon, health, restore, list, inject (simulator failures)",
		usage: `drain|cordon|restore NAME [--model M] [--reason TEXT]
       switchyard engine health NAME --health X [--model M] [--reason TEXT]
       switchyard engine list [--model M]
       switchyard engine inject NAME (--error-rate P | --hang | --slow K | --crash | --capacity-factor F | --clear) [--admin URL]

drain and cordon write an operator record (sy_engines key operator.NAME) that
the optimizer obeys: the engine gets weight 0 in the next snapshots, requests
in flight finish. health pins the engine's health multiplier (0..1) in place
of any penalty. restore removes the record. Routers obey through the
snapshots; a router routing by its local policy (no snapshot, or a stale one)
does not see operator records. inject sends a failure injection to a running
engine simulator over NATS (subject <prefix>.ctl.engine.NAME), or with
--admin to its admin listener (enginesim --admin-listen; injection is on no
inference port).`,
		setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			url := natsFlags(fs)
			model := fs.String("model", "", "limit to this model (default: every model)")
			var health optionalFloat
			fs.Var(&health, "health", "health multiplier to pin, 0..1 (engine health)")
			reason := fs.String("reason", "", "why, recorded with the override")
			errRate := fs.Float64("error-rate", 0, "inject: answer this fraction of requests with 500, 0..1")
			hang := fs.Bool("hang", false, "inject: accept requests and never answer")
			slow := fs.Float64("slow", 0, "inject: multiply TTFT by this factor (>= 1)")
			crash := fs.Bool("crash", false, "inject: crash the engine (listener and subscription gone)")
			capFactor := fs.Float64("capacity-factor", 0, "inject: scale the engine's speed and capacity (0 < f <= 10)")
			clearAll := fs.Bool("clear", false, "inject: clear every injected failure")
			adminURL := fs.String("admin", "", "inject: POST to this engine simulator's admin `URL` (its --admin-listen, e.g. http://127.0.0.1:9000) instead of over NATS")
			timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for NATS")
			return func(ctx context.Context, args []string) error {
				if len(args) == 0 {
					return usagef("want an action: drain, cordon, health, restore, list or inject")
				}
				action, rest := args[0], args[1:]
				name := ""
				if action != "list" {
					if len(rest) == 0 || strings.HasPrefix(rest[0], "-") {
						return usagef("%s: want an engine NAME", action)
					}
					name, rest = rest[0], rest[1:]
					if err := messages.CheckName("engine", name); err != nil {
						return usageError{err}
					}
				}
				if err := fs.Parse(rest); err != nil { // flags after the name
					return usageError{err}
				}
				if fs.NArg() > 0 {
					return usagef("unexpected arguments %q", fs.Args())
				}
				if *model != "" {
					if err := messages.CheckModelName(*model); err != nil {
						return usageError{err}
					}
				}
				ctx, cancel := context.WithTimeout(ctx, *timeout)
				defer cancel()
				if *adminURL != "" {
					if action != "inject" {
						return usagef("--admin is inject's: %s goes through NATS", action)
					}
					body, err := injection(fs, *errRate, *hang, *slow, *crash, *capFactor, *clearAll)
					if err != nil {
						return err
					}
					return injectHTTP(ctx, *adminURL, name, body, e)
				}
				co := url.options("switchyard-engine", zerolog.Nop())
				if co.Creds == "" {
					// The operator of `switchyard up` on this machine: its admin identity.
					if p := filepath.Join(defaultDataDir("up"), "auth", stack.AdminIdentity+".creds"); fileExists(p) {
						co.Creds = p
					}
				}
				nc, err := streams.Connect(ctx, co)
				if err != nil {
					return err
				}
				defer nc.Close()
				names := streams.DefaultNames()
				switch action {
				case "inject":
					body, err := injection(fs, *errRate, *hang, *slow, *crash, *capFactor, *clearAll)
					if err != nil {
						return err
					}
					return inject(ctx, nc, names, name, body, e)
				case "drain", "cordon", "health", "restore", "list":
				default:
					return usagef("unknown action %q: want drain, cordon, health, restore, list or inject", action)
				}
				js, err := jetstream.New(nc)
				if err != nil {
					return err
				}
				kv, err := js.KeyValue(ctx, names.EnginesBucket)
				if err != nil {
					return fmt.Errorf("open bucket %s: %w", names.EnginesBucket, err)
				}
				if action == "list" {
					return listEngines(ctx, kv, *model, e)
				}
				key, _ := streams.OperatorKey(name)
				if action == "restore" {
					if err := kv.Delete(ctx, key); err != nil {
						return fmt.Errorf("restore %s: %w", name, err)
					}
					fmt.Fprintf(e.stdout, "engine %s restored: operator override removed\n", name)
					return nil
				}
				op := &messages.Operator{Engine: name, Model: *model, Action: action, Reason: *reason, By: whoAmI(), Time: time.Now().UnixMilli()}
				switch {
				case action == "health" && !health.set:
					return usagef("health: want --health X (0..1)")
				case action == "health":
					op.Health = health.v
				case health.set:
					return usagef("--health goes with the health action, not %s", action)
				}
				data, err := messages.Encode(op)
				if err != nil {
					return usageError{err}
				}
				if _, err := kv.Put(ctx, key, data); err != nil {
					return fmt.Errorf("%s %s: %w", action, name, err)
				}
				scope := "every model"
				if *model != "" {
					scope = "model " + *model
				}
				fmt.Fprintf(e.stdout, "engine %s: %s (%s) recorded under %s/%s; the optimizer applies it in its next round\n",
					name, action, scope, names.EnginesBucket, key)
				return nil
			}
		},
	}
}

// optionalFloat is a float flag that knows whether it was given (on the
// command line, in the environment or in a config file), so that no value
// has to stand for "not given".
type optionalFloat struct {
	v   float64
	set bool
}

func (f *optionalFloat) String() string {
	if f == nil || !f.set {
		return ""
	}
	return strconv.FormatFloat(f.v, 'g', -1, 64)
}

func (f *optionalFloat) Set(s string) error {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return err
	}
	f.v, f.set = v, true
	return nil
}

// whoAmI names the person running the command, as user@host.
func whoAmI() string {
	who := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		who = u.Username
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		who += "@" + h
	}
	return who
}

// injection builds the JSON body of a failure injection from the flags given.
func injection(fs *flag.FlagSet, errRate float64, hang bool, slow float64, crash bool, capFactor float64, clearAll bool) ([]byte, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	body := map[string]any{}
	if clearAll {
		for _, k := range []string{"error_rate", "added_latency_ms", "capacity_factor", "ttft_factor", "crash_after"} {
			body[k] = 0
		}
		for _, k := range []string{"hang", "crashed", "silent"} {
			body[k] = false
		}
	}
	if set["error-rate"] {
		if !(errRate >= 0 && errRate <= 1) {
			return nil, usagef("--error-rate %v: want 0..1", errRate)
		}
		body["error_rate"] = errRate
	}
	if set["hang"] {
		body["hang"] = hang
	}
	if set["slow"] {
		if !(slow >= 1) || math.IsInf(slow, 0) {
			return nil, usagef("--slow %v: want a factor >= 1", slow)
		}
		body["ttft_factor"] = slow
	}
	if set["crash"] {
		body["crashed"] = crash
	}
	if set["capacity-factor"] {
		body["capacity_factor"] = capFactor
	}
	if len(body) == 0 {
		return nil, usagef("inject: want --error-rate, --hang, --slow, --crash, --capacity-factor or --clear")
	}
	return json.Marshal(body)
}

// inject sends a failure injection to a simulated engine and prints its reply.
func inject(ctx context.Context, nc *nats.Conn, names streams.Names, name string, body []byte, e *env) error {
	subj, err := enginesim.ControlSubject(names, name)
	if err != nil {
		return usageError{err}
	}
	m, err := nc.RequestWithContext(ctx, subj, body)
	if err != nil {
		return fmt.Errorf("inject into %s (is an engine simulator of that name running?): %w", name, err)
	}
	if st := m.Header.Get(messages.HeaderStatus); st != "200" {
		return fmt.Errorf("engine %s refused the injection (status %s): %s", name, st, m.Data)
	}
	fmt.Fprintf(e.stdout, "engine %s failure injection now: %s\n", name, m.Data)
	return nil
}

// injectHTTP posts a failure injection to a simulated engine's admin
// listener and prints its reply.
func injectHTTP(ctx context.Context, adminURL, name string, body []byte, e *env) error {
	u, err := neturl.Parse(adminURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usagef("--admin %q is not a URL like http://127.0.0.1:9000", adminURL)
	}
	url := strings.TrimSuffix(adminURL, "/") + "/admin/failure"
	// Ask whose listener it is first: an injection sent to the wrong
	// engine would already be in force when its answer said so.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return usageError{err}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("inject into %s at %s: %w", name, adminURL, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if got := resp.Header.Get(messages.NATSHeaderEngine); got != name {
		return fmt.Errorf("%s is the admin listener of engine %q, not of %s", adminURL, got, name)
	}
	req, err = http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return usageError{err}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("inject into %s at %s: %w", name, adminURL, err)
	}
	defer resp.Body.Close()
	reply, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("engine %s refused the injection (status %d): %s", name, resp.StatusCode, bytes.TrimSpace(reply))
	}
	fmt.Fprintf(e.stdout, "engine %s failure injection now: %s\n", name, bytes.TrimSpace(reply))
	return nil
}

// maxSkippedKeys bounds the keys of skipped values that engine list names.
const maxSkippedKeys = 5

// listEngines prints every engine with its state (enginestate.Of, as the
// dashboard shows it), its windowed error rate, and its penalty and
// operator record. Values that do not decode, or are stored under a key other than
// their names', are skipped and counted on stderr, naming the first few.
func listEngines(ctx context.Context, kv jetstream.KeyValue, model string, e *env) error {
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	states := map[string]*messages.EngineState{}
	pens := map[string]*messages.Penalty{}
	ops := map[string]*messages.Operator{}
	now := time.Now()
	skipped := 0
	var skippedKeys []string
	skip := func(key string) {
		skipped++
		if len(skippedKeys) < maxSkippedKeys {
			skippedKeys = append(skippedKeys, key)
		}
	}
	for ent := range w.Updates() {
		if ent == nil {
			break
		}
		m, err := messages.DecodeAt(ent.Value(), now.Add(time.Hour))
		if err != nil {
			skip(ent.Key())
			continue
		}
		switch v := m.(type) {
		case *messages.EngineState:
			k := streams.JoinKey(v.Model, v.Engine)
			if ent.Key() != k {
				skip(ent.Key())
				continue
			}
			states[k] = v
		case *messages.Penalty:
			pens[streams.JoinKey(v.Model, v.Engine)] = v
		case *messages.Operator:
			ops[v.Engine] = v
		default:
			skip(ent.Key())
		}
	}
	if skipped > 0 {
		more := ""
		if skipped > len(skippedKeys) {
			more = ", ..."
		}
		fmt.Fprintf(e.stderr, "engine list: skipped %d values of %s that are not valid engine records (%s%s); switchyard decode shows why\n",
			skipped, kv.Bucket(), strings.Join(skippedKeys, ", "), more)
	}
	keys := make([]string, 0, len(states))
	for k, st := range states {
		if model == "" || st.Model == model {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tENGINE\tSTATE\tHEALTH\tCAPACITY\tERRORS\tPENALTY\tOPERATOR\tWHY")
	for _, k := range keys {
		st := states[k]
		op := ops[st.Engine]
		if op != nil && op.Model != "" && op.Model != st.Model {
			op = nil
		}
		v := enginestate.Of(enginestate.Input{State: st, Penalty: pens[k], Operator: op, Now: now})
		errs := "-"
		if st.Outcomes != nil {
			errs = fmt.Sprintf("%.1f%%", 100*v.ErrorRate)
		}
		pen := "-"
		if p := pens[k]; p != nil {
			switch p.Phase {
			case messages.PhasePenalised:
				pen = fmt.Sprintf("%s ×%.2f until %s (%s, strike %d)", p.Phase, p.Multiplier,
					time.UnixMilli(p.Until).Format(time.TimeOnly), p.Reason, p.Strikes)
			case messages.PhaseRecovering:
				pen = fmt.Sprintf("slow start until %s (%s)", time.UnixMilli(p.RecoverUntil).Format(time.TimeOnly), p.Reason)
			default:
				pen = fmt.Sprintf("recovered (strikes %d)", p.Strikes)
			}
		}
		opText := "-"
		if op != nil {
			opText = op.Action
			if op.Action == messages.ActionHealth {
				opText = fmt.Sprintf("health ×%.2f", op.Health)
			}
			if op.Reason != "" {
				opText += " (" + op.Reason + ")"
			}
		}
		why := v.Detail
		if why == "" {
			why = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\t%.1f\t%s\t%s\t%s\t%s\n", st.Model, st.Engine, v.State, st.Health, st.CapacityRPS, errs, pen, opText, why)
	}
	return tw.Flush()
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
