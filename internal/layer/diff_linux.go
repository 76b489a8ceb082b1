package layer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// BuildDiff writes to out an EROFS layer holding what the overlayfs upper
// directory upper adds to the layers below it, as BuildFromDir reads a
// tree, with these differences (pack_diff):
//   - whiteouts (character devices 0:0) are kept, so that files deleted in
//     the sandbox stay deleted on the new layer;
//   - a directory marked opaque by overlayfs (trusted.overlay.opaque or
//     user.overlay.opaque = "y") stays opaque as trusted.overlay.opaque,
//     and overlayfs' other private attributes are dropped;
//   - owners are shifted from host ids to the sandbox's ids (see Diff);
//   - d.Scrub paths are left out (see Diff.Scrub).
//
// The upper directory must not change while it is read: the caller
// freezes the sandbox; a file that changes anyway fails the build with
// ErrFailedPrecondition.
func BuildDiff(ctx context.Context, upper string, out io.WriteSeeker, d Diff, opts Options) (Info, error) {
	scrub, err := CleanScrub(d.Scrub)
	if err != nil {
		return Info{}, err
	}
	if d.Size == 0 {
		return Info{}, errdefs.Newf(errdefs.ErrInvalidArgument, "diff of a writable layer: no id range to shift owners from")
	}
	opts.KeepWhiteouts = true
	rootFd, err := unix.Open(upper, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		// upper is a host path, and this message is shown to users.
		return Info{}, errdefs.Newf(errdefs.ErrNotFound, "the sandbox's writable layer is gone; was the sandbox deleted meanwhile?")
	case err != nil:
		return Info{}, fmt.Errorf("open upper directory %s: %w", upper, &os.PathError{Op: "open", Path: upper, Err: err})
	}
	defer unix.Close(rootFd)
	s := &scanner{dir: upper, inSandbox: true, rootFd: rootFd, opts: opts, inodes: map[devIno]*node{}, t: &tree{}}
	var st unix.Stat_t
	if err := unix.Fstat(rootFd, &st); err != nil {
		return Info{}, fmt.Errorf("stat %s: %w", upper, err)
	}
	s.t.root = s.newNode(&st)
	if s.t.root.xattrs, err = s.xattrs(xattrSource{fd: rootFd}, ""); err != nil {
		return Info{}, err
	}
	if err := s.scanDir(ctx, rootFd, "", s.t.root); err != nil {
		return Info{}, err
	}
	s.t.applyDiff(d, scrub)
	return s.t.write(ctx, out, opts)
}
