// Command switchyard is the one binary of Switchyard, a global load balancer
// for LLM inference: `switchyard up` runs the whole stack on one machine, and
// each service also runs on its own (see `switchyard --help`).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
