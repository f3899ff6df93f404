// Package auth creates the identities of a Switchyard deployment on NATS and
// the permissions of their roles: an operator, one account with JetStream,
// the system account, one user per identity (a JWT signed with nkeys,
// written as <dir>/<identity>.creds), and a local certificate authority
// with server and client certificates for TLS. `switchyard auth` and
// `switchyard up` write this material; natsembed serves it (operator mode
// with a memory resolver) and streams.Connect presents it.
//
// Every role may publish, read and reply only where its part of DESIGN.md's
// layout needs: an engine publishes its own signal and KV subjects and
// serves its own inference and control subjects; a router serves its
// cluster's request subjects in its cluster's queue group, publishes
// reports under its own name and reads state; the aggregator writes engine
// state and demand; the optimizer alone writes weights, leases and
// penalties; admin may do anything; the read-only operator inspects
// streams and buckets but reads no request traffic. Each identity reads
// replies only under its own inbox prefix (streams.InboxPrefix).
package auth

import (
	"errors"
	"fmt"
	"slices"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/streams"
)

// Role is what an identity is allowed to do on the bus.
type Role string

// The roles.
const (
	// RoleEngine publishes the signals and KV events of its engines and
	// serves their inference and control subjects.
	RoleEngine Role = "engine"
	// RoleAgent is RoleEngine for the engines an agent serves.
	RoleAgent Role = "agent"
	// RoleRouter serves its cluster's request subjects, requests engines,
	// publishes its reports and reads engine state, demand, weights and KV events.
	RoleRouter Role = "router"
	// RoleAggregator consumes signals and reports and writes engine state and demand.
	RoleAggregator Role = "aggregator"
	// RoleOptimizer reads the state and is the only writer of weights,
	// leases and penalty records.
	RoleOptimizer Role = "optimizer"
	// RoleAdmin may publish and subscribe anything: operators' commands
	// (engine drain, inject), provisioning, the nats CLI.
	RoleAdmin Role = "admin"
	// RoleReader inspects streams, buckets, signals and reports, reads no
	// request or inference traffic and writes nothing.
	RoleReader Role = "reader"
	// RoleLeaf is the identity a leaf-node server presents to its hub:
	// its own clients are checked by the leaf server itself.
	RoleLeaf Role = "leaf"
)

// Roles lists every role.
var Roles = []Role{RoleEngine, RoleAgent, RoleRouter, RoleAggregator, RoleOptimizer, RoleAdmin, RoleReader, RoleLeaf}

// ErrIdentity is wrapped by every error of Identity.Validate.
var ErrIdentity = errors.New("auth: invalid identity")

// Identity is one user on the bus.
type Identity struct {
	// Name names the user, its credentials file (<Name>.creds) and its
	// inbox prefix; a NATS name token.
	Name string
	// Role is what it may do.
	Role Role
	// Model restricts an engine or agent to one model's subjects; empty
	// means any model.
	Model string
	// Engines are the engines an engine or agent identity speaks for; an
	// engine's defaults to its Name.
	Engines []string
	// Cluster is a router's frontend cluster.
	Cluster string
	// Router is the router name a router reports under; empty means any
	// router of its cluster.
	Router string
}

// Validate reports the first field of id that is not usable; the error
// wraps ErrIdentity.
func (id Identity) Validate() error {
	if !messages.ValidName(id.Name) {
		return fmt.Errorf("%w: Name %q is not a name token (1-%d characters of A-Z a-z 0-9 _ -)", ErrIdentity, id.Name, messages.MaxNameLen)
	}
	if !slices.Contains(Roles, id.Role) {
		return fmt.Errorf("%w: %s: Role %q, want one of %v", ErrIdentity, id.Name, id.Role, Roles)
	}
	if id.Model != "" && !messages.ValidModelName(id.Model) {
		return fmt.Errorf("%w: %s: Model %q is not a model id", ErrIdentity, id.Name, id.Model)
	}
	for _, e := range id.engines() {
		if !messages.ValidName(e) {
			return fmt.Errorf("%w: %s: engine %q is not a name token", ErrIdentity, id.Name, e)
		}
	}
	switch id.Role {
	case RoleAgent:
		if len(id.Engines) == 0 {
			return fmt.Errorf("%w: %s: an agent wants the Engines it serves", ErrIdentity, id.Name)
		}
	case RoleRouter:
		if !messages.ValidName(id.Cluster) {
			return fmt.Errorf("%w: %s: Cluster %q is not a name token", ErrIdentity, id.Name, id.Cluster)
		}
		if id.Router != "" && !messages.ValidName(id.Router) {
			return fmt.Errorf("%w: %s: Router %q is not a name token", ErrIdentity, id.Name, id.Router)
		}
	}
	return nil
}

func (id Identity) engines() []string {
	if id.Role == RoleEngine && len(id.Engines) == 0 {
		return []string{id.Name}
	}
	return id.Engines
}

// Permissions is what a user may publish and subscribe to. Deny entries
// win over allow entries; a subscription entry "subject queue" allows only
// queue subscriptions in that queue group.
type Permissions struct {
	PubAllow, PubDeny, SubAllow, SubDeny []string
	// Responses lets the user publish one stream of replies to the reply
	// subject of each request it received.
	Responses bool
}

// jsAPI is the JetStream API prefix.
const jsAPI = "$JS.API."

// readStream is what reading stream s needs: its info, ordered and
// ephemeral consumers (created, fetched from, acknowledged, flow-controlled,
// deleted) and direct gets.
func readStream(s string) []string {
	return []string{
		jsAPI + "STREAM.INFO." + s,
		jsAPI + "STREAM.MSG.GET." + s,
		jsAPI + "DIRECT.GET." + s, jsAPI + "DIRECT.GET." + s + ".>",
		jsAPI + "CONSUMER.CREATE." + s, jsAPI + "CONSUMER.CREATE." + s + ".>",
		jsAPI + "CONSUMER.INFO." + s + ".>", jsAPI + "CONSUMER.DELETE." + s + ".>",
		jsAPI + "CONSUMER.MSG.NEXT." + s + ".>",
		"$JS.ACK." + s + ".>", "$JS.FC." + s + ".>",
	}
}

// durableDeny keeps everyone but the aggregator off its durable consumers,
// where fetching or acknowledging would take signals and reports from it.
func durableDeny(n streams.Names, durablePrefix string) []string {
	var deny []string
	for _, c := range []struct{ stream, suffix string }{{n.SignalStream, "signals"}, {n.ReportStream, "reports"}} {
		d := durablePrefix + "-" + c.suffix
		deny = append(deny,
			jsAPI+"CONSUMER.CREATE."+c.stream+"."+d, jsAPI+"CONSUMER.CREATE."+c.stream+"."+d+".>",
			jsAPI+"CONSUMER.DURABLE.CREATE."+c.stream+"."+d,
			jsAPI+"CONSUMER.MSG.NEXT."+c.stream+"."+d, jsAPI+"CONSUMER.DELETE."+c.stream+"."+d,
			"$JS.ACK."+c.stream+"."+d+".>")
	}
	return deny
}

// repairLayout is what re-creating a deleted stream or bucket of the
// layout needs (streams.Keeper), and the advisories that report deletions.
func repairLayout() []string {
	return []string{jsAPI + "STREAM.CREATE.*", jsAPI + "STREAM.UPDATE.*", jsAPI + "STREAM.INFO.*", jsAPI + "STREAM.NAMES"}
}

// kvWrite is publishing (put, update, delete, purge) keys of bucket.
func kvWrite(bucket, keys string) string { return "$KV." + bucket + "." + keys }

// DefaultDurable is the aggregator's durable consumer prefix that the
// permissions protect (aggregator.Options.Durable's default).
const DefaultDurable = "sy-aggregator"

// Permissions returns id's permissions on the layout n.
func (id Identity) Permissions(n streams.Names) (Permissions, error) {
	if err := id.Validate(); err != nil {
		return Permissions{}, err
	}
	if err := n.Validate(); err != nil {
		return Permissions{}, err
	}
	p := Permissions{
		PubAllow: []string{jsAPI + "INFO"},
		SubAllow: []string{streams.InboxPrefix(id.Name) + ".>"},
	}
	buckets := []string{n.EnginesBucket, n.DemandBucket, n.WeightsBucket, n.LeasesBucket}
	pre := n.Prefix
	switch id.Role {
	case RoleAdmin, RoleLeaf:
		p.PubAllow, p.SubAllow, p.Responses = []string{">"}, []string{">"}, true
	case RoleEngine, RoleAgent:
		model := messages.ModelToken(id.Model) // subjects carry the id's token
		if id.Model == "" {
			model = "*"
		}
		for _, e := range id.engines() {
			p.PubAllow = append(p.PubAllow, pre+".signal."+model+"."+e, pre+".kv."+model+"."+e)
			p.SubAllow = append(p.SubAllow, pre+".infer."+model+"."+e, pre+".ctl.engine."+e)
		}
		p.Responses = true
	case RoleRouter:
		router := id.Router
		if router == "" {
			router = "*"
		}
		p.PubAllow = append(p.PubAllow, pre+".report.*."+id.Cluster+"."+router, pre+".infer.>")
		p.SubAllow = append(p.SubAllow, pre+".req."+id.Cluster+".> "+streams.RequestQueue(id.Cluster), pre+".signal.>")
		for _, b := range buckets {
			p.PubAllow = append(p.PubAllow, readStream(streams.BucketStream(b))...)
		}
		p.PubAllow = append(p.PubAllow, readStream(n.KVStream)...)
		p.Responses = true
	case RoleAggregator:
		for _, s := range []string{n.SignalStream, n.ReportStream} {
			p.PubAllow = append(p.PubAllow, readStream(s)...)
			p.PubAllow = append(p.PubAllow, jsAPI+"CONSUMER.DURABLE.CREATE."+s+".>")
		}
		for _, b := range buckets {
			p.PubAllow = append(p.PubAllow, readStream(streams.BucketStream(b))...)
		}
		p.PubAllow = append(p.PubAllow, repairLayout()...)
		p.PubAllow = append(p.PubAllow, kvWrite(n.EnginesBucket, "*.*"), kvWrite(n.DemandBucket, ">"))
		p.PubDeny = append(p.PubDeny, kvWrite(n.EnginesBucket, streams.OperatorPrefix+"*"))
		p.SubAllow = append(p.SubAllow, "$JS.EVENT.ADVISORY.STREAM.DELETED.*")
	case RoleOptimizer:
		for _, b := range buckets {
			p.PubAllow = append(p.PubAllow, readStream(streams.BucketStream(b))...)
		}
		p.PubAllow = append(p.PubAllow, repairLayout()...)
		p.PubAllow = append(p.PubAllow, kvWrite(n.WeightsBucket, ">"), kvWrite(n.LeasesBucket, ">"),
			kvWrite(n.EnginesBucket, streams.PenaltyPrefix+">"))
		p.SubAllow = append(p.SubAllow, "$JS.EVENT.ADVISORY.STREAM.DELETED.*")
	case RoleReader:
		for _, s := range append([]string{n.SignalStream, n.ReportStream, n.KVStream}, bucketStreams(buckets)...) {
			p.PubAllow = append(p.PubAllow, readStream(s)...)
		}
		p.PubAllow = append(p.PubAllow, jsAPI+"STREAM.NAMES", jsAPI+"STREAM.LIST", jsAPI+"CONSUMER.NAMES.*", jsAPI+"CONSUMER.LIST.*")
		p.PubDeny = durableDeny(n, DefaultDurable)
		p.SubAllow = append(p.SubAllow, pre+".signal.>", pre+".report.>", pre+".kv.>")
	}
	if id.Role != RoleAggregator && id.Role != RoleAdmin && id.Role != RoleLeaf {
		p.PubDeny = append(p.PubDeny, durableDeny(n, DefaultDurable)...)
	}
	slices.Sort(p.PubDeny)
	p.PubDeny = slices.Compact(p.PubDeny)
	return p, nil
}

func bucketStreams(buckets []string) []string {
	out := make([]string, len(buckets))
	for i, b := range buckets {
		out[i] = streams.BucketStream(b)
	}
	return out
}
