package sandbox

import (
	"context"
	"time"
)

// NetworkPolicer is the optional capability of enforcing a network policy
// on a running sandbox: the node gives the sandbox a link to its router
// and judges every connection and name lookup by the policy
// (docs/network.md). The policy is internal/netpolicy's JSON document, as
// the edge validated and stored it.
type NetworkPolicer interface {
	// SetNetwork gives sandbox id the policy (the first call attaches the
	// sandbox's link) and returns its network as now enforced. It applies
	// to new connections at once and cuts established ones it no longer
	// allows.
	SetNetwork(ctx context.Context, id string, policy []byte) (NetworkInfo, error)
	// Network reports sandbox id's network.
	Network(ctx context.Context, id string) (NetworkInfo, error)
}

// NetworkTotaler is the optional capability of reporting the node's
// network counters as a whole, in one call, for /metrics.
type NetworkTotaler interface {
	NetworkTotals(ctx context.Context) (NetworkTotals, error)
}

// NetworkTotals are the node's network counters, added up over every
// sandbox given a network since the node's network opened (deleted ones
// included); ConnsActive is the connections open now.
type NetworkTotals struct {
	BytesOut, BytesIn     int64
	ConnsOut, ConnsActive int64
	Denied                int64
	DNSQueries, DNSDenied int64
}

// NetworkInfo is a sandbox's network as the node enforces it.
type NetworkInfo struct {
	// Policy is the JSON document in force; empty without network.
	Policy []byte
	// Address is the sandbox's own address, Router its gateway and
	// resolver.
	Address, Router string
	// Counters since the link was made.
	BytesOut, BytesIn     int64
	ConnsOut, ConnsActive int64
	Denied                int64
	DNSQueries, DNSDenied int64
	// Denials are the most recent denied attempts, oldest first.
	Denials []NetworkDenial
}

// NetworkDenial is one denied connection or name lookup.
type NetworkDenial struct {
	Time time.Time
	// Dest is "ADDR:PORT/tcp", "ADDR:PORT/udp" or the name looked up.
	Dest string
	// Name is the SNI or Host the connection named.
	Name   string
	Reason string
}
