package dsec

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/sparse"
)

// TarStats counts what UploadTar extracted: regular files (and fifos),
// directories, symbolic and hard links, and bytes of file data.
type TarStats struct {
	Files, Dirs, Links, Bytes int64
}

// DownloadTar writes the file or directory tree at path in the sandbox to w
// as a tar archive, as it streams in. Entries are named relative to path
// (see DownloadDir).
func (s *Sandbox) DownloadTar(ctx context.Context, path string, w io.Writer) error {
	if err := s.check(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := s.c.sandboxes.DownloadTar(ctx, connect.NewRequest(&sandboxv1.DownloadTarRequest{SandboxId: s.ID, Path: path}))
	if err != nil {
		return s.c.err(err)
	}
	defer stream.Close()
	for stream.Receive() {
		if _, err := w.Write(stream.Msg().GetData()); err != nil {
			return fmt.Errorf("download %s from sandbox %s: %w", path, s.ID, err)
		}
	}
	return s.c.err(stream.Err())
}

// UploadTar extracts the tar archive r yields into the directory dir of the
// sandbox, streamed in chunks of at most 1 MiB. The server refuses a bad
// archive (names or links that leave dir, devices) before it writes
// anything. Owners recorded in the archive are ignored: everything belongs
// to root, or WithOwner's user; WithMakeParents creates dir. If reading r
// fails, the upload is abandoned.
func (s *Sandbox) UploadTar(ctx context.Context, dir string, r io.Reader, opts ...FileOption) (TarStats, error) {
	if err := s.check(); err != nil {
		return TarStats{}, err
	}
	var fo fileOptions
	for _, o := range opts {
		o(&fo)
	}
	header := &sandboxv1.UploadTarHeader{SandboxId: s.ID, Path: dir, MakeParents: fo.makeParents, User: fo.owner}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream := s.c.sandboxes.UploadTar(ctx)
	resp, err := sendChunks(stream, cancel,
		&sandboxv1.UploadTarRequest{Msg: &sandboxv1.UploadTarRequest_Header{Header: header}},
		r, func(b []byte) *sandboxv1.UploadTarRequest {
			return &sandboxv1.UploadTarRequest{Msg: &sandboxv1.UploadTarRequest_Data{Data: b}}
		})
	if err != nil {
		var re *readError
		if errors.As(err, &re) {
			return TarStats{}, fmt.Errorf("upload archive to %s in sandbox %s: %w", dir, s.ID, re.err)
		}
		return TarStats{}, s.c.err(err)
	}
	m := resp.Msg
	return TarStats{Files: m.GetFiles(), Dirs: m.GetDirs(), Links: m.GetLinks(), Bytes: m.GetBytes()}, nil
}

// UploadDir copies the local directory tree localDir into the directory
// remoteDir of the sandbox: localDir's entries become remoteDir's. It walks
// the tree and streams it as a tar archive while it reads it: regular files,
// directories and symbolic links as they are (a link's target is not
// followed or checked), with their permission bits and modification times;
// hard links arrive as separate copies and other files (devices, fifos,
// sockets) are left out. A file with holes travels as a sparse entry, its
// data only, and is sparse in the sandbox too. Options are those of
// UploadTar; WithMakeParents creates remoteDir, and WithMaxSize bounds the
// apparent size of the files sent (a *SizeLimitError, before the file over
// it is sent).
func (s *Sandbox) UploadDir(ctx context.Context, localDir, remoteDir string, opts ...FileOption) (TarStats, error) {
	if err := s.check(); err != nil {
		return TarStats{}, err
	}
	var fo fileOptions
	for _, o := range opts {
		o(&fo)
	}
	root, err := os.OpenRoot(localDir)
	if err != nil {
		return TarStats{}, fmt.Errorf("upload %s: %w", localDir, err)
	}
	defer root.Close()
	pr, pw := io.Pipe()
	walked := make(chan error, 1)
	go func() {
		err := writeTar(ctx, root, pw, fo.maxSize)
		pw.CloseWithError(err)
		walked <- err
	}()
	st, err := s.UploadTar(ctx, remoteDir, pr, opts...)
	// Unblock the walk if the upload ended before reading it all.
	pr.CloseWithError(errUploadEnded)
	werr := <-walked
	var sle *SizeLimitError
	if errors.As(werr, &sle) {
		return TarStats{}, sle // the upload was abandoned for it
	}
	if err != nil {
		return TarStats{}, err
	}
	if werr != nil {
		// The upload read the whole archive, so this cannot happen; say so
		// rather than report success.
		return TarStats{}, fmt.Errorf("upload %s: %w", localDir, werr)
	}
	return st, nil
}

// errUploadEnded stops UploadDir's walk once the upload is over.
var errUploadEnded = errors.New("the upload ended")

// writeTar writes the tree of root to w as a tar archive, names relative
// to root, without an entry for root itself; maxSize (0: none) bounds the
// apparent size of its files.
func writeTar(ctx context.Context, root *os.Root, w io.Writer, maxSize int64) error {
	tw := sparse.NewWriter(w)
	var total int64
	err := fs.WalkDir(root.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if name == "." {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr := &tar.Header{
			Name:    name,
			Mode:    int64(unixMode(info.Mode())),
			ModTime: info.ModTime(),
		}
		switch mode := info.Mode(); {
		case mode.IsDir():
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
		case mode.IsRegular():
			hdr.Typeflag = tar.TypeReg
			hdr.Size = info.Size()
			if maxSize > 0 && hdr.Size > maxSize-total {
				return &SizeLimitError{Path: name, Size: hdr.Size, Limit: maxSize}
			}
			total += hdr.Size
			return copyFile(ctx, root, name, hdr, tw)
		case mode&fs.ModeSymlink != 0:
			target, err := root.Readlink(filepath.FromSlash(name))
			if err != nil {
				return err
			}
			hdr.Typeflag = tar.TypeSymlink
			hdr.Linkname = filepath.ToSlash(target)
		default:
			return nil // devices, fifos and sockets are left out
		}
		return tw.WriteHeader(hdr)
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// copyFile writes root's regular file name, described by hdr, to tw: as a
// sparse entry when it has holes.
func copyFile(ctx context.Context, root *os.Root, name string, hdr *tar.Header, tw *sparse.Writer) error {
	f, err := root.Open(filepath.FromSlash(name))
	if err != nil {
		return err
	}
	defer f.Close()
	segs, err := sparse.Segments(f, hdr.Size)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if sparse.Holey(segs, hdr.Size) {
		return tw.WriteSparse(ctx, hdr, f, segs)
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.Copy(tw, io.NewSectionReader(f, 0, hdr.Size)) // Segments moved the offset
	if err != nil {
		return err
	}
	if n != hdr.Size {
		return fmt.Errorf("%s shrank from %d to %d bytes while being read", name, hdr.Size, n)
	}
	return nil
}

// SizeLimitError is the error of a copy refused by WithMaxSize: the file
// at Path (relative to the copy's root) would have taken the files copied
// past Limit bytes; it is Size bytes, holes included. Nothing of it was
// sent or written.
type SizeLimitError struct {
	Path        string
	Size, Limit int64
}

func (e *SizeLimitError) Error() string {
	return fmt.Sprintf("%s is %d bytes (apparent size, holes included): the copy would pass its limit of %d bytes; nothing of it was copied", e.Path, e.Size, e.Limit)
}

// Unwrap makes a SizeLimitError an ErrResourceExhausted.
func (e *SizeLimitError) Unwrap() error { return ErrResourceExhausted }

// DownloadDir copies the tree at remotePath in the sandbox into the local
// directory localDir (created if missing): remotePath's entries become
// localDir's, and a file at remotePath lands in localDir under its name.
//
// The archive comes from a server that reads an untrusted sandbox, so it is
// extracted defensively, through an os.Root of localDir: names that are
// absolute or contain .., paths through symlinks that lead out of localDir,
// and device entries are errors, and nothing is written outside localDir.
// Symlinks are created as they are (even absolute ones: they are links in
// localDir, never followed while extracting). Permission bits are kept
// without setuid, setgid and sticky bits; owners are not (files belong to
// the caller); fifos are left out. Sparse files stay sparse: their holes,
// and every run of whole zero blocks, are holes in localDir. WithMaxSize
// bounds the apparent size of the files written: the file that would pass
// it is refused with a *SizeLimitError before any of it is written. An
// error may leave part of the tree extracted.
//
// Entries are named relative to remotePath. An archive whose first entry
// is a directory named like remotePath's last element (the layout of
// `docker cp`) is taken to be rooted there, and that element is stripped.
func (s *Sandbox) DownloadDir(ctx context.Context, remotePath, localDir string, opts ...FileOption) error {
	if err := s.check(); err != nil {
		return err
	}
	var fo fileOptions
	for _, o := range opts {
		o(&fo)
	}
	if err := os.MkdirAll(localDir, 0o755); err != nil {
		return fmt.Errorf("download %s: %w", remotePath, err)
	}
	root, err := os.OpenRoot(localDir)
	if err != nil {
		return fmt.Errorf("download %s: %w", remotePath, err)
	}
	defer root.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := s.c.sandboxes.DownloadTar(ctx, connect.NewRequest(&sandboxv1.DownloadTarRequest{SandboxId: s.ID, Path: remotePath}))
	if err != nil {
		return s.c.err(err)
	}
	defer stream.Close()
	r := &tarStream{c: s.c, stream: stream}
	if err := extractTar(root, r, path.Base(path.Clean("/"+remotePath)), fo.maxSize); err != nil {
		var sle *SizeLimitError
		if errors.As(err, &sle) {
			return sle
		}
		return fmt.Errorf("download %s from sandbox %s to %s: %w", remotePath, s.ID, localDir, err)
	}
	// The end of the archive may not be the end of the stream: an error
	// can follow it.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return err
	}
	return nil
}

// tarStream reads the data of a DownloadTar stream.
type tarStream struct {
	c      *Client
	stream *connect.ServerStreamForClient[sandboxv1.DownloadTarResponse]
	buf    []byte
	err    error
}

func (t *tarStream) Read(p []byte) (int, error) {
	for len(t.buf) == 0 {
		if t.err != nil {
			return 0, t.err
		}
		if t.stream.Receive() {
			t.buf = t.stream.Msg().GetData()
			continue
		}
		t.err = io.EOF
		if err := t.stream.Err(); err != nil {
			t.err = t.c.err(err)
		}
	}
	n := copy(p, t.buf)
	t.buf = t.buf[n:]
	return n, nil
}

// dirMeta is what extractTar applies to a directory once its entries are
// in: its permissions may forbid writing them.
type dirMeta struct {
	name    string
	perm    fs.FileMode
	modTime time.Time
}

// extractTar extracts the archive r yields into root (see DownloadDir).
// base is the last element of the path the archive was made from; maxSize
// (0: none) bounds the apparent size of the files written.
func extractTar(root *os.Root, r io.Reader, base string, maxSize int64) error {
	tr := tar.NewReader(r)
	var dirs []dirMeta
	var total int64
	strip := ""
	for first := true; ; first = false {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		name, err := entryName(hdr.Name)
		if err != nil {
			return err
		}
		if first && hdr.Typeflag == tar.TypeDir && name == base && base != "." && base != "/" {
			strip = base
		}
		if name, err = stripName(name, strip, hdr.Name); err != nil {
			return err
		}
		if name == "." {
			continue // the directory itself: localDir is left as it is
		}
		osName := filepath.FromSlash(name)
		perm := fs.FileMode(hdr.Mode) & fs.ModePerm
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(osName, 0o700); err != nil {
				return err
			}
			dirs = append(dirs, dirMeta{name: osName, perm: perm, modTime: hdr.ModTime})
		case tar.TypeReg:
			// hdr.Size is the apparent size: a sparse entry's holes count.
			if hdr.Size < 0 || maxSize > 0 && hdr.Size > maxSize-total {
				return &SizeLimitError{Path: name, Size: hdr.Size, Limit: maxSize}
			}
			total += hdr.Size
			if err := makeRoom(root, name); err != nil {
				return err
			}
			if err := extractFile(root, osName, tr, perm); err != nil {
				return err
			}
			if err := root.Chtimes(osName, time.Time{}, hdr.ModTime); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if hdr.Linkname == "" || strings.IndexByte(hdr.Linkname, 0) >= 0 {
				return fmt.Errorf("symlink %q has an invalid target", hdr.Name)
			}
			if err := makeRoom(root, name); err != nil {
				return err
			}
			if err := root.Symlink(hdr.Linkname, osName); err != nil {
				return err
			}
		case tar.TypeLink:
			target, err := entryName(hdr.Linkname)
			if err == nil {
				target, err = stripName(target, strip, hdr.Linkname)
			}
			if err != nil || target == "." {
				return fmt.Errorf("hard link %q: bad target %q", hdr.Name, hdr.Linkname)
			}
			if err := makeRoom(root, name); err != nil {
				return err
			}
			if err := root.Link(filepath.FromSlash(target), osName); err != nil {
				return err
			}
		case tar.TypeChar, tar.TypeBlock:
			return fmt.Errorf("entry %q is a device: devices are not extracted", hdr.Name)
		default:
			// Fifos, old GNU sparse entries (type 'S', which a sandbox's
			// server does not send; its sparse entries are regular files
			// with PAX records) and types this version does not know are
			// left out.
		}
	}
	// Deepest last: a parent's times change when its entries do.
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		if err := root.Chmod(d.name, d.perm); err != nil {
			return err
		}
		if err := root.Chtimes(d.name, time.Time{}, d.modTime); err != nil {
			return err
		}
	}
	return nil
}

// extractFile creates the regular file name (which does not exist) with
// the data of tr.
func extractFile(root *os.Root, name string, tr io.Reader, perm fs.FileMode) error {
	// O_EXCL: never through a symlink that appeared since makeRoom.
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := sparse.Copy(f, tr); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// entryName checks an archive entry's name and returns it cleaned, in slash
// form, "." for the archive's root.
func entryName(n string) (string, error) {
	if n == "" || strings.IndexByte(n, 0) >= 0 {
		return "", fmt.Errorf("entry %q: invalid name", n)
	}
	if strings.HasPrefix(n, "/") {
		return "", fmt.Errorf("entry %q: absolute name", n)
	}
	for _, el := range strings.Split(n, "/") {
		if el == ".." {
			return "", fmt.Errorf("entry %q: a .. element leaves the directory", n)
		}
	}
	clean := path.Clean(n)
	if clean != "." && !filepath.IsLocal(filepath.FromSlash(clean)) {
		return "", fmt.Errorf("entry %q: not a local name", n)
	}
	return clean, nil
}

// stripName removes the leading element strip from name ("" strips
// nothing); orig names the entry in errors.
func stripName(name, strip, orig string) (string, error) {
	switch {
	case strip == "":
		return name, nil
	case name == strip:
		return ".", nil
	case strings.HasPrefix(name, strip+"/"):
		return name[len(strip)+1:], nil
	}
	return "", fmt.Errorf("entry %q is outside the archive's directory %s", orig, strip)
}

// makeRoom creates the parents of name and removes what is at name unless
// it is a directory (which is an error: the archive does not replace
// trees).
func makeRoom(root *os.Root, name string) error {
	if dir := path.Dir(name); dir != "." {
		if err := root.MkdirAll(filepath.FromSlash(dir), 0o755); err != nil {
			return err
		}
	}
	osName := filepath.FromSlash(name)
	fi, err := root.Lstat(osName)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case fi.IsDir():
		return fmt.Errorf("%s: a directory is in the way", name)
	}
	return root.Remove(osName)
}
