package main

import (
	"context"
	"flag"
	"fmt"
	"runtime/debug"
)

func versionCommand() command {
	return command{
		name:    "version",
		summary: "print the version of this binary",
		setup: func(_ *flag.FlagSet, e *env) func(context.Context, []string) error {
			return func(context.Context, []string) error {
				_, err := fmt.Fprintln(e.stdout, versionString())
				return err
			}
		},
	}
}

func versionString() string {
	v, rev, dirty := "(devel)", "", ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					dirty = "-dirty"
				}
			}
		}
		if rev != "" {
			if len(rev) > 12 {
				rev = rev[:12]
			}
			return fmt.Sprintf("switchyard %s (%s%s, %s)", v, rev, dirty, bi.GoVersion)
		}
		return fmt.Sprintf("switchyard %s (%s)", v, bi.GoVersion)
	}
	return "switchyard " + v
}
