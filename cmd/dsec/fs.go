package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

func newFsCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fs",
		Short: "List, inspect, make, remove and rename files in a sandbox",
		Long: `File operations in a sandbox, on paths written ID:/path. Paths are resolved in
the sandbox's own view of its files: symlinks and .. cannot leave it. To copy
files and trees in and out, use dsec cp.`,
	}
	cmd.AddCommand(newFsLsCmd(g), newFsStatCmd(g), newFsMkdirCmd(g), newFsRmCmd(g), newFsMvCmd(g))
	return cmd
}

// remoteArg parses an ID:/path argument.
func remoteArg(s string) (id, p string, err error) {
	if err := badSandboxPath("argument", s); err != nil {
		return "", "", err
	}
	id, p, ok := sandboxPath(s)
	if !ok || p == "" {
		return "", "", usageErrorf("%q: want ID:/path (a sandbox ID, a colon, a path in it)", s)
	}
	return id, p, nil
}

func newFsLsCmd(g *globalFlags) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "ls [flags] ID:/dir",
		Short: "List a directory",
		Long: `List a directory of a sandbox, sorted by name: mode, owner (uid:gid as seen
in the sandbox), size in bytes, modification time and name (with the target
of a symlink). At most 10000 entries are listed; a note on standard error says
when more were left out.`,
		Example: `  dsec fs ls ID:/work
  dsec fs ls -o json ID:/`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			id, p, err := remoteArg(args[0])
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			entries, truncated, err := c.Sandbox(id).ListDir(cmd.Context(), p)
			if err != nil {
				return err
			}
			sort.Slice(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name })
			if truncated {
				fmt.Fprintf(cmd.ErrOrStderr(), "dsec: %s has more entries than the %d listed\n", p, len(entries))
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				return encodeProtos(out, entries, fileInfoProto)
			}
			tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "MODE\tOWNER\tSIZE\tMODIFIED\tNAME")
			for _, e := range entries {
				name := e.Name
				if name == "" {
					name = e.Path
				}
				if e.LinkTarget != "" {
					name += " -> " + e.LinkTarget
				}
				fmt.Fprintf(tw, "%s\t%d:%d\t%d\t%s\t%s\n", e.Mode, e.UID, e.GID, e.Size, e.ModTime.Local().Format("2006-01-02 15:04"), name)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func newFsStatCmd(g *globalFlags) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "stat [flags] ID:/path",
		Short: "Describe a file",
		Long:  `Describe a file of a sandbox (symlinks inside the sandbox are followed).`,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			id, p, err := remoteArg(args[0])
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			info, err := c.Sandbox(id).Stat(cmd.Context(), p)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				return encodeProto(out, fileInfoProto(info))
			}
			printFileInfo(out, info)
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table (one field per line) or json")
	return cmd
}

func printFileInfo(w io.Writer, info dsec.FileInfo) {
	tw := tabwriter.NewWriter(w, 2, 4, 1, ' ', 0)
	typ := info.Type
	if typ == "" {
		typ = "-"
	}
	fmt.Fprintf(tw, "Path:\t%s\n", info.Path)
	fmt.Fprintf(tw, "Type:\t%s\n", typ)
	fmt.Fprintf(tw, "Size:\t%d\n", info.Size)
	fmt.Fprintf(tw, "Mode:\t%s (%04o)\n", info.Mode, uint32(info.Mode.Perm())|specialBits(info.Mode))
	fmt.Fprintf(tw, "Owner:\t%d:%d\n", info.UID, info.GID)
	fmt.Fprintf(tw, "Modified:\t%s\n", info.ModTime.Local().Format(time.RFC3339))
	if info.LinkTarget != "" {
		fmt.Fprintf(tw, "Target:\t%s\n", info.LinkTarget)
	}
	_ = tw.Flush()
}

// specialBits returns the setuid, setgid and sticky bits of m as Unix bits.
func specialBits(m os.FileMode) uint32 {
	var b uint32
	if m&os.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}

// parseMode parses octal permission bits (with setuid, setgid, sticky).
func parseMode(flag, s string) (os.FileMode, error) {
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v > 0o7777 {
		return 0, usageErrorf("%s %q: want octal permission bits like 0755", flag, s)
	}
	m := os.FileMode(v & 0o777)
	if v&0o4000 != 0 {
		m |= os.ModeSetuid
	}
	if v&0o2000 != 0 {
		m |= os.ModeSetgid
	}
	if v&0o1000 != 0 {
		m |= os.ModeSticky
	}
	return m, nil
}

// forEachRemote runs fn for each ID:/path argument and reports failures on
// errw; it returns an error when any failed.
func forEachRemote(cmd *cobra.Command, g *globalFlags, args []string, fn func(sb *dsec.Sandbox, p string) error) error {
	type target struct{ id, p string }
	var targets []target
	for _, a := range args {
		id, p, err := remoteArg(a)
		if err != nil {
			return err
		}
		targets = append(targets, target{id, p})
	}
	c, err := g.client()
	if err != nil {
		return err
	}
	defer c.Close()
	var firstErr error
	for _, t := range targets {
		if err := fn(c.Sandbox(t.id), t.p); err != nil {
			if len(targets) == 1 {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "dsec: %s:%s: %v\n", t.id, t.p, err)
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	if firstErr != nil {
		return exitError{exitCodeOf(firstErr)}
	}
	return nil
}

func newFsMkdirCmd(g *globalFlags) *cobra.Command {
	var (
		parents     bool
		mode, owner string
	)
	cmd := &cobra.Command{
		Use:   "mkdir [flags] ID:/dir...",
		Short: "Make directories",
		Long: `Make directories in a sandbox. With -p, make missing parents too, and an
existing directory is no error.`,
		Example: `  dsec fs mkdir -p ID:/work/out
  dsec fs mkdir --mode 0700 --owner 1000:1000 ID:/home/app/.ssh`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts := []dsec.FileOption{}
			if parents {
				opts = append(opts, dsec.WithMakeParents())
			}
			if mode != "" {
				m, err := parseMode("--mode", mode)
				if err != nil {
					return err
				}
				opts = append(opts, dsec.WithMode(m))
			}
			if owner != "" {
				opts = append(opts, dsec.WithOwner(owner))
			}
			return forEachRemote(cmd, g, args, func(sb *dsec.Sandbox, p string) error {
				return sb.MakeDir(cmd.Context(), p, opts...)
			})
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&parents, "parents", "p", false, "make missing parents; an existing directory is no error")
	f.StringVar(&mode, "mode", "", "permission bits in octal (default 0755)")
	f.StringVar(&owner, "owner", "", "owner as seen in the sandbox: NAME, UID or UID:GID (default root)")
	return cmd
}

func newFsRmCmd(g *globalFlags) *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:   "rm [flags] ID:/path...",
		Short: "Remove files and directories",
		Long:  `Remove files and empty directories of a sandbox; with -r, whole trees.`,
		Example: `  dsec fs rm ID:/tmp/out.log
  dsec fs rm -r ID:/work/build`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return forEachRemote(cmd, g, args, func(sb *dsec.Sandbox, p string) error {
				return sb.Remove(cmd.Context(), p, recursive)
			})
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "remove directories and everything in them")
	return cmd
}

func newFsMvCmd(g *globalFlags) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "mv [flags] ID:/from ID:/to",
		Short: "Rename a file or directory",
		Long: `Rename a file or directory inside one sandbox. The destination may be written
ID:/to or just /to. An existing destination is an error unless -f.`,
		Example: `  dsec fs mv ID:/work/a.txt ID:/work/b.txt
  dsec fs mv -f ID:/tmp/new /work/current`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, from, err := remoteArg(args[0])
			if err != nil {
				return err
			}
			to := args[1]
			if toID, p, ok := sandboxPath(to); ok {
				if toID != id {
					return usageErrorf("mv renames within one sandbox: %s and %s differ (copy across with dsec cp)", id, toID)
				}
				to = p
			}
			if to == "" {
				return usageErrorf("empty destination")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			return c.Sandbox(id).Rename(cmd.Context(), from, to, force)
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "replace an existing destination")
	return cmd
}
