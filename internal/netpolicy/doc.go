// Package netpolicy is the model of a sandbox's network policy: the rules a
// user writes (allow or deny a service of the catalogue, a domain or a CIDR,
// with ports and a protocol), the modes (none, rules, open), the catalogue
// of services (built in, overridden and extended by the operator's TOML
// file), the parsers of the forms users write them in (the Python SDK's
// network_rules map, the CLI's --network value, the JSON policy document)
// and the decision for one connection.
//
// The package is pure: it opens no socket and touches no namespace. The
// egress proxy, the node resolver, the API and the CLI use it; docs/network.md
// describes the model for users.
//
// Invariants:
//   - The default is deny: a Policy of mode none allows nothing, and a
//     Policy of mode rules allows only what a rule allows.
//   - The most specific matching rule decides; at equal specificity deny
//     wins (see Specificity).
//   - Private, loopback, link-local, multicast and other special addresses,
//     and the node's own and its sandboxes' addresses (Catalogue.Local), are
//     reached only through an operator's catalogue entry, in every mode.
//   - A domain rule matches a connection only when the name matches and the
//     destination address is one the name resolved to through the node
//     resolver (Dest.Resolved); a name alone opens no address.
//   - Values are immutable once built: a *Policy and a *Catalogue may be
//     shared by goroutines without locks.
package netpolicy
