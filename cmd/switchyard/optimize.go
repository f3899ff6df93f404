package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/switchyard-dev/switchyard/optimizer"
)

func optimizeCommand() command {
	return command{
		name:    "optimize",
		summary: "solve one routing problem from a YAML or JSON file and print the weights",
		usage:   "-f FILE [--policy NAME] [-o table|json]",
		setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			file := fs.String("f", "", "problem `file` (YAML or JSON; see docs/optimizer.md)")
			policy := fs.String("policy", "optimal", "policy: "+strings.Join(optimizer.PolicyNames(), ", "))
			output := fs.String("o", "table", "output: table or json")
			budget := fs.Duration("time-budget", optimizer.DefaultTimeBudget, "stop the solve after this long with the best feasible point and the gap it certified (0: no limit)")
			return func(_ context.Context, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected arguments %q", args)
				}
				if *file == "" {
					return usagef("-f FILE is required, e.g. switchyard optimize -f examples/case-study.yaml")
				}
				if *output != "table" && *output != "json" {
					return usagef("-o %q: want table or json", *output)
				}
				data, err := os.ReadFile(*file)
				if err != nil {
					return usageError{err}
				}
				p, err := optimizer.ParseProblem(*file, data)
				if err != nil {
					return usageError{err}
				}
				if *budget < 0 {
					return usagef("--time-budget %s: want a duration >= 0 (0: no limit)", *budget)
				}
				opts := optimizer.DefaultOptions()
				opts.TimeBudget = *budget
				if *budget == 0 {
					opts.TimeBudget = -1 // the solver's 0 means its default
				}
				pol, err := optimizer.PolicyByName(*policy, opts)
				if err != nil {
					return usageError{err}
				}
				sol, err := pol.Solve(p, nil)
				if err != nil {
					var fe *optimizer.FieldError
					if errors.As(err, &fe) {
						return usageError{fmt.Errorf("%s: %w", *file, err)}
					}
					return err
				}
				if *output == "json" {
					out, err := sol.JSON()
					if err != nil {
						return err
					}
					_, err = fmt.Fprintf(e.stdout, "%s\n", out)
					return err
				}
				return optimizer.WriteTable(e.stdout, sol)
			}
		},
	}
}
