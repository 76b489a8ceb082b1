package dsec

import (
	"context"
	"sort"
	"strings"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// NetworkPolicy grants a sandbox egress by intent (docs/network.md): the
// default is none, loopback only. Give either Text, in the CLI's --network
// syntax, or Mode and Rules; NetworkFlag and NetworkServices build one.
// The server validates it: a bad rule is ErrInvalidArgument naming the
// rule, mode open where the operator forbids it ErrFailedPrecondition.
type NetworkPolicy struct {
	// Mode is "none", "rules" or "open"; empty is rules with rules, none
	// without.
	Mode  string
	Rules []NetworkRule
	// Text is the policy in --network syntax ("allow=pypi,github,deny=npm",
	// "open,deny=*.example.com"), instead of Mode and Rules. Policies the
	// server returns always have Mode and Rules.
	Text string
}

// NetworkRule allows or denies one target: exactly one of Service, Domain
// and CIDR.
type NetworkRule struct {
	// Action is "allow" or "deny".
	Action string
	// Service is a catalogue entry ("pypi", "npm", "github", ...).
	Service string
	// Domain is an exact name or a wildcard ("*.example.com").
	Domain string
	// CIDR is a network or a bare address.
	CIDR string
	// Ports are ports and ranges ("443", "8000-8100"); none is the
	// service's ports for an allowed service, every port otherwise.
	Ports []string
	// Protocol is "tcp" (the default) or "udp" (with a CIDR only).
	Protocol string
}

// NetworkFlag is the policy written in the CLI's --network syntax; the
// server parses it. policy=FILE is the CLI's: read the file and give its
// rules instead.
func NetworkFlag(s string) *NetworkPolicy { return &NetworkPolicy{Text: s} }

// NetworkServices is the Python SDK's network_rules in Go: each target
// (normally a service name) allowed when true and denied when false, in
// the order of their names. An empty map is none.
func NetworkServices(m map[string]bool) (*NetworkPolicy, error) {
	if len(m) == 0 {
		return &NetworkPolicy{Mode: "none"}, nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		if k == "" || strings.ContainsAny(k, ",=") {
			return nil, newError(ErrInvalidArgument, "network rules: %q is not a service, domain or CIDR", k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		action := "deny="
		if m[k] {
			action = "allow="
		}
		parts[i] = action + k
	}
	return &NetworkPolicy{Text: strings.Join(parts, ",")}, nil
}

// Proto returns the policy as the API's message (nil for nil), as the
// SDK sends it; for programs that print or store the API's own form.
func (p *NetworkPolicy) Proto() *sandboxv1.NetworkPolicy {
	if p == nil {
		return nil
	}
	out := &sandboxv1.NetworkPolicy{Mode: p.Mode, Text: p.Text}
	for _, r := range p.Rules {
		pr := &sandboxv1.NetworkRule{Action: r.Action, Ports: r.Ports, Protocol: r.Protocol}
		switch {
		case r.Service != "":
			pr.Target = &sandboxv1.NetworkRule_Service{Service: r.Service}
		case r.Domain != "":
			pr.Target = &sandboxv1.NetworkRule_Domain{Domain: r.Domain}
		case r.CIDR != "":
			pr.Target = &sandboxv1.NetworkRule_Cidr{Cidr: r.CIDR}
		}
		out.Rules = append(out.Rules, pr)
	}
	return out
}

func networkPolicyOf(p *sandboxv1.NetworkPolicy) *NetworkPolicy {
	if p == nil {
		return nil
	}
	out := &NetworkPolicy{Mode: p.GetMode(), Text: p.GetText()}
	for _, r := range p.GetRules() {
		out.Rules = append(out.Rules, NetworkRule{
			Action: r.GetAction(), Service: r.GetService(), Domain: r.GetDomain(), CIDR: r.GetCidr(),
			Ports: r.GetPorts(), Protocol: r.GetProtocol(),
		})
	}
	return out
}

// String writes p in --network syntax.
func (p *NetworkPolicy) String() string {
	switch {
	case p == nil:
		return "none"
	case p.Text != "":
		return p.Text
	case len(p.Rules) == 0 && p.Mode == "open":
		return "open"
	case len(p.Rules) == 0:
		return "none"
	}
	var parts []string
	if p.Mode == "open" {
		parts = append(parts, "open")
	}
	last := ""
	for _, r := range p.Rules {
		t := r.Service + r.Domain + r.CIDR
		if len(r.Ports) > 0 {
			if strings.Contains(r.CIDR, ":") {
				t = "[" + t + "]"
			}
			t += ":" + strings.Join(r.Ports, "+")
		}
		if r.Protocol == "udp" {
			t += "/udp"
		}
		if r.Action != last {
			t = r.Action + "=" + t
			last = r.Action
		}
		parts = append(parts, t)
	}
	return strings.Join(parts, ",")
}

// NetworkInfo is a sandbox's network as its node enforces it.
type NetworkInfo struct {
	// Policy is the policy in force; mode none without network.
	Policy *NetworkPolicy
	// Address is the sandbox's own address, Gateway its router and
	// resolver; empty without network.
	Address, Gateway string
	// Counters since the sandbox got its network.
	BytesOut, BytesIn                 int64
	ConnectionsOut, ConnectionsActive int64
	Denied, DNSQueries, DNSDenied     int64
	Denials                           []NetworkDenial
}

// NetworkDenial is one denied connection or name lookup.
type NetworkDenial struct {
	Time time.Time
	// Destination is "ADDR:PORT/tcp", "ADDR:PORT/udp" or the name looked
	// up; Name the TLS SNI or HTTP Host the connection named.
	Destination, Name string
	// Reason says which rule denied it ("denied by rule 3 (deny npm)").
	Reason string
}

// NetworkResult is the outcome of a network update of one sandbox.
type NetworkResult struct {
	ID string
	// Policy is the policy now in force, when Err is nil.
	Policy *NetworkPolicy
	Err    *Error
}

// UpdateNetwork replaces the sandbox's network policy, or with merge adds
// p's rules to it, and returns the policy now in force. It applies to new
// connections at once; established connections it no longer allows are
// cut.
func (s *Sandbox) UpdateNetwork(ctx context.Context, p *NetworkPolicy, merge bool) (*NetworkPolicy, error) {
	if p == nil {
		p = &NetworkPolicy{Mode: "none"}
	}
	resp, err := s.c.sandboxes.UpdateNetwork(ctx, connect.NewRequest(&sandboxv1.UpdateNetworkRequest{
		Id: s.ID, Policy: p.Proto(), Merge: merge,
	}))
	if err != nil {
		return nil, s.c.err(err)
	}
	for _, r := range resp.Msg.GetResults() {
		if r.GetId() != s.ID {
			continue
		}
		if r.GetError() != nil {
			return nil, itemError(r.GetError())
		}
		return networkPolicyOf(r.GetPolicy()), nil
	}
	return nil, newError(ErrInternal, "update network: the server did not answer for sandbox %s", s.ID)
}

// UpdateNetwork updates the network policy of every sandbox the selector
// matches (labels ANDed, at least one) as Sandbox.UpdateNetwork does, and
// returns one result per sandbox, in ID order. A policy that is bad for
// all fails the call; what fails for one sandbox is in its result.
func (c *Client) UpdateNetwork(ctx context.Context, selector map[string]string, p *NetworkPolicy, merge bool) ([]NetworkResult, error) {
	if len(selector) == 0 {
		return nil, newError(ErrInvalidArgument, "update network: the selector needs at least one label")
	}
	if p == nil {
		p = &NetworkPolicy{Mode: "none"}
	}
	resp, err := c.sandboxes.UpdateNetwork(ctx, connect.NewRequest(&sandboxv1.UpdateNetworkRequest{
		Selector: selector, Policy: p.Proto(), Merge: merge,
	}))
	if err != nil {
		return nil, c.err(err)
	}
	var out []NetworkResult
	for _, r := range resp.Msg.GetResults() {
		res := NetworkResult{ID: r.GetId(), Policy: networkPolicyOf(r.GetPolicy())}
		if r.GetError() != nil {
			res.Err = itemError(r.GetError())
		}
		out = append(out, res)
	}
	return out, nil
}

// Network reports the sandbox's network: its policy, addresses, counters
// and recent denials (why a connection failed).
func (s *Sandbox) Network(ctx context.Context) (*NetworkInfo, error) {
	resp, err := s.c.sandboxes.GetNetwork(ctx, connect.NewRequest(&sandboxv1.GetNetworkRequest{Id: s.ID}))
	if err != nil {
		return nil, s.c.err(err)
	}
	m := resp.Msg
	out := &NetworkInfo{
		Policy: networkPolicyOf(m.GetPolicy()), Address: m.GetAddress(), Gateway: m.GetGateway(),
		BytesOut: m.GetBytesOut(), BytesIn: m.GetBytesIn(),
		ConnectionsOut: m.GetConnectionsOut(), ConnectionsActive: m.GetConnectionsActive(),
		Denied: m.GetDenied(), DNSQueries: m.GetDnsQueries(), DNSDenied: m.GetDnsDenied(),
	}
	for _, d := range m.GetDenials() {
		out.Denials = append(out.Denials, NetworkDenial{Time: timeOf(d.GetTime()), Destination: d.GetDestination(), Name: d.GetName(), Reason: d.GetReason()})
	}
	return out, nil
}
