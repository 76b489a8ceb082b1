package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
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
		Short: "Copy files and directories between the local machine and a sandbox",
		Long: `Copy a file or a directory tree into or out of a sandbox. One side is ID:/path
in the sandbox, the other a local path, or - for standard input or output.

Files: into a sandbox, missing parent directories are created and a DST
ending in / receives the file under its own name; out of one, an existing
local directory as DST receives it under its own name, and a partial copy
never replaces DST.

Directories are copied as tar streams, like cp -r: when DST is an existing
directory the tree lands inside it under its own name, otherwise DST becomes
the copy; SRC ending in /. copies the directory's contents instead. Regular
files, directories and symlinks are copied with their permission bits and
times; owners are not (files in a sandbox belong to its root, files here to
you). Out of a sandbox, entries that would land outside DST are refused.
ID:/dir to - writes the tar archive to standard output.`,
		Example: `  dsec cp ./script.py ID:/work/script.py
  dsec cp ID:/work/out.json ./out.json
  dsec cp ./project ID:/work          # makes /work/project
  dsec cp ID:/work/results ./results
  dsec cp ID:/etc/os-release -`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcID, srcPath, srcRemote := sandboxPath(args[0])
			dstID, dstPath, dstRemote := sandboxPath(args[1])
			if srcRemote == dstRemote {
				return usageErrorf("exactly one of SRC and DST must be ID:/path")
			}
			var fileMode os.FileMode
			if mode != "" {
				m, err := parseMode("--mode", mode)
				if err != nil {
					return err
				}
				fileMode = m
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx := cmd.Context()
			if srcRemote {
				sb := c.Sandbox(srcID)
				info, err := sb.Stat(ctx, srcPath)
				if err != nil {
					return err
				}
				if info.IsDir {
					return downloadDir(ctx, sb, srcPath, args[1], cmd.OutOrStdout())
				}
				return download(ctx, sb, srcPath, args[1], cmd.OutOrStdout())
			}
			sb := c.Sandbox(dstID)
			if args[0] != "-" {
				st, err := os.Stat(args[0])
				if err != nil {
					return err
				}
				if st.IsDir() {
					if mode != "" {
						return usageErrorf("--mode is for files; a directory's modes are copied as they are")
					}
					return uploadDir(ctx, sb, args[0], dstPath)
				}
			}
			return uploadFile(ctx, sb, args[0], dstPath, cmd.InOrStdin(), fileMode)
		},
	}
	cmd.Flags().StringVar(&mode, "mode", "", "permission bits in octal of a file copied into a sandbox (default: the local file's, or 0644)")
	return cmd
}

// uploadFile copies the local file src ("-" is stdin) to dst in sb.
func uploadFile(ctx context.Context, sb *dsec.Sandbox, src, dst string, stdin io.Reader, mode os.FileMode) error {
	var r io.Reader = stdin
	opts := []dsec.FileOption{dsec.WithMakeParents()}
	if src != "-" {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		r = f
		opts = append(opts, dsec.WithMode(st.Mode().Perm()))
		if strings.HasSuffix(dst, "/") {
			dst += filepath.Base(src)
		}
	}
	if mode != 0 {
		opts = append(opts, dsec.WithMode(mode))
	}
	_, err := sb.Upload(ctx, dst, r, opts...)
	return err
}

// contentsOnly reports whether a copy's source names a directory's
// contents (dir/.) rather than the directory.
func contentsOnly(p string) bool {
	return p == "." || strings.HasSuffix(p, "/.") || strings.HasSuffix(p, string(filepath.Separator)+".")
}

// uploadDir copies the local tree src into sb at dst, like cp -r.
func uploadDir(ctx context.Context, sb *dsec.Sandbox, src, dst string) error {
	target := dst
	if !contentsOnly(src) {
		info, err := sb.Stat(ctx, dst)
		switch {
		case err == nil && info.IsDir:
			target = path.Join(dst, filepath.Base(filepath.Clean(src)))
		case err == nil:
			return fmt.Errorf("%s:%s exists and is not a directory", sb.ID, dst)
		case !isNotFound(err):
			return err
		}
	}
	_, err := sb.UploadDir(ctx, src, target, dsec.WithMakeParents())
	return err
}

// downloadDir copies the tree at src in sb to dst ("-" is w, as a tar
// archive), like cp -r.
func downloadDir(ctx context.Context, sb *dsec.Sandbox, src, dst string, w io.Writer) error {
	if dst == "-" {
		return sb.DownloadTar(ctx, src, w)
	}
	target := dst
	base := path.Base(path.Clean(src))
	st, err := os.Stat(dst)
	switch {
	case err == nil && !st.IsDir():
		return fmt.Errorf("%s exists and is not a directory", dst)
	case err == nil && !contentsOnly(src) && base != "/":
		target = filepath.Join(dst, base)
	case errors.Is(err, fs.ErrNotExist):
		// DST becomes the copy; its parent must exist, as with cp.
		if _, err := os.Stat(filepath.Dir(filepath.Clean(dst))); err != nil {
			return err
		}
	case err != nil:
		return err
	}
	return sb.DownloadDir(ctx, src, target)
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
