// Package layering writes down, once, which of dsec's packages may import
// which; its tests hold the tree to it.
//
// The packages of the three modules (the API module, the Go SDK module and
// the server's) sit in layers, listed from the bottom up. A package may
// import packages of its own layer and of the layers below; an import of a
// layer above fails the test, which names the import and both layers. On
// top of that, forbidden lists imports the layers would allow but the
// design does not. A package of ours that is in no layer fails too: a new
// package is placed on purpose.
//
// Tests are held to the same rules as the code they test. The test also
// checks that the API and SDK modules build and pass their tests alone
// (GOWORK=off, inside their directories) and that the SDK's module graph
// holds neither etcd nor gRPC nor the server's module.
package layering

// Module is the server's module path; package patterns below are relative
// to it.
const Module = "github.com/dsecproject/dsec"

// A layer is a set of packages. Patterns are import paths relative to
// Module: "x" is the package x, "x/..." is x and every package below it.
// A package belongs to the layer of the longest pattern that matches it.
type layer struct {
	name string
	pkgs []string
}

// layers are listed from the bottom up.
var layers = []layer{
	// The wire contract, a module of its own (generated code, the error
	// kinds, the sparse tar format): it imports nothing of ours but itself.
	{"api", []string{"api/..."}},
	// The Go SDK, a module of its own: it sees only the API module.
	{"sdk", []string{"sdk/go/..."}},
	// Error kinds and the API boundary, metrics, request bounds, test
	// helpers: nothing that knows what a sandbox is.
	{"base", []string{
		"internal/apierr",
		"internal/atomicfile",
		"internal/caller",
		"internal/errdefs",
		"internal/layering",
		"internal/lazyregexp",
		"internal/metrics",
		// The network policy model and the catalogue (pure: the
		// standard library, errdefs and TOML).
		"internal/netpolicy",
		"internal/project",
		"internal/reqlimit",
		"internal/streams",
		"internal/testenv",
	}},
	// What a node is made of: the sandbox contract, layers and their
	// stores, root file systems, cgroups, namespaces, seccomp, file
	// operations. Each knows nothing of who drives it.
	{"node mechanisms", []string{
		// The sandbox contract every backend implements, and its
		// conformance suite.
		"internal/sandbox/...",
		"internal/blobsource",
		"internal/blobstore",
		"internal/ceiling",
		"internal/cgroup",
		"internal/chunkcache",
		"internal/debian",
		"internal/diskquota",
		"internal/layer",
		"internal/lazyfs",
		"internal/netdns",
		// The router namespace's firewall and the egress proxy.
		"internal/netfw",
		"internal/netns",
		"internal/netproxy",
		"internal/nsexec",
		"internal/oci",
		"internal/ociimport",
		// Moving a process's memory out of RAM and back
		// (process_madvise), for pause.
		"internal/pageout",
		"internal/rootfs",
		"internal/sandboxfs",
		"internal/seccomp",
		// The node's swap file and its test helper.
		"internal/swap/...",
	}},
	// The per-node supervisor and its drivers.
	{"keeper", []string{"internal/keeper/..."}},
	// The backends, which the edge drives through the contract.
	{"backends", []string{"internal/edge/backend/..."}},
	// The node agent: the authority for its node.
	{"edge", []string{"internal/edge/..."}},
	// The control plane: the API server, cluster state in etcd, placement,
	// the watcher, the way to the edges, and the API's compatibility
	// surfaces. The edge below never reaches etcd.
	{"control plane", []string{
		"internal/apiserver",
		"internal/cluster",
		"internal/codeeval",
		"internal/edgeclient",
		"internal/fusion",
		"internal/lazylayer",
		"internal/placement",
		// The ports proxy: the way in to sandboxes' listening ports.
		"internal/portproxy",
		"internal/watcher",
	}},
	// What wires the pieces together into processes, and node-wide tools.
	{"assembly", []string{
		"internal/doctor",
		"internal/purge",
		"internal/server",
		"internal/testenv/platform",
		// The record of the running dsec up of a state dir (dsec down).
		"internal/uplock",
	}},
	// Programs and the tests that drive them from outside.
	{"programs", []string{
		"bench/...",
		"cmd/...",
		"e2e/...",
		"test/...",
	}},
}

// A rule forbids the packages matching from to import those matching to
// (patterns as in layer).
type rule struct {
	from, to string
	why      string
}

// forbidden lists imports that the layers allow but the design does not.
var forbidden = []rule{
	{"internal/edge", "internal/edge/backend/...", "the edge knows backends only through the sandbox contract; internal/server wires them in"},
	{"internal/edge", "internal/keeper/...", "only a backend talks to the keeper; the edge drives backends through the contract"},
	{"internal/apiserver", "internal/edge/backend/...", "the API server reaches sandboxes through the edges, never through a backend"},
	{"internal/apiserver", "internal/keeper/...", "the API server reaches sandboxes through the edges, never through the keeper"},
	{"internal/keeper/...", "internal/edge/...", "the keeper is driven by backends and knows nothing of the edge"},
	{"internal/apiserver", "internal/edge/...", "the API server reaches edges through the node API (internal/edgeclient), not through the edge's code"},
}
