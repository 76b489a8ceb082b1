package main

// The command-line client and the platform are two builds of this package:
// bin/dsec (-tags dsec_client: the API's client verbs only, so that a
// command starts without initialising the server's packages) and
// bin/dsec-node (every verb, the server included; it is also the node
// keeper, each sandbox's init and the exec helper). The client hands the
// platform's verbs to dsec-node (forward.go).

// forwardedEnv carries the version of the client that handed a verb to
// dsec-node, which warns when its own differs.
const forwardedEnv = "DSEC_FORWARDED_BY"

// platformVerb is a verb that dsec-node runs: its name and help line, the
// same in both builds (TestPlatformVerbsMatch).
type platformVerb struct {
	name, short string
	hidden      bool
}

// platformVerbs are the root's platform verbs, in the order of help.
var platformVerbs = []platformVerb{
	{name: "up", short: "Run the whole platform on this machine"},
	{name: "down", short: "Stop dsec up (sandboxes keep running unless --all)"},
	{name: "keeper", short: "Run the node keeper (started by dsec up; not for direct use)", hidden: true},
	{name: "eval", short: "Run a HumanEval or MBPP jsonl file through the SandboxFusion run_code API"},
	{name: "doctor", short: "Check that this machine has what dsec needs"},
	{name: "purge", short: "Remove everything dsec made on this machine"},
	{name: "blobserver", short: "Serve a blob store read-only over HTTP, with Range requests"},
}

// imageImportVerb is dsec image import, which links a registry client.
var imageImportVerb = platformVerb{name: "import", short: "Import a container image from a registry, an OCI layout or a docker save archive"}
