// Package cluster keeps dsec's cluster state in etcd: the nodes that run an
// edge, the image layers and images they can start sandboxes from, and the
// API keys that may call the apiserver.
//
// Nothing per sandbox, per exec or per state transition goes through etcd;
// the edges own that state on their nodes. What lives here changes rarely
// (a node joins, an image is built, a key is created) and is read often, so
// reads are plain range requests and API key checks are cached.
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
//   - A layer record is deleted (DeleteLayer, for GC) only in a transaction
//     that fails when any image was written after the revision at which no
//     image named it; layers an image stops naming (deleted or re-tagged) are
//     marked released first, so GC can keep them for its grace period. The
//     caller checks the nodes' sandboxes (see gc.go for the whole rule).
package cluster
