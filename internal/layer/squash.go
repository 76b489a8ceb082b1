package layer

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"
	"time"

	"github.com/erofs/go-erofs"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// Squash writes to out one EROFS layer equivalent to the given consecutive
// layers (lowest first) stacked as overlayfs stacks them: for any layers
// below them, below + Squash(layers) shows the same tree as below +
// layers. So whiteouts and opaque directories that hide what lies below
// the squashed run are kept; those that only hide what the run itself held
// are applied and dropped:
//   - a whiteout removes the path from what the lower layers of the run
//     gave, and stays as a whiteout;
//   - an opaque directory drops what the run gave below it, and stays
//     opaque;
//   - a directory over a whiteout or a non-directory of the run becomes
//     opaque (it hid everything below it);
//   - a directory over a directory takes the upper one's metadata and keeps
//     the lower one's entries (and its opacity);
//   - anything else replaces what the run gave at its path, with its
//     subtree.
//
// Hard links between files become separate files. The result is built
// like BuildFromTar's, with Options.KeepWhiteouts set.
func Squash(ctx context.Context, layers []io.ReaderAt, out io.WriteSeeker, opts Options) (Info, error) {
	if len(layers) == 0 {
		return Info{}, errdefs.Newf(errdefs.ErrInvalidArgument, "squash: no layers")
	}
	m := &squashTree{entries: map[string]*squashEntry{}}
	for i, r := range layers {
		fsys, err := erofs.Open(r)
		if err != nil {
			return Info{}, errdefs.Newf(errdefs.ErrInvalidArgument, "squash: layer %d is not a valid EROFS image: %v", i+1, err)
		}
		if err := m.add(ctx, fsys); err != nil {
			return Info{}, fmt.Errorf("squash: layer %d: %w", i+1, err)
		}
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := m.writeTar(ctx, pw)
		pw.CloseWithError(err)
		done <- err
	}()
	opts.KeepWhiteouts = true
	info, err := BuildFromTar(ctx, pr, out, opts)
	pr.CloseWithError(io.ErrClosedPipe)
	werr := <-done
	if err != nil {
		return Info{}, err
	}
	if werr != nil {
		return Info{}, fmt.Errorf("squash: %w", werr)
	}
	return info, nil
}

type squashEntry struct {
	fsys     fs.FS
	name     string // in fsys; "." for the root
	info     fs.FileInfo
	whiteout bool
	opaque   bool
}

type squashTree struct {
	entries map[string]*squashEntry
}

func isDir(e *squashEntry) bool { return e != nil && !e.whiteout && e.info.IsDir() }

// removeBelow removes every entry under p (not p itself).
func (m *squashTree) removeBelow(p string) {
	prefix := p + "/"
	if p == "." {
		prefix = ""
	}
	for k := range m.entries {
		if k != "." && k != p && strings.HasPrefix(k, prefix) {
			delete(m.entries, k)
		}
	}
}

func (m *squashTree) add(ctx context.Context, fsys fs.FS) error {
	return fs.WalkDir(fsys, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, _ := info.Sys().(*erofs.Stat)
		e := &squashEntry{fsys: fsys, name: name, info: info}
		if info.Mode()&fs.ModeCharDevice != 0 && st != nil && st.Rdev == 0 {
			e.whiteout = true
		}
		if info.IsDir() && st != nil && st.Xattrs[OpaqueXattr] == "y" {
			e.opaque = true
		}
		old := m.entries[name]
		switch {
		case e.whiteout:
			m.removeBelow(name)
		case info.IsDir() && e.opaque:
			m.removeBelow(name)
		case info.IsDir() && isDir(old):
			e.opaque = old.opaque
		case info.IsDir() && old != nil:
			// Over a whiteout or a file of the run: it hid all below.
			e.opaque = name != "."
		default:
			m.removeBelow(name)
		}
		m.entries[name] = e
		return nil
	})
}

// writeTar writes the merged tree as a tar stream, parents first.
func (m *squashTree) writeTar(ctx context.Context, w io.Writer) error {
	names := make([]string, 0, len(m.entries))
	for n := range m.entries {
		names = append(names, n)
	}
	// Sort by path components, so a directory comes right before its
	// entries.
	slices.SortFunc(names, func(a, b string) int {
		return slices.Compare(strings.Split(a, "/"), strings.Split(b, "/"))
	})
	tw := tar.NewWriter(w)
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		e := m.entries[n]
		if err := writeEntry(tw, n, e); err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
	}
	return tw.Close()
}

func writeEntry(tw *tar.Writer, name string, e *squashEntry) error {
	st, _ := e.info.Sys().(*erofs.Stat)
	hdr := &tar.Header{
		Name:    name,
		Mode:    int64(e.info.Mode().Perm()),
		ModTime: e.info.ModTime(),
		Format:  tar.FormatPAX,
	}
	if name == "." {
		hdr.Name = "./"
	}
	if m := e.info.Mode(); m&fs.ModeSetuid != 0 {
		hdr.Mode |= 0o4000
	}
	if m := e.info.Mode(); m&fs.ModeSetgid != 0 {
		hdr.Mode |= 0o2000
	}
	if m := e.info.Mode(); m&fs.ModeSticky != 0 {
		hdr.Mode |= 0o1000
	}
	if st != nil {
		hdr.Uid, hdr.Gid = int(st.UID), int(st.GID)
		for k, v := range st.Xattrs {
			if k == OpaqueXattr {
				continue
			}
			if hdr.PAXRecords == nil {
				hdr.PAXRecords = map[string]string{}
			}
			hdr.PAXRecords["SCHILY.xattr."+k] = v
		}
	}
	var data fs.File
	switch mode := e.info.Mode(); {
	case e.whiteout:
		hdr.Typeflag = tar.TypeChar
	case mode.IsDir():
		hdr.Typeflag = tar.TypeDir
		if e.opaque {
			if hdr.PAXRecords == nil {
				hdr.PAXRecords = map[string]string{}
			}
			hdr.PAXRecords["SCHILY.xattr."+OpaqueXattr] = "y"
		}
	case mode&fs.ModeSymlink != 0:
		hdr.Typeflag = tar.TypeSymlink
		target, err := fs.ReadLink(e.fsys, e.name)
		if err != nil {
			return err
		}
		hdr.Linkname = target
	case mode.IsRegular():
		hdr.Typeflag = tar.TypeReg
		hdr.Size = e.info.Size()
		f, err := e.fsys.Open(e.name)
		if err != nil {
			return err
		}
		defer f.Close()
		data = f
	case mode&fs.ModeNamedPipe != 0:
		hdr.Typeflag = tar.TypeFifo
	default:
		return nil // devices and sockets never enter a layer
	}
	if hdr.ModTime.IsZero() {
		hdr.ModTime = time.Unix(0, 0)
	}
	if hdr.Typeflag == tar.TypeDir && name != "." {
		hdr.Name += "/"
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if data != nil {
		if _, err := io.Copy(tw, data); err != nil {
			return err
		}
	}
	return nil
}
