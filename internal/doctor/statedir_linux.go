package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// nearestExisting returns the deepest existing directory of the absolute
// path dir (dir itself when it exists) and how many components below it
// are missing.
func nearestExisting(dir string) (string, int, error) {
	missing := 0
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		switch {
		case err == nil && fi.IsDir():
			return p, missing, nil
		case err == nil:
			return "", 0, fmt.Errorf("%s is not a directory", p)
		case !errors.Is(err, fs.ErrNotExist):
			return "", 0, err
		case p == "/":
			return "", 0, err
		}
		missing++
	}
}

// ancestors returns "/" and every directory on the way down to p, p
// excluded.
func ancestors(p string) []string {
	var out []string
	for d := filepath.Dir(p); ; d = filepath.Dir(d) {
		out = append(out, d)
		if d == "/" {
			break
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

func checkStateDir(_ context.Context, env Env) Result {
	dir, err := filepath.Abs(env.StateDir)
	if err != nil {
		return failf("pass --state-dir with an absolute path", "state dir %q: %v", env.StateDir, err)
	}
	existing, missing, err := nearestExisting(dir)
	if err != nil {
		return failf("pass --state-dir with a directory path", "state dir %s: %v", dir, err)
	}
	if err := unix.Access(existing, unix.W_OK); err != nil {
		return failf("pass --state-dir on a writable file system, as root", "%s is not writable: %v", existing, err)
	}
	// Sandbox roots live under the state dir; the runtime mounts them as the
	// sandbox's unprivileged root, which must traverse every directory above
	// (dsec up itself makes the state dir 0711). Symbolic links are followed
	// both ways: the path as given, and where it leads.
	var blocked []string
	seen := map[string]bool{}
	real, err := filepath.EvalSymlinks(existing)
	if err != nil {
		return failf("see the detail", "resolve %s: %v", existing, err)
	}
	check := ancestors(existing)
	if existing != dir {
		check = append(check, existing)
	}
	check = append(check, ancestors(real)...)
	if existing != dir {
		check = append(check, real)
	}
	for _, d := range check {
		if seen[d] {
			continue
		}
		seen[d] = true
		fi, err := os.Stat(d)
		if err != nil {
			return failf("see the detail", "stat %s: %v", d, err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			blocked = append(blocked, fmt.Sprintf("%s (%04o)", d, fi.Mode().Perm()))
		}
	}
	if len(blocked) > 0 {
		var paths []string
		for _, b := range blocked {
			p, _, _ := strings.Cut(b, " (")
			paths = append(paths, p)
		}
		return failf("chmod o+x "+strings.Join(paths, " "),
			"%s cannot be traversed by others: the sandboxes' unprivileged root could not reach their root file systems under %s",
			strings.Join(blocked, ", "), dir)
	}
	switch {
	case missing > 1:
		parent := filepath.Dir(dir)
		return warnf(fmt.Sprintf("mkdir -p -m 0711 %s", parent),
			"%s does not exist, nor does %s: dsec up would create the directories above the state dir without access for others", dir, parent)
	case missing == 1:
		return okf("%s does not exist yet; dsec up creates it (0711) in %s", dir, existing)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return failf("see the detail", "stat %s: %v", dir, err)
	}
	if fi.Mode().Perm()&0o001 == 0 {
		return okf("%s (%04o; dsec up makes it 0711), and every directory above it can be traversed", dir, fi.Mode().Perm())
	}
	return okf("%s (%04o), and every directory above it can be traversed", dir, fi.Mode().Perm())
}

// minFree is the free space under which the disk check warns.
const minFree = 10 << 30

func checkDiskSpace(_ context.Context, env Env) Result {
	dir, err := filepath.Abs(env.StateDir)
	if err != nil {
		return warnf("", "state dir %q: %v", env.StateDir, err)
	}
	existing, _, err := nearestExisting(dir)
	if err != nil {
		return warnf("", "state dir %s: %v", dir, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(existing, &st); err != nil {
		return warnf("", "statfs %s: %v", existing, err)
	}
	return diskResult(existing, fsTypeName(st.Type), st.Bavail*uint64(st.Bsize))
}

func diskResult(dir, fsType string, free uint64) Result {
	what := fmt.Sprintf("%s free for %s (%s): images, layers and sandboxes' writable layers", formatBytes(free), dir, fsType)
	if free < minFree {
		return warnf("free space there, or pass --state-dir on a larger file system", "%s; under %s", what, formatBytes(minFree))
	}
	return okf("%s", what)
}
