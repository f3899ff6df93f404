package main

import (
	"flag"

	"github.com/switchyard-dev/switchyard/auth/endpoints"
	"github.com/switchyard-dev/switchyard/streams"
)

// endpointFlags are the flags of the engine endpoint policy
// (auth/endpoints): a policy file and ranges or host patterns for every
// model.
type endpointFlags struct {
	file         *string
	cidrs, hosts []string
}

func addEndpointFlags(fs *flag.FlagSet) *endpointFlags {
	ef := &endpointFlags{file: fs.String("engine-endpoints", "", "engine endpoint policy `file` (docs/security.md, \"Engine endpoints\"): the URLs and subjects engines may advertise, per model; a signal advertising another is ignored and counted")}
	fs.Func("allow-engine-cidr", "engines of every model may advertise URLs in this address range `CIDR` (repeat for several; a host name must resolve into the ranges)", func(s string) error {
		ef.cidrs = append(ef.cidrs, s)
		return nil
	})
	fs.Func("allow-engine-host", "engines of every model may advertise URLs whose host matches `PATTERN` (a name, or *.domain; repeat for several)", func(s string) error {
		ef.hosts = append(ef.hosts, s)
		return nil
	})
	return ef
}

// rules returns the policy the flags give, nil when none was given.
func (ef *endpointFlags) rules() (*endpoints.File, error) {
	var f endpoints.File
	if *ef.file != "" {
		var err error
		if f, err = endpoints.LoadFile(*ef.file); err != nil {
			return nil, usagef("--engine-endpoints: %v", err)
		}
	} else if len(ef.cidrs) == 0 && len(ef.hosts) == 0 {
		return nil, nil
	}
	if len(ef.cidrs) > 0 || len(ef.hosts) > 0 {
		f.Models = append(f.Models, endpoints.Rules{Model: endpoints.AnyModel, CIDRs: ef.cidrs, Hosts: ef.hosts})
	}
	if _, err := endpoints.New(f, endpoints.Options{}); err != nil {
		return nil, usagef("engine endpoint policy (--engine-endpoints, --allow-engine-cidr, --allow-engine-host): %v", err)
	}
	return &f, nil
}

// policy compiles the flags' policy for layout n; nil when none was given.
func (ef *endpointFlags) policy(n streams.Names) (*endpoints.Policy, error) {
	f, err := ef.rules()
	if f == nil || err != nil {
		return nil, err
	}
	if n.Prefix == "" {
		n = streams.DefaultNames()
	}
	return endpoints.New(*f, endpoints.Options{OwnSubject: func(model, engine string) string {
		subj, _ := n.InferSubject(model, engine)
		return subj
	}})
}
