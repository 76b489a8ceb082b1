//go:build linux

package harness

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/dsecproject/dsec/internal/testenv"
)

// Busybox makes the busybox root file system every system of a benchmark
// runs, with the repository's scripts/busybox-rootfs.sh.
func Busybox(ctx context.Context, dir string) error {
	script := filepath.Join(testenv.ModuleRoot(), "scripts", "busybox-rootfs.sh")
	if out, err := exec.CommandContext(ctx, script, dir).CombinedOutput(); err != nil {
		return fmt.Errorf("busybox rootfs: %w: %s", err, out)
	}
	return nil
}

// ShiftedCopy copies the tree src to dst with every owner moved up by
// hostID, so that a container whose user namespace maps 0 to hostID sees
// the files as their original owners: what dsec's idmapped layers show.
func ShiftedCopy(ctx context.Context, src, dst string, hostID uint32) error {
	if out, err := exec.CommandContext(ctx, "cp", "-a", src, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("copy rootfs: %w: %s", err, out)
	}
	err := filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no owner", p)
		}
		if err := os.Lchown(p, int(hostID+st.Uid), int(hostID+st.Gid)); err != nil {
			return err
		}
		// chown clears set-id bits: put them back (not on symlinks).
		if info.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 && info.Mode()&fs.ModeSymlink == 0 {
			return os.Chmod(p, info.Mode())
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("shift rootfs owners: %w", err)
	}
	return nil
}
