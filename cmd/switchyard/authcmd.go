package main

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/switchyard-dev/switchyard/auth"
	"github.com/switchyard-dev/switchyard/stack"
)

func authCommand() command {
	return command{
		name:    "auth",
		summary: "create the NATS identities (<identity>.creds), account and TLS material of a stack file or a cluster",
		usage:   "--dir DIR [--stack FILE | --engines a,b --clusters A,B] [--hosts nats1,nats2]",
		setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			dir := fs.String("dir", "", "`directory` to write the material to (keys and the CA there are reused)")
			stackFile := fs.String("stack", "", "stack `file` whose engines and clusters get identities")
			model := fs.String("model", "", "restrict engine identities to this model's subjects (default: the stack file's; empty: any)")
			engines := fs.String("engines", "", "engine `names`, comma-separated, one identity each")
			clusters := fs.String("clusters", "", "frontend cluster `names`, comma-separated: one router-<cluster> identity each")
			agents := fs.String("agents", "", "agent identities, `name=engine+engine,...`: each may speak for the engines listed")
			hosts := fs.String("hosts", "", "extra `names` and addresses of the NATS servers for their certificate, comma-separated")
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected arguments %q", args)
				}
				if *dir == "" {
					return usagef("want --dir")
				}
				var ids []auth.Identity
				if *stackFile != "" {
					f, err := stack.Load(*stackFile)
					if err != nil {
						return usageError{err}
					}
					ids = stack.Identities(f)
				} else {
					ids = stack.Identities(&stack.File{})
				}
				for _, n := range splitList(*engines) {
					ids = append(ids, auth.Identity{Name: n, Role: auth.RoleEngine, Model: *model})
				}
				for _, c := range splitList(*clusters) {
					ids = append(ids, auth.Identity{Name: stack.RouterIdentity(c), Role: auth.RoleRouter, Cluster: c})
				}
				for _, a := range splitList(*agents) {
					name, list, ok := strings.Cut(a, "=")
					if !ok {
						return usagef("--agents %q: want name=engine+engine", a)
					}
					ids = append(ids, auth.Identity{Name: name, Role: auth.RoleAgent, Model: *model, Engines: strings.Split(list, "+")})
				}
				ids = append(ids, auth.Identity{Name: "leaf", Role: auth.RoleLeaf})
				m, err := auth.Generate(auth.Options{Dir: *dir, Identities: ids, Hosts: splitList(*hosts)})
				if err != nil {
					return usageError{err}
				}
				fmt.Fprintf(e.stdout, "wrote to %s:\n", m.Dir)
				for _, id := range ids {
					fmt.Fprintf(e.stdout, "  %-24s %s\n", id.Name+".creds", id.Role)
				}
				fmt.Fprintf(e.stdout, "  %-24s operator, account and system account (%s, %s)\n", auth.OperatorFile, auth.AccountFile, auth.SystemFile)
				fmt.Fprintf(e.stdout, "  %-24s a nats-server configuration with the operator and a memory resolver\n", auth.ServerConfFile)
				fmt.Fprintf(e.stdout, "  %-24s the CA; server and client certificates beside it\n", auth.CAFile)
				return nil
			}
		},
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
