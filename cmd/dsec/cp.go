package main

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/dsecproject/dsec/api/sparse"
	"github.com/dsecproject/dsec/internal/sandbox"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// defaultMaxCopy is the default of dsec cp --max-size.
const defaultMaxCopy = "10G"

// sandboxPath splits "ID:/path"; ok is false for a local path.
func sandboxPath(s string) (id, p string, ok bool) {
	id, p, found := strings.Cut(s, ":")
	if !found || strings.Contains(id, "/") {
		return "", "", false
	}
	if _, valid := sandbox.NodeOfID(id); !valid {
		return "", "", false
	}
	return id, p, true
}

// badSandboxPath explains why s, which looks like ID:/path (a colon before
// any slash, then an absolute path), is not one: its ID is not a sandbox
// ID. It returns nil for a valid ID:/path and for what is not meant as one.
func badSandboxPath(what, s string) error {
	id, p, found := strings.Cut(s, ":")
	if !found || strings.Contains(id, "/") || !strings.HasPrefix(p, "/") {
		return nil
	}
	if _, valid := sandbox.NodeOfID(id); valid {
		return nil
	}
	why := fmt.Sprintf("%q is not a sandbox ID", id)
	if id == "" {
		why = "the sandbox ID before the colon is empty"
	}
	return usageErrorf("%s %q: %s; IDs look like node1-k2m7xq4tb5za (the node's name, a dash and 12 letters a-z or digits 2-7, at most 63 characters), as dsec ps lists them (a local path with a colon: write ./%s)",
		what, s, why, s)
}

func newCpCmd(g *globalFlags) *cobra.Command {
	var mode, maxSize string
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and directories between the local machine and a sandbox",
		Long: `Copy a file or a directory tree into or out of a sandbox. One side is ID:/path
in the sandbox, the other a local path, or - for standard input or output.

Files: into a sandbox, missing parent directories are created and a DST
ending in / receives the file under its own name; out of one, an existing
local directory as DST receives it under its own name, and a partial copy
never replaces DST: it is written to an unnamed temporary file, and nothing
of it is left when the copy fails or is interrupted (Ctrl-C, SIGTERM, even
SIGKILL where the file system has O_TMPFILE).

Directories are copied as tar streams, like cp -r: when DST is an existing
directory the tree lands inside it under its own name, otherwise DST becomes
the copy; SRC ending in /. copies the directory's contents instead. Regular
files, directories and symlinks are copied with their permission bits and
times; owners are not (files in a sandbox belong to its root, files here to
you). Out of a sandbox, entries that would land outside DST are refused.
ID:/dir to - writes the tar archive to standard output.

Sparse files stay sparse both ways: only their data travels (found with
SEEK_DATA/SEEK_HOLE, carried as PAX GNU sparse entries), and their holes, as
well as runs of zero blocks, are holes at the other end. A 20G file made with
truncate copies in an instant and takes no disk space here.

--max-size bounds what one copy writes here, or sends into a sandbox: the
apparent size of the files (holes included) added up. A file that would pass
it is refused, naming the flag, before any of it is written or sent.`,
		Example: `  dsec cp ./script.py ID:/work/script.py
  dsec cp ID:/work/out.json ./out.json
  dsec cp ./project ID:/work          # makes /work/project
  dsec cp ID:/work/results ./results
  dsec cp --max-size 50G ID:/data/disk.img ./disk.img
  dsec cp ID:/etc/os-release -`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcID, srcPath, srcRemote := sandboxPath(args[0])
			dstID, dstPath, dstRemote := sandboxPath(args[1])
			for i, what := range []string{"SRC", "DST"} {
				if err := badSandboxPath(what, args[i]); err != nil {
					return err
				}
			}
			switch {
			case srcRemote && dstRemote:
				return usageErrorf("SRC and DST are both in sandboxes: one must be a local path or - (copy through a local directory)")
			case !srcRemote && !dstRemote:
				return usageErrorf("neither SRC nor DST is in a sandbox: one must be ID:/path (a sandbox ID from dsec ps, a colon, a path in it)")
			}
			var fileMode os.FileMode
			if mode != "" {
				m, err := parseMode("--mode", mode)
				if err != nil {
					return err
				}
				fileMode = m
			}
			limit, err := dsec.ParseSize(maxSize)
			if err != nil || limit <= 0 {
				return usageErrorf("--max-size %q: want a size such as 10G", maxSize)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			// A signal cancels the copy, which then removes what it made.
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
			defer stop()
			err = runCp(ctx, c, cpArgs{
				src: args[0], dst: args[1], srcID: srcID, srcPath: srcPath, dstID: dstID, dstPath: dstPath,
				srcRemote: srcRemote, mode: fileMode, modeSet: mode != "", maxSize: limit,
				stdin: cmd.InOrStdin(), stdout: cmd.OutOrStdout(),
			})
			if ctx.Err() != nil && cmd.Context().Err() == nil {
				return errors.New("cp interrupted; nothing of the partial copy was kept")
			}
			return limitError(err)
		},
	}
	cmd.Flags().StringVar(&mode, "mode", "", "permission bits in octal of a file copied into a sandbox (default: the local file's, or 0644; a sparse file is sent without setuid and setgid)")
	cmd.Flags().StringVar(&maxSize, "max-size", defaultMaxCopy, "most bytes one copy may write here or send into a sandbox: the apparent size of its files, holes of sparse files included, added up; a file that would pass it is refused before any of it is copied")
	return cmd
}

type cpArgs struct {
	src, dst       string
	srcID, srcPath string
	dstID, dstPath string
	srcRemote      bool
	mode           os.FileMode
	modeSet        bool
	maxSize        int64
	stdin          io.Reader
	stdout         io.Writer
}

func runCp(ctx context.Context, c *dsec.Client, a cpArgs) error {
	if a.srcRemote {
		sb := c.Sandbox(a.srcID)
		info, err := sb.Stat(ctx, a.srcPath)
		if err != nil {
			return err
		}
		if info.IsDir {
			return downloadDir(ctx, sb, a.srcPath, a.dst, a.stdout, a.maxSize)
		}
		return download(ctx, sb, a.srcPath, info, a.dst, a.stdout, a.maxSize)
	}
	sb := c.Sandbox(a.dstID)
	if a.src != "-" {
		st, err := os.Stat(a.src)
		if err != nil {
			return err
		}
		if st.IsDir() {
			if a.modeSet {
				return usageErrorf("--mode is for files; a directory's modes are copied as they are")
			}
			return uploadDir(ctx, sb, a.src, a.dstPath, a.maxSize)
		}
	}
	return uploadFile(ctx, sb, a.src, a.dstPath, a.stdin, a.mode, a.maxSize)
}

// limitError says which flag refused a file over --max-size.
func limitError(err error) error {
	var sle *dsec.SizeLimitError
	if errors.As(err, &sle) {
		size := "larger than that"
		if sle.Size > 0 {
			size = dsec.FormatSize(sle.Size) + " (apparent size, holes included)"
		}
		return fmt.Errorf("%s is %s: the copy would write more than --max-size %s; nothing of it was copied: give a larger --max-size to copy it",
			sle.Path, size, dsec.FormatSize(sle.Limit))
	}
	return err
}

// uploadFile copies the local file src ("-" is stdin) to dst in sb. A file
// with holes goes as a one-entry sparse archive, so that only its data
// travels and it is sparse in the sandbox.
func uploadFile(ctx context.Context, sb *dsec.Sandbox, src, dst string, stdin io.Reader, mode os.FileMode, maxSize int64) error {
	opts := []dsec.FileOption{dsec.WithMakeParents()}
	if src == "-" {
		if mode != 0 {
			opts = append(opts, dsec.WithMode(mode))
		}
		lr := &limitReader{r: stdin, n: maxSize, name: "standard input"}
		_, err := sb.Upload(ctx, dst, lr, opts...)
		if lr.over != nil {
			return lr.over
		}
		return err
	}
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() > maxSize {
		return &dsec.SizeLimitError{Path: src, Size: st.Size(), Limit: maxSize}
	}
	if strings.HasSuffix(dst, "/") {
		dst += filepath.Base(src)
	}
	if mode == 0 {
		mode = st.Mode().Perm()
	}
	segs, err := sparse.Segments(f, st.Size())
	if err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	if sparse.Holey(segs, st.Size()) {
		return uploadSparse(ctx, sb, f, st, segs, dst, mode)
	}
	opts = append(opts, dsec.WithMode(mode))
	// Segments moved the file's offset; read it from the start.
	_, err = sb.Upload(ctx, dst, io.NewSectionReader(f, 0, st.Size()), opts...)
	return err
}

// uploadSparse sends f, which has holes, to dst as a one-entry sparse
// archive extracted into dst's directory.
func uploadSparse(ctx context.Context, sb *dsec.Sandbox, f *os.File, st os.FileInfo, segs []sparse.Segment, dst string, mode os.FileMode) error {
	clean := path.Clean("/" + dst)
	dir, base := path.Split(clean)
	if base == "" {
		return usageErrorf("%s:%s names a directory; give the path of a file", sb.ID, dst)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	written := make(chan error, 1)
	go func() {
		tw := sparse.NewWriter(pw)
		hdr := &tar.Header{Name: base, Mode: int64(mode.Perm()), ModTime: st.ModTime(), Size: st.Size()}
		err := tw.WriteSparse(ctx, hdr, f, segs)
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
		written <- err
	}()
	_, err := sb.UploadTar(ctx, dir, pr, dsec.WithMakeParents())
	pr.CloseWithError(errCopyEnded)
	werr := <-written
	if err != nil {
		return err
	}
	var fe *sparse.FileError
	if errors.As(werr, &fe) {
		return fmt.Errorf("read %s: %w", f.Name(), fe.Err)
	}
	return nil
}

// errCopyEnded stops a goroutine feeding a copy that has ended.
var errCopyEnded = errors.New("the copy ended")

// contentsOnly reports whether a copy's source names a directory's
// contents (dir/.) rather than the directory.
func contentsOnly(p string) bool {
	return p == "." || strings.HasSuffix(p, "/.") || strings.HasSuffix(p, string(filepath.Separator)+".")
}

// uploadDir copies the local tree src into sb at dst, like cp -r.
func uploadDir(ctx context.Context, sb *dsec.Sandbox, src, dst string, maxSize int64) error {
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
	_, err := sb.UploadDir(ctx, src, target, dsec.WithMakeParents(), dsec.WithMaxSize(maxSize))
	return err
}

// downloadDir copies the tree at src in sb to dst ("-" is w, as a tar
// archive), like cp -r.
func downloadDir(ctx context.Context, sb *dsec.Sandbox, src, dst string, w io.Writer, maxSize int64) error {
	if dst == "-" {
		// The archive carries sparse files as their data: --max-size
		// bounds what is written, the archive itself.
		lw := &limitWriter{w: w, n: maxSize, name: sb.ID + ":" + src}
		err := sb.DownloadTar(ctx, src, lw)
		if lw.over != nil {
			return lw.over
		}
		return err
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
	return sb.DownloadDir(ctx, src, target, dsec.WithMaxSize(maxSize))
}

// download copies a sandbox file, described by info, to dst ("-" is w),
// atomically: a partial copy never replaces dst, and is never left behind.
func download(ctx context.Context, sb *dsec.Sandbox, src string, info dsec.FileInfo, dst string, w io.Writer, maxSize int64) error {
	name := sb.ID + ":" + src
	if info.Size > maxSize {
		return &dsec.SizeLimitError{Path: name, Size: info.Size, Limit: maxSize}
	}
	if dst == "-" {
		lw := &limitWriter{w: w, n: maxSize, name: name}
		_, err := sb.Download(ctx, src, lw)
		if lw.over != nil {
			return lw.over
		}
		return err
	}
	if st, err := os.Stat(dst); err == nil && st.IsDir() {
		dst = filepath.Join(dst, path.Base(src))
	}
	tmp, err := newTempFile(filepath.Dir(dst))
	if err != nil {
		return err
	}
	defer tmp.discard()
	perm, err := fetchFile(ctx, sb, src, name, tmp.f, maxSize)
	if err != nil {
		return err
	}
	if err := tmp.f.Chmod(perm); err != nil {
		return err
	}
	return tmp.commit(dst)
}

// fetchFile writes the sandbox file src to f, an empty file, with its
// holes, and returns its permission bits. It comes as a one-entry archive
// (a sparse entry when it has holes); when src is a symbolic link, or too
// large for one archive, it comes through ReadFile, whose zero blocks are
// made holes here. name names src in errors.
func fetchFile(ctx context.Context, sb *dsec.Sandbox, src, name string, f *os.File, maxSize int64) (fs.FileMode, error) {
	perm, ok, err := fetchTar(ctx, sb, src, name, f, maxSize)
	if ok || err != nil {
		return perm, err
	}
	if err := f.Truncate(0); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	type result struct {
		info dsec.FileInfo
		err  error
	}
	done := make(chan result, 1)
	go func() {
		info, err := sb.Download(ctx, src, pw)
		pw.CloseWithError(err)
		done <- result{info, err}
	}()
	lr := &limitReader{r: pr, n: maxSize, name: name}
	_, err = sparse.Copy(f, lr)
	pr.CloseWithError(errCopyEnded)
	res := <-done
	switch {
	case lr.over != nil:
		return 0, lr.over
	case res.err != nil:
		return 0, res.err
	case err != nil:
		return 0, err
	}
	return res.info.Mode.Perm(), nil
}

// fetchTar is fetchFile through DownloadTar. ok is false, with no error,
// when the archive does not hold src as a regular file (a symbolic link)
// or the server would not send it as one archive (a file larger than one
// archive may carry): fetchFile then reads it with ReadFile.
func fetchTar(ctx context.Context, sb *dsec.Sandbox, src, name string, f *os.File, maxSize int64) (perm fs.FileMode, ok bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := sb.DownloadTar(ctx, src, pw)
		pw.CloseWithError(err)
		done <- err
	}()
	defer func() {
		pr.CloseWithError(errCopyEnded)
		cancel()
		<-done
	}()
	tr := tar.NewReader(pr)
	hdr, err := tr.Next()
	switch {
	case err != nil && ctx.Err() != nil:
		return 0, false, ctx.Err()
	case err != nil:
		// Larger than one archive may carry (ResourceExhausted), or a
		// server that sends no archive of a file: ReadFile says why, if
		// it fails too.
		return 0, false, nil
	case hdr.Typeflag != tar.TypeReg:
		return 0, false, nil
	case hdr.Size > maxSize:
		return 0, false, &dsec.SizeLimitError{Path: name, Size: hdr.Size, Limit: maxSize}
	}
	n, err := sparse.Copy(f, tr)
	var fe *sparse.FileError
	switch {
	case errors.As(err, &fe):
		return 0, false, fe.Err
	case err != nil:
		return 0, false, fmt.Errorf("download %s: %w", name, err)
	case n != hdr.Size:
		return 0, false, fmt.Errorf("download %s: got %d bytes, want %d", name, n, hdr.Size)
	}
	if _, err := tr.Next(); err != io.EOF {
		return 0, false, fmt.Errorf("download %s: the archive holds more than the file (%v)", name, err)
	}
	// The end of the archive is not the end of the stream: an error may
	// follow it.
	if _, err := io.Copy(io.Discard, pr); err != nil {
		return 0, false, err
	}
	return fs.FileMode(hdr.Mode).Perm(), true, nil
}

// limitWriter passes at most n bytes to w; past them it fails with a
// SizeLimitError, kept in over.
type limitWriter struct {
	w    io.Writer
	n    int64
	name string
	done int64
	over error
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.n-l.done {
		l.over = &dsec.SizeLimitError{Path: l.name, Limit: l.n} // its size is not known
		return 0, l.over
	}
	l.done += int64(len(p))
	return l.w.Write(p)
}

// limitReader yields at most n bytes of r; one more is a SizeLimitError,
// kept in over.
type limitReader struct {
	r    io.Reader
	n    int64
	name string
	done int64
	over error
}

func (l *limitReader) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	l.done += int64(n)
	if l.done > l.n {
		l.over = &dsec.SizeLimitError{Path: l.name, Limit: l.n} // its size is not known
		return 0, l.over
	}
	return n, err
}
