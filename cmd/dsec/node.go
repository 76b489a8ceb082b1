//go:build !dsec_client

package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	_ "github.com/dsecproject/dsec/internal/nsexec" // init and exec helper modes
)

// platformCmds are the verbs that run the platform or work on this
// machine's installation rather than through the API. dsec-node runs them;
// the command-line client (-tags dsec_client) hands them to dsec-node.
func platformCmds(g *globalFlags) []*cobra.Command {
	return []*cobra.Command{
		newUpCmd(g),
		newDownCmd(g),
		newKeeperCmd(g),
		newEvalCmd(),
		newDoctorCmd(g),
		newPurgeCmd(g),
		newBlobserverCmd(),
	}
}

// imageImportCmd is dsec image import, which links a registry client.
func imageImportCmd(g *globalFlags) *cobra.Command { return newImageImportCmd(g) }

// checkForwarded warns when the dsec that handed this process its verb is
// another version than this dsec-node, and keeps the variable from the
// processes this one starts.
func checkForwarded() {
	v, ok := os.LookupEnv(forwardedEnv)
	if !ok {
		return
	}
	os.Unsetenv(forwardedEnv)
	if self := buildVersion(); v != self {
		fmt.Fprintf(os.Stderr, "dsec: warning: dsec %s handed this command to dsec-node %s: install the two from one build (make build)\n", v, self)
	}
}

// verbShort is the help line of platform verb name.
func verbShort(name string) string {
	if name == imageImportVerb.name {
		return imageImportVerb.short
	}
	for _, v := range platformVerbs {
		if v.name == name {
			return v.short
		}
	}
	panic("dsec: no platform verb " + name)
}

func (g *globalFlags) resolvedStateDir() string {
	if g.stateDir != "" {
		return g.stateDir
	}
	if d := os.Getenv("DSEC_STATE_DIR"); d != "" {
		return d
	}
	return "/var/lib/dsec"
}
