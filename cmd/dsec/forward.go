//go:build dsec_client

package main

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"
)

// nodeBinary is the platform binary's file name, looked up beside dsec.
const nodeBinary = "dsec-node"

// nodeBinEnv names the platform binary when it is elsewhere.
const nodeBinEnv = "DSEC_NODE_BIN"

// platformCmds are stand-ins for the platform's verbs: each hands the
// whole command line to dsec-node, help included.
func platformCmds(_ *globalFlags) []*cobra.Command {
	cmds := make([]*cobra.Command, 0, len(platformVerbs))
	for _, v := range platformVerbs {
		cmds = append(cmds, forwardCmd(v))
	}
	return cmds
}

// imageImportCmd is the stand-in for dsec image import.
func imageImportCmd(_ *globalFlags) *cobra.Command { return forwardCmd(imageImportVerb) }

func forwardCmd(v platformVerb) *cobra.Command {
	cmd := &cobra.Command{
		Use:                v.name,
		Short:              v.short,
		Hidden:             v.hidden,
		DisableFlagParsing: true, // dsec-node parses them, --help included
		RunE:               func(c *cobra.Command, _ []string) error { return forward(c.CommandPath(), os.Args[1:]) },
	}
	// dsec help VERB asks dsec-node for VERB's help.
	cmd.SetHelpFunc(func(c *cobra.Command, _ []string) {
		var path []string // the verb's words after dsec
		for p := c; p.HasParent(); p = p.Parent() {
			path = append([]string{p.Name()}, path...)
		}
		if err := forward(c.CommandPath(), append(path, "--help")); err != nil {
			fmt.Fprintln(os.Stderr, "dsec:", err)
			os.Exit(exitCodeOf(err))
		}
	})
	return cmd
}

// checkForwarded is dsec-node's.
func checkForwarded() {}

// forward replaces this process with dsec-node running args, the command
// line of verb (its command path, "dsec up").
func forward(verb string, args []string) error {
	bin, err := findNode(verb)
	if err != nil {
		return err
	}
	env := append(os.Environ(), forwardedEnv+"="+buildVersion())
	err = syscall.Exec(bin, append([]string{bin}, args...), env)
	return fmt.Errorf("run %s: %w", bin, err)
}

// findNode finds dsec-node: $DSEC_NODE_BIN, else beside this binary, else
// on PATH.
func findNode(verb string) (string, error) {
	if p := os.Getenv(nodeBinEnv); p != "" {
		if err := executable(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w", nodeBinEnv, p, err)
		}
		return p, nil
	}
	var beside string
	if self, err := os.Executable(); err == nil {
		beside = filepath.Join(filepath.Dir(self), nodeBinary)
		if executable(beside) == nil {
			return beside, nil
		}
	}
	if p, err := exec.LookPath(nodeBinary); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%s runs in %s, the platform's binary, which is neither at %s nor on PATH: install it beside dsec (make build puts bin/dsec and bin/%s side by side) or set %s to it", verb, nodeBinary, beside, nodeBinary, nodeBinEnv)
}

func executable(p string) error {
	st, err := os.Stat(p)
	switch {
	case err != nil:
		return err
	case st.IsDir() || st.Mode()&0o111 == 0:
		return fmt.Errorf("not an executable file: %w", fs.ErrPermission)
	}
	return nil
}
