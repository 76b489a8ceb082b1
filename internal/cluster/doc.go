// Package cluster keeps dsec's cluster state in etcd: the nodes that run an
// edge, the image layers and images they can start sandboxes from, and the
// API keys that may call the apiserver.
//
// Nothing per sandbox, per exec or per state transition goes through etcd;
// the edges own that state on their nodes. What lives here changes rarely
// (a node joins, an image is built, a key is created, a project's limits
// are set) and is read often, so reads are plain range requests, and what
// every API call reads (API keys, project limits, images for the check on
// create) is cached, kept current by a CacheWatch (cache.go).
//
// StartEmbedded runs a single-member etcd inside the process (`dsec up`);
// a fleet points a *clientv3.Client at a 3- or 5-member etcd cluster
// instead. Store works over either.
//
// Invariants:
//   - Every key lives under /dsec/v1/; every value is a JSON object with a
//     "version" field (the schema version, currently 1). A reader refuses a
//     value written by a newer schema instead of misreading it.
//   - A node's key is attached to a lease owned by its Registration: when the
//     edge stops renewing it, the node disappears after the TTL.
//   - An image is written only in a transaction that checks every layer it
//     names exists.
//   - Only the SHA-256 of an API key's secret is stored.
//   - A change to a key, a project or an image made through any Store is
//     seen by every Store within RevocationWindow (cache.go).
//   - Every image has a project (records without one, from before owners,
//     read as DefaultProject and public). A tag is written (WriteImage)
//     in one transaction that checks the tag did not change since its
//     owner and content were checked, so two projects racing for a new
//     name cannot both have it.
//   - A layer record is deleted (DeleteLayer, for GC) only in a transaction
//     that fails when any image was written after the revision at which no
//     image named it; layers an image stops naming (deleted or re-tagged) are
//     marked released first, so GC can keep them for its grace period. The
//     caller checks the nodes' sandboxes (see gc.go for the whole rule).
package cluster
