package main

import (
	"context"
	"net/http"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/dashboard"
	"github.com/switchyard-dev/switchyard/streams"
)

// connectService connects a service to NATS and, when replicas > 0,
// provisions the layout with opts (its Replicas set to replicas) first.
func connectService(ctx context.Context, conn natsConn, name string, log zerolog.Logger, replicas int, opts streams.ProvisionOptions) (*nats.Conn, error) {
	nc, err := streams.Connect(ctx, conn.options(name, log))
	if err != nil {
		return nil, err
	}
	if replicas > 0 {
		js, err := jetstream.New(nc)
		if err == nil {
			opts.Replicas = replicas
			err = streams.Provision(ctx, js, streams.DefaultNames(), opts)
		}
		if err != nil {
			nc.Close()
			return nil, err
		}
	}
	return nc, nil
}

// startDashboard runs the live dashboard on nc until the returned stop
// function is called, and returns its handler.
func startDashboard(ctx context.Context, opts dashboard.Options) (http.Handler, func(), error) {
	dash, err := dashboard.New(opts)
	if err != nil {
		return nil, nil, err
	}
	dctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = dash.Run(dctx) }()
	return dash.Handler(), func() { cancel(); <-done }, nil
}
