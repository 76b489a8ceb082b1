package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dsecproject/dsec/internal/edge"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// sandboxPath splits "ID:/path"; ok is false for a local path.
func sandboxPath(s string) (id, p string, ok bool) {
	id, p, found := strings.Cut(s, ":")
	if !found || strings.Contains(id, "/") {
		return "", "", false
	}
	if _, valid := edge.NodeOfID(id); !valid {
		return "", "", false
	}
	return id, p, true
}

func newCpCmd(g *globalFlags) *cobra.Command {
	var mode string
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files between the local machine and a sandbox",
		Long: `Copy a file into or out of a sandbox. One side is ID:/path in the sandbox, the
other a local path, or - for standard input or output. Missing parent
directories in the sandbox are created.`,
		Example: `  dsec cp ./script.py ID:/work/script.py
  dsec cp ID:/work/out.json ./out.json
  dsec cp ID:/etc/os-release -`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcID, srcPath, srcRemote := sandboxPath(args[0])
			dstID, dstPath, dstRemote := sandboxPath(args[1])
			if srcRemote == dstRemote {
				return usageErrorf("exactly one of SRC and DST must be ID:/path")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx := cmd.Context()
			if srcRemote {
				return download(ctx, c.Sandbox(srcID), srcPath, args[1], cmd.OutOrStdout())
			}
			sb := c.Sandbox(dstID)
			var r io.Reader = cmd.InOrStdin()
			opts := []dsec.FileOption{dsec.WithMakeParents()}
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				st, err := f.Stat()
				if err != nil {
					return err
				}
				if st.IsDir() {
					return usageErrorf("%s is a directory: directory copies come with tar streams, not in this build yet", args[0])
				}
				r = f
				opts = append(opts, dsec.WithMode(st.Mode().Perm()))
				if strings.HasSuffix(dstPath, "/") {
					dstPath += path.Base(args[0])
				}
			}
			if mode != "" {
				var m uint32
				if _, err := fmt.Sscanf(mode, "%o", &m); err != nil || m > 0o7777 {
					return usageErrorf("--mode %q: want octal permission bits like 0644", mode)
				}
				opts = append(opts, dsec.WithMode(os.FileMode(m)))
			}
			_, err = sb.Upload(ctx, dstPath, r, opts...)
			return err
		},
	}
	cmd.Flags().StringVar(&mode, "mode", "", "permission bits of a file copied into a sandbox (default: the local file's, or 0644)")
	return cmd
}

// download copies a sandbox file to dst ("-" is w), atomically: a partial
// copy never replaces dst.
func download(ctx context.Context, sb *dsec.Sandbox, src, dst string, w io.Writer) error {
	if dst == "-" {
		_, err := sb.Download(ctx, src, w)
		return err
	}
	if st, err := os.Stat(dst); err == nil && st.IsDir() {
		dst = filepath.Join(dst, path.Base(src))
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".dsec-cp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	info, err := sb.Download(ctx, src, tmp)
	if err != nil {
		return err
	}
	if err := tmp.Chmod(info.Mode.Perm()); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}
