// Package keeper is the per-node process that owns what must outlive a
// restart of the edge: the sandboxes' inits (it is their child subreaper),
// the commands exec'd in them and their output files, and the mounts of
// layers and root file systems (which live in the keeper's own mount
// namespace, so the host's mount table stays small and a dead keeper's
// mounts go with it).
//
// There is one keeper per node, never one per sandbox. Its core is
// backend-neutral (records and adoption, the exec journal and output,
// events, settings, the API); a Driver per kind of sandbox makes and runs
// them, the container driver first (driver_linux.go).
//
// The edge talks to it over a unix socket in the state directory, HTTP
// with JSON bodies, through Client; the protocol is versioned and its
// policy written in api.go. A restarted edge reconnects and finds every
// sandbox and exec again; a newer dsec replaces the keeper by its own,
// which adopts every sandbox (see Takeover). Exec output goes to files,
// not to pipes held by the edge.
package keeper
