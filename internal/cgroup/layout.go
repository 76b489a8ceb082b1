package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// Mode is how a host mounts its cgroup hierarchies.
type Mode int

// The modes. The zero Mode is unknown: a Config with it detects the layout.
const (
	// V1 hosts mount only cgroup v1 hierarchies, one per controller or per
	// set of co-mounted controllers.
	V1 Mode = iota + 1
	// Hybrid hosts mount v1 hierarchies for the controllers and a cgroup2
	// hierarchy beside them (systemd's "hybrid" mode).
	Hybrid
	// Unified hosts mount only the cgroup2 hierarchy.
	Unified
)

func (m Mode) String() string {
	switch m {
	case V1:
		return "v1"
	case Hybrid:
		return "hybrid"
	case Unified:
		return "unified"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Layout is where a host mounts its cgroup hierarchies.
type Layout struct {
	Mode Mode
	// V1 maps each mounted v1 controller ("cpu", "memory", ...) to the
	// mountpoint of its hierarchy; co-mounted controllers share one.
	// Named hierarchies (name=systemd) are not controllers and not listed.
	V1 map[string]string
	// Unified is the cgroup2 mountpoint, "" when there is none.
	Unified string
	// UnifiedControllers are the controllers the cgroup2 root offers (its
	// cgroup.controllers), in the kernel's order.
	UnifiedControllers []string
}

// v1Controllers are the controllers cgroup v1 knows; other words in a
// cgroup mount's options (rw, xattr, name=..., release_agent=...) are not
// controllers.
var v1Controllers = map[string]bool{
	"blkio": true, "cpu": true, "cpuacct": true, "cpuset": true, "debug": true,
	"devices": true, "freezer": true, "hugetlb": true, "memory": true,
	"misc": true, "net_cls": true, "net_prio": true, "perf_event": true,
	"pids": true, "rdma": true,
}

// maxMountinfoLine bounds one line of mountinfo (overlay options can be long).
const maxMountinfoLine = 1 << 20

// ParseMountinfo reads a mount table in the format of /proc/self/mountinfo
// and returns the cgroup hierarchies it mounts. A mount hidden by a later
// mount on the same or an enclosing directory is ignored; of two visible
// mounts of one controller the first counts. UnifiedControllers is left
// empty (the mount table does not list them). It fails with
// ErrInvalidArgument on a malformed line and ErrFailedPrecondition when
// no cgroup hierarchy is mounted.
func ParseMountinfo(r io.Reader) (Layout, error) {
	type cgmount struct {
		index  int      // in mountpoints
		v2     bool     // a cgroup2 mount
		ctrls  []string // v1 controllers
		target string
	}
	var (
		mountpoints []string
		cgmounts    []cgmount
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxMountinfoLine)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		target, fstype, opts, err := parseMountinfoLine(line)
		if err != nil {
			return Layout{}, errdefs.Newf(errdefs.ErrInvalidArgument, "mountinfo line %d: %v", n, err)
		}
		mountpoints = append(mountpoints, target)
		switch fstype {
		case "cgroup2":
			cgmounts = append(cgmounts, cgmount{index: len(mountpoints) - 1, v2: true, target: target})
		case "cgroup":
			var ctrls []string
			for o := range strings.SplitSeq(opts, ",") {
				if v1Controllers[o] {
					ctrls = append(ctrls, o)
				}
			}
			if len(ctrls) > 0 {
				cgmounts = append(cgmounts, cgmount{index: len(mountpoints) - 1, ctrls: ctrls, target: target})
			}
		}
	}
	if err := sc.Err(); err != nil {
		return Layout{}, errdefs.Newf(errdefs.ErrInvalidArgument, "read mountinfo: %v", err)
	}

	var l Layout
	for _, c := range cgmounts {
		if hidden(c.target, mountpoints[c.index+1:]) {
			continue
		}
		if c.v2 {
			if l.Unified == "" {
				l.Unified = c.target
			}
			continue
		}
		for _, ctrl := range c.ctrls {
			if _, ok := l.V1[ctrl]; !ok {
				if l.V1 == nil {
					l.V1 = make(map[string]string)
				}
				l.V1[ctrl] = c.target
			}
		}
	}
	if err := l.setMode(); err != nil {
		return Layout{}, err
	}
	return l, nil
}

// parseMountinfoLine returns the mountpoint, file-system type and super
// options of one mountinfo line:
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
func parseMountinfoLine(line string) (target, fstype, superOpts string, err error) {
	f := strings.Fields(line)
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if sep < 0 || len(f) < sep+4 {
		return "", "", "", errors.New("want 6 fields, optional fields, \"-\" and 3 fields")
	}
	target = unescapeOctal(f[4])
	if !strings.HasPrefix(target, "/") {
		return "", "", "", fmt.Errorf("mountpoint %q is not absolute", target)
	}
	return path.Clean(target), f[sep+1], f[sep+3], nil
}

// unescapeOctal undoes the kernel's \ooo escapes (of space, tab, newline
// and backslash) in a mountinfo field.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			v := (s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0')
			b.WriteByte(v)
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// hidden reports whether a mount on target is hidden by one of later, the
// mountpoints of the mounts made after it.
func hidden(target string, later []string) bool {
	for _, m := range later {
		if m == target || m == "/" || strings.HasPrefix(target, m+"/") {
			return true
		}
	}
	return false
}

// setMode derives l.Mode from the hierarchies l has.
func (l *Layout) setMode() error {
	switch {
	case len(l.V1) > 0 && l.Unified != "":
		l.Mode = Hybrid
	case len(l.V1) > 0:
		l.Mode = V1
	case l.Unified != "":
		l.Mode = Unified
	default:
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "no cgroup hierarchy is mounted")
	}
	return nil
}

// LayoutAt builds the Layout of a directory laid out like /sys/fs/cgroup:
// either root is a cgroup2 hierarchy (it has cgroup.controllers), or each
// subdirectory with a cgroup.procs is a hierarchy, v2 when it has
// cgroup.controllers and otherwise v1 carrying the controllers its name
// lists ("cpu,cpuacct"). Symbolic links are not followed. It serves tests
// and hosts whose mount table cannot be read.
func LayoutAt(root string) (Layout, error) {
	var l Layout
	if exists(filepath.Join(root, "cgroup.controllers")) {
		l.Unified = root
	} else {
		ents, err := os.ReadDir(root)
		if err != nil {
			return Layout{}, fmt.Errorf("read cgroup root: %w", classify(err))
		}
		for _, e := range ents {
			dir := filepath.Join(root, e.Name())
			switch {
			case !e.IsDir() || !exists(filepath.Join(dir, "cgroup.procs")):
			case exists(filepath.Join(dir, "cgroup.controllers")):
				if l.Unified == "" {
					l.Unified = dir
				}
			default:
				for c := range strings.SplitSeq(e.Name(), ",") {
					if _, ok := l.V1[c]; v1Controllers[c] && !ok {
						if l.V1 == nil {
							l.V1 = make(map[string]string)
						}
						l.V1[c] = dir
					}
				}
			}
		}
	}
	if err := l.setMode(); err != nil {
		return Layout{}, fmt.Errorf("cgroup root %s: %w", root, err)
	}
	if err := l.readControllers(); err != nil {
		return Layout{}, err
	}
	return l, nil
}

// readControllers fills UnifiedControllers from the cgroup2 root.
func (l *Layout) readControllers() error {
	if l.Unified == "" {
		return nil
	}
	c, err := readControllerList(filepath.Join(l.Unified, "cgroup.controllers"))
	if err != nil {
		return err
	}
	l.UnifiedControllers = c
	return nil
}

// readControllerList reads a space-separated list of controllers.
func readControllerList(file string) ([]string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read controllers: %w", classify(err))
	}
	return strings.Fields(string(b)), nil
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil || !errors.Is(err, fs.ErrNotExist)
}
