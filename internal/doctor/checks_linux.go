package doctor

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/ceiling"
	"github.com/dsecproject/dsec/internal/cgroup"
	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/nsexec"
	"github.com/dsecproject/dsec/internal/rootfs"
	"github.com/dsecproject/dsec/internal/swap"
)

// Checks returns the checks of this platform, in the order they are
// reported.
func Checks() []Check {
	return []Check{
		{"root", true, checkRoot},
		{"kernel", false, checkKernel},
		{"erofs fs", true, checkFilesystem("erofs")},
		{"overlay fs", true, checkFilesystem("overlay")},
		{"xfs fs", false, checkFilesystem("xfs")},
		{"fuse fs", false, checkFilesystem("fuse")},
		{"erofs mount", true, checkEROFSMount},
		{"idmapped mount", true, checkIDMappedMount},
		{"overlay on idmap", true, checkOverlayOnIDMap},
		{"user namespaces", true, checkUserns},
		{"uid range", true, checkUIDRange},
		{"cgroup layout", true, checkCgroupLayout},
		{"cgroup controllers", true, checkCgroupControllers},
		{"oci runtime", true, checkRuntime},
		{"dsec binary", true, checkBinary},
		{"openat2", true, checkOpenat2},
		{"pidfd", true, checkPidfd},
		{"seccomp", true, checkSeccomp},
		{"loop devices", false, checkLoopControl},
		{"mkfs.xfs", false, checkMkfsXFS},
		{"open files", false, checkNofile},
		{"pid_max", false, checkPidMax},
		{"memory", false, checkMemory},
		{"host ceilings", false, checkCeilings},
		{"swap", false, checkSwap},
		{"state dir", true, checkStateDir},
		{"disk space", false, checkDiskSpace},
		{"api address", true, checkAPIAddr},
	}
}

const fixSudo = "run it as root: sudo dsec doctor"

// needRoot returns the result of a probe that cannot run without root.
func needRoot() (Result, bool) {
	if os.Geteuid() == 0 {
		return Result{}, true
	}
	return failf(fixSudo, "not probed: needs root"), false
}

// needRootAndRange returns the result of a probe that needs root and a
// valid uid range, when it cannot run.
func needRootAndRange(env Env) (Result, bool) {
	if r, ok := needRoot(); !ok {
		return r, false
	}
	if err := env.IDMap.Validate(); err != nil {
		return failf("fix the uid range check first", "not probed: %v", err), false
	}
	return Result{}, true
}

func checkRoot(context.Context, Env) Result {
	if uid := os.Geteuid(); uid != 0 {
		return failf(fixSudo, "running as uid %d: dsec makes mounts, namespaces and cgroups, which need root", uid)
	}
	return okf("running as root")
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

func checkKernel(context.Context, Env) Result { return kernelResult(kernelRelease()) }

// kernelResult judges a kernel release. The version is only a hint: the
// mount probes decide.
func kernelResult(release string) Result {
	major, minor, ok1 := parseKernelRelease(release)
	switch {
	case !ok1:
		return warnf("", "cannot read the version of kernel %q; the erofs mount check decides", release)
	case major < 6 || major == 6 && minor < 12:
		return warnf("use Linux 6.12 or newer",
			"Linux %s: file-backed EROFS mounts arrived in 6.12 (commit fb176750266a, CONFIG_EROFS_FS_BACKED_BY_FILE); the erofs mount check decides", release)
	}
	return okf("Linux %s: 6.12 or newer, as file-backed EROFS mounts need (commit fb176750266a, CONFIG_EROFS_FS_BACKED_BY_FILE)", release)
}

// What each file system is for, and what its absence means.
var filesystems = map[string]struct{ config, missing, fix string }{
	"erofs":   {"CONFIG_EROFS_FS", "image layers are EROFS", "modprobe erofs, or use a kernel built with CONFIG_EROFS_FS"},
	"overlay": {"CONFIG_OVERLAY_FS", "sandbox roots are overlayfs", "modprobe overlay, or use a kernel built with CONFIG_OVERLAY_FS"},
	"xfs":     {"CONFIG_XFS_FS", "no per-sandbox disk limits (they need XFS project quotas)", "modprobe xfs"},
	"fuse":    {"CONFIG_FUSE_FS", "no lazily fetched (FUSE-backed) layers", "modprobe fuse"},
}

func checkFilesystem(name string) func(context.Context, Env) Result {
	return func(context.Context, Env) Result {
		b, err := os.ReadFile("/proc/filesystems")
		if err != nil {
			return failf("mount /proc", "read /proc/filesystems: %v", err)
		}
		rel := kernelRelease()
		r := filesystemResult(name, parseFilesystems(b)[name], moduleAvailable("/lib/modules", rel, name))
		if name == "xfs" && r.Status == OK {
			if _, err := os.Stat("/proc/fs/xfs/xqm"); err == nil {
				r.Detail += "; with quota support, for disk limits by XFS project quotas"
			} else if _, err := os.Stat("/proc/fs/xfs"); err == nil {
				r.Detail += "; without quota support (no /proc/fs/xfs/xqm), so disk limits use an ext4 image per sandbox"
			}
		}
		return r
	}
}

func filesystemResult(name string, registered, module bool) Result {
	fs := filesystems[name]
	required := name == "erofs" || name == "overlay"
	switch {
	case registered:
		return okf("%s is in /proc/filesystems", name)
	case module:
		return okf("%s is a module, loaded on first mount (modprobe %s loads it now)", name, name)
	case required:
		return failf(fs.fix, "%s is neither in /proc/filesystems nor a module of this kernel: %s", name, fs.missing)
	}
	return warnf(fs.fix, "%s is neither in /proc/filesystems nor a module of this kernel: %s", name, fs.missing)
}

// moduleAvailable reports whether kernel release has name as a loadable
// module (listed in dir/release/modules.dep).
func moduleAvailable(dir, release, name string) bool {
	if release == "" || release == "." || release == ".." || strings.ContainsAny(release, "/\x00") {
		return false
	}
	b, err := os.ReadFile(filepath.Join(dir, release, "modules.dep"))
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		p, _, _ := strings.Cut(line, ":")
		base := filepath.Base(p)
		if m, _, found := strings.Cut(base, ".ko"); found && m == name {
			return true
		}
	}
	return false
}

func checkEROFSMount(ctx context.Context, env Env) Result {
	if r, ok := needRoot(); !ok {
		return r
	}
	res, err := runMountProbe(ctx, env, stageEROFS)
	if err != nil {
		return mountFailure(err, stageEROFS)
	}
	return okf("mounted a %d-byte EROFS image straight from its file (no loop device) and read it back", res.imageSize)
}

func checkIDMappedMount(ctx context.Context, env Env) Result {
	if r, ok := needRootAndRange(env); !ok {
		return r
	}
	_, err := runMountProbe(ctx, env, stageIDMap)
	if err != nil {
		return mountFailure(err, stageIDMap)
	}
	h0, _ := env.IDMap.ToHost(0)
	return okf("an idmapped view (open_tree, mount_setattr) of an EROFS mount shows its uid 0 as host uid %d", h0)
}

func checkOverlayOnIDMap(ctx context.Context, env Env) Result {
	if r, ok := needRootAndRange(env); !ok {
		return r
	}
	res, err := runMountProbe(ctx, env, stageOverlay)
	if err != nil {
		return mountFailure(err, stageOverlay)
	}
	return okf("overlayfs over an idmapped EROFS view, upper dir on %s: writes and copy-up keep the mapped owners", res.upperFS)
}

// mountFailure words a failed mount probe for the check of stage want.
func mountFailure(err error, want stage) Result {
	var se *stageError
	if !errors.As(err, &se) {
		se = &stageError{stageSetup, err}
	}
	if se.stage < want && se.stage != stageSetup {
		names := map[stage]string{stageEROFS: "erofs mount", stageIDMap: "idmapped mount"}
		return failf("fix the "+names[se.stage]+" check first", "not probed: an earlier step fails: %v", err)
	}
	switch se.stage {
	case stageSetup:
		return failf("see the detail; the user namespaces and state dir checks may say more", "could not set up the probe: %v", err)
	case stageEROFS:
		switch {
		case errors.Is(err, unix.ENOTBLK):
			return failf("use Linux 6.12 or newer built with CONFIG_EROFS_FS_BACKED_BY_FILE=y",
				"this kernel mounts EROFS only from block devices, not from files: %v", err)
		case errors.Is(err, unix.ENODEV):
			return failf(filesystems["erofs"].fix, "this kernel has no EROFS: %v", err)
		case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
			return failf("run dsec on the host (or in a privileged container)", "mounts are not permitted here: %v", err)
		}
		return failf("see `dmesg | tail` for the kernel's reason", "mounting an EROFS image from a file fails: %v", err)
	case stageIDMap:
		return failf("use a kernel whose EROFS supports idmapped mounts (Linux 6.12 or newer has it)",
			"idmapping an EROFS mount for the sandboxes' uid range fails: %v", err)
	}
	return failf("use a kernel whose overlayfs takes idmapped lower layers (Linux 6.12 or newer does), with the state dir on ext4, xfs or btrfs",
		"overlayfs over an idmapped EROFS view fails: %v", err)
}

func checkUserns(_ context.Context, env Env) Result {
	b, err := os.ReadFile("/proc/sys/user/max_user_namespaces")
	if err != nil {
		return failf("use a kernel built with CONFIG_USER_NS", "read /proc/sys/user/max_user_namespaces: %v", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n <= 0 {
		return failf("sysctl -w user.max_user_namespaces=65536 (and set it in /etc/sysctl.d/ to keep it)",
			"user namespaces are disabled (user.max_user_namespaces = %s): every sandbox needs one", strings.TrimSpace(string(b)))
	}
	if r, ok := needRootAndRange(env); !ok {
		return r
	}
	// As the keeper makes each sandbox's: by a helper running as the
	// sandbox's host root, so that the namespace is that uid's.
	self, err := os.Open(env.Binary)
	if err != nil {
		return failf("see the dsec binary check", "open %s: %v", env.Binary, err)
	}
	defer self.Close()
	var pid int
	start := func(argv, envv []string, files []uintptr, sys *syscall.SysProcAttr) (int, error) {
		p, err := syscall.ForkExec(argv[0], argv, &syscall.ProcAttr{Env: envv, Files: files, Sys: sys})
		pid = p
		return p, err
	}
	u, err := nsexec.NewUserNS(self, env.IDMap.HostID, env.IDMap.Size, nil, start)
	if pid > 0 {
		defer func() {
			var ws syscall.WaitStatus
			for {
				if _, err := syscall.Wait4(pid, &ws, 0, nil); !errors.Is(err, syscall.EINTR) {
					break
				}
			}
		}()
	}
	if err != nil {
		if pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		return failf("allow unprivileged user namespaces (user.max_user_namespaces > 0; no distribution switch turning them off), and see the uid range and dsec binary checks",
			"cannot make a sandbox's user namespace as its host uid %d: %v", env.IDMap.HostID, err)
	}
	u.Close()
	return okf("made one owned by host uid %d, mapping host ids %d–%d; up to %d may exist", env.IDMap.HostID, env.IDMap.HostID, uint64(env.IDMap.HostID)+uint64(env.IDMap.Size)-1, n)
}

func checkUIDRange(_ context.Context, env Env) Result {
	read := func(p string) []subIDRange {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		return parseSubIDs(b)
	}
	return uidRangeResult(env.span(), read("/etc/subuid"), read("/etc/subgid"))
}

// uidRangeResult judges the sandboxes' id range against the subordinate id
// ranges given to users (for their rootless containers), which must not
// share ids with sandboxes.
func uidRangeResult(m rootfs.IDMap, subuid, subgid []subIDRange) Result {
	if err := m.Validate(); err != nil {
		return failf("pass --uid-base and --uid-count so that base > 0 and base + count < 2^32", "%v", err)
	}
	base, count := uint64(m.HostID), uint64(m.Size)
	var hits []string
	var all []subIDRange
	for _, f := range []struct {
		file string
		rs   []subIDRange
	}{{"/etc/subuid", subuid}, {"/etc/subgid", subgid}} {
		for _, r := range overlapping(base, count, f.rs) {
			hits = append(hits, f.file+" "+r.String())
		}
		all = append(all, f.rs...)
	}
	last := base + count - 1
	if len(hits) > 0 {
		fix := "remove those entries, or pass --uid-base with a free range to dsec up"
		if b, ok := freeBase(base, count, all); ok {
			fix = fmt.Sprintf("pass --uid-base %d to dsec up (a free range), or remove those entries", b)
		}
		return warnf(fix, "host ids %d–%d overlap %s: those users' containers would share ids with sandboxes",
			base, last, strings.Join(hits, ", "))
	}
	return okf("host uids and gids %d–%d (%d ids), in no /etc/subuid or /etc/subgid entry", base, last, count)
}

func checkCgroupLayout(context.Context, Env) Result {
	l, err := cgroup.DetectLayout()
	if err != nil {
		return failf("mount the cgroup hierarchies (systemd does) at /sys/fs/cgroup", "%v", err)
	}
	return layoutResult(l)
}

func layoutResult(l cgroup.Layout) Result {
	var v1 []string
	for _, mp := range l.V1 {
		v1 = append(v1, mp)
	}
	v1Root := commonDir(v1)
	switch l.Mode {
	case cgroup.V1:
		return okf("v1: controllers under %s, no cgroup2 (kills freeze and signal)", v1Root)
	case cgroup.Hybrid:
		return okf("hybrid: limits through v1 under %s; kill, freeze and events through cgroup2 at %s", v1Root, l.Unified)
	}
	return okf("unified: cgroup2 at %s", l.Unified)
}

// commonDir is the deepest directory holding every path of ps.
func commonDir(ps []string) string {
	if len(ps) == 0 {
		return ""
	}
	c := filepath.Dir(ps[0])
	for _, p := range ps[1:] {
		for c != "/" && !strings.HasPrefix(p, c+"/") {
			c = filepath.Dir(c)
		}
	}
	return c
}

func checkCgroupControllers(context.Context, Env) Result {
	l, err := cgroup.DetectLayout()
	if err != nil {
		return failf("mount the cgroup hierarchies (systemd does) at /sys/fs/cgroup", "%v", err)
	}
	var v2 map[string]bool
	if l.Unified != "" {
		v2 = map[string]bool{
			"cgroup.freeze": v2FileExists(l.Unified, "cgroup.freeze"),
			"cgroup.kill":   v2FileExists(l.Unified, "cgroup.kill"),
		}
	}
	return controllersResult(l, v2)
}

// controllersResult judges the controllers a layout offers: memory and pids
// are required, cpu and freezing limit dsec when missing. v2 says which
// cgroup2 interface files (cgroup.freeze, cgroup.kill) exist.
func controllersResult(l cgroup.Layout, v2 map[string]bool) Result {
	has := func(c string) bool {
		if l.Mode == cgroup.Unified {
			for _, u := range l.UnifiedControllers {
				if u == c {
					return true
				}
			}
			return false
		}
		return l.V1[c] != ""
	}
	where := "as cgroup v1 hierarchies"
	if l.Mode == cgroup.Unified {
		where = "in cgroup2's cgroup.controllers"
	}
	var missing []string
	for _, c := range []string{"memory", "pids"} {
		if !has(c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return failf("enable them on the kernel command line (cgroup_enable=memory, and no cgroup_disable= for them) and reboot",
			"no %s controller %s: sandboxes' memory and process limits need them", strings.Join(missing, " or "), where)
	}
	found := []string{"memory", "pids"}
	var limits []string
	if has("cpu") {
		found = append(found, "cpu")
	} else {
		limits = append(limits, "no CPU caps (no cpu controller)")
	}
	switch {
	case l.Mode != cgroup.Unified && l.V1["freezer"] != "":
		found = append(found, "freezer")
	case v2["cgroup.freeze"]:
		found = append(found, "cgroup2 freeze")
	default:
		limits = append(limits, "sandboxes cannot be frozen (no freezer, no cgroup.freeze)")
	}
	if v2["cgroup.kill"] {
		found = append(found, "cgroup2 kill")
	}
	if len(limits) > 0 {
		return warnf("enable the missing controllers (mount the v1 hierarchy or use a newer kernel)", "%s; %s", strings.Join(found, ", "), strings.Join(limits, "; "))
	}
	return okf("%s", strings.Join(found, ", "))
}

// v2FileExists reports whether non-root cgroups of the cgroup2 hierarchy at
// root have file (the root group lacks cgroup.freeze and cgroup.kill): it
// looks in this process's own group, then in the root's children.
func v2FileExists(root, file string) bool {
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if p, found := strings.CutPrefix(line, "0::"); found && p != "/" && !strings.Contains(p, "..") {
				if _, err := os.Stat(filepath.Join(root, p, file)); err == nil {
					return true
				}
			}
		}
	}
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		if e.IsDir() {
			if _, err := os.Stat(filepath.Join(root, e.Name(), file)); err == nil {
				return true
			}
		}
	}
	return false
}

// runOutput runs a program with a deadline and returns its output.
func runOutput(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = nil
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

func checkRuntime(ctx context.Context, env Env) Result {
	chosen, err := keeper.FindRuntime(env.Runtime)
	if err != nil {
		return failf("apt-get install crun (or runc), or pass --runtime PATH", "%v", err)
	}
	l, lerr := cgroup.DetectLayout()
	hybrid := lerr == nil && l.Mode == cgroup.Hybrid
	var found []string
	paths := []string{chosen}
	for _, name := range []string{"crun", "runc"} {
		if p, err := exec.LookPath(name); err == nil && p != chosen {
			paths = append(paths, p)
		}
	}
	for i, p := range paths {
		out, err := runOutput(ctx, p, "--version")
		if err != nil {
			if i == 0 {
				return failf("reinstall it (apt-get install --reinstall crun) or pass --runtime PATH",
					"%s --version fails: %v: %s", p, err, oneLine(string(out)))
			}
			continue
		}
		s := fmt.Sprintf("%s %s", filepath.Base(p), parseRuntimeVersion(out))
		if i == 0 {
			s += " (used)"
		}
		found = append(found, s)
	}
	detail := strings.Join(found, ", ")
	if hybrid && filepath.Base(chosen) == "crun" {
		detail += "; on this hybrid host the keeper hides cgroup2 from crun, which then uses v1 (fine)"
	}
	return okf("%s", detail)
}

func checkBinary(_ context.Context, env Env) Result { return binaryResult(env.Binary) }

// binaryResult checks that the dsec binary at path is static and carries
// the sandbox init and exec helper (internal/nsexec's C part).
func binaryResult(path string) Result {
	const fix = "build it with make build and run bin/dsec"
	if path == "" {
		return failf(fix, "cannot find the dsec binary")
	}
	f, err := elf.Open(path)
	if err != nil {
		return failf(fix, "read %s: %v", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			interp, _ := io.ReadAll(io.LimitReader(p.Open(), 4096))
			return failf(fix, "%s is dynamically linked (through %s): sandbox roots without a C library cannot run it as their init",
				path, strings.TrimRight(string(interp), "\x00"))
		}
	}
	syms, err := f.Symbols()
	if errors.Is(err, elf.ErrNoSymbols) {
		return okf("%s is static (stripped: its sandbox init part cannot be confirmed)", path)
	}
	if err != nil {
		return failf(fix, "read the symbols of %s: %v", path, err)
	}
	for _, s := range syms {
		if s.Name == "dsec_nsexec" {
			return okf("%s is static and carries the sandbox init and exec helper", path)
		}
	}
	return failf(fix+" (with cgo)", "%s is static but has no sandbox init and exec helper (built without cgo?)", path)
}

func checkOpenat2(context.Context, Env) Result {
	how := unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	}
	fd, err := unix.Openat2(unix.AT_FDCWD, "/", &how)
	if err != nil {
		return syscallFailure("openat2", "file operations in sandboxes resolve paths with it", "5.6", err)
	}
	unix.Close(fd)
	return okf("openat2 with RESOLVE_IN_ROOT works")
}

func syscallFailure(name, use, since string, err error) Result {
	if errors.Is(err, unix.ENOSYS) {
		return failf("use Linux "+since+" or newer", "%s is missing (%v): %s", name, err, use)
	}
	if errors.Is(err, unix.EPERM) {
		return failf("if dsec runs in a container, allow "+name+" in its seccomp profile", "%s is refused (%v): %s", name, err, use)
	}
	return failf("see the detail", "%s fails: %v: %s", name, err, use)
}

func checkPidfd(context.Context, Env) Result {
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return syscallFailure("pidfd_open", "the exec helper joins sandboxes through a pidfd", "5.3", err)
	}
	defer unix.Close(fd)
	if os.Geteuid() != 0 {
		return okf("pidfd_open works (setns through a pidfd needs root to probe)")
	}
	// Join our own UTS namespace through the pidfd, as the exec helper
	// joins a sandbox's, on a thread that ends afterwards.
	err = onThrowawayThread(func() error { return unix.Setns(fd, unix.CLONE_NEWUTS) })
	if err != nil {
		return syscallFailure("setns on a pidfd", "the exec helper joins sandboxes' namespaces with it", "5.8", err)
	}
	return okf("pidfd_open and setns through a pidfd work")
}

func checkSeccomp(context.Context, Env) Result {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return failf("mount /proc", "read /proc/self/status: %v", err)
	}
	if !bytes.Contains(b, []byte("\nSeccomp:")) {
		return failf("use a kernel built with CONFIG_SECCOMP and CONFIG_SECCOMP_FILTER",
			"no Seccomp field in /proc/self/status: this kernel has no seccomp, which limits sandboxes' system calls")
	}
	if err := onThrowawayThread(installAllowAllFilter); err != nil {
		return failf("use a kernel built with CONFIG_SECCOMP_FILTER",
			"installing a seccomp filter fails: %v", err)
	}
	return okf("seccomp filters can be installed")
}

func checkLoopControl(context.Context, Env) Result {
	fi, err := os.Stat("/dev/loop-control")
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return warnf("modprobe loop", "no /dev/loop-control: per-sandbox disk limits (XFS on loop devices) cannot be set up")
	}
	return okf("/dev/loop-control is present")
}

func checkMkfsXFS(ctx context.Context, _ Env) Result {
	p, err := exec.LookPath("mkfs.xfs")
	if err != nil {
		for _, c := range []string{"/usr/sbin/mkfs.xfs", "/sbin/mkfs.xfs"} {
			if _, serr := os.Stat(c); serr == nil {
				p, err = c, nil
				break
			}
		}
	}
	if err != nil {
		return warnf("apt-get install xfsprogs", "mkfs.xfs not found: per-sandbox disk limits (XFS) cannot be set up")
	}
	out, err := runOutput(ctx, p, "-V")
	if err != nil {
		return warnf("apt-get install --reinstall xfsprogs", "%s -V fails: %v", p, err)
	}
	return okf("%s", oneLine(string(out)))
}

func checkNofile(context.Context, Env) Result {
	var l unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &l); err != nil {
		return warnf("", "getrlimit: %v", err)
	}
	nrOpen := uint64(0)
	if b, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
		nrOpen, _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	}
	return nofileResult(l.Cur, l.Max, nrOpen)
}

// fdsPerExec is about how many descriptors a running exec holds in the
// keeper: its two output files, the read ends of its stdout and stderr
// pipes and its stdin pipe.
const fdsPerExec = 5

// nofileResult judges the open-file limit dsec up and its keeper inherit
// (Go raises their soft limit to the hard one).
func nofileResult(soft, hard, nrOpen uint64) Result {
	const want = 65536
	what := fmt.Sprintf("hard limit %d (soft %d): dsec up and its keeper get %d descriptors each, room for about %d running execs (≈%d descriptors each in the keeper)",
		hard, soft, hard, hard/fdsPerExec, fdsPerExec)
	if hard == unix.RLIM_INFINITY {
		return okf("no limit on open files")
	}
	if hard >= want {
		return okf("%s", what)
	}
	target := uint64(1048576)
	if nrOpen > 0 && nrOpen < target {
		target = nrOpen
	}
	return warnf(fmt.Sprintf("raise it where dsec up starts: `ulimit -n %d` in its shell, LimitNOFILE=%d in a systemd unit, or a nofile line in /etc/security/limits.conf", target, target),
		"%s; under %d", what, want)
}

func checkPidMax(context.Context, Env) Result {
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		return warnf("", "read /proc/sys/kernel/pid_max: %v", err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return warnf("", "parse /proc/sys/kernel/pid_max: %v", err)
	}
	return pidMaxResult(n)
}

func pidMaxResult(n uint64) Result {
	const low = 32768
	if n < low {
		return warnf("sysctl -w kernel.pid_max=4194304 (and set it in /etc/sysctl.d/)",
			"%d processes and threads for the whole node, sandboxes included: few sandboxes fit", n)
	}
	return okf("%d processes and threads for the whole node, sandboxes included (each has at least its init)", n)
}

func readMeminfo() (map[string]uint64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return nil, err
	}
	return parseMeminfo(b), nil
}

func checkMemory(context.Context, Env) Result {
	m, err := readMeminfo()
	if err != nil {
		return warnf("", "read /proc/meminfo: %v", err)
	}
	return memoryResult(m["MemTotal"], m["MemAvailable"])
}

// defaultSandboxMemory and defaultOvercommit are dsec up's defaults
// (CONTRACT.md): each sandbox's memory limit, and how far limits may add
// up beyond the node's memory.
const (
	defaultSandboxMemory = 512 << 20
	defaultOvercommit    = 4
)

func memoryResult(total, avail uint64) Result {
	// Admission counts from the sandboxes' memory ceiling: the host's
	// memory minus the host memory reserve (docs/ceilings.md).
	admitted := (total - uint64(ceiling.MemoryReserve.Of(int64(total)))) * defaultOvercommit
	what := fmt.Sprintf("%s, %s available: memory limits may add up to %s (%d sandboxes of 512 MiB at the default overcommit of %d)",
		formatBytes(total), formatBytes(avail), formatBytes(admitted), admitted/defaultSandboxMemory, defaultOvercommit)
	if total < 2<<30 {
		return warnf("use a node with more memory", "%s: few sandboxes fit", what)
	}
	return okf("%s", what)
}

func checkSwap(_ context.Context, env Env) Result {
	m, err := readMeminfo()
	if err != nil {
		return warnf("", "read /proc/meminfo: %v", err)
	}
	st, err := swap.Current(env.StateDir)
	if err != nil {
		return warnf("remove "+swap.RecordPath(env.StateDir)+" once the swap file it names is off", "%v", err)
	}
	return swapFileResult(swapResult(m["SwapTotal"], m["SwapFree"]), st)
}

func swapResult(total, free uint64) Result {
	if total == 0 {
		return okf("none: paused sandboxes' memory stays resident (dsec up --swap FILE:SIZE gives dsec a swap file)")
	}
	return okf("%s, %s free: memory of paused sandboxes can be pushed out", formatBytes(total), formatBytes(free))
}

// swapFileResult adds to r what the state dir records of dsec's own swap
// file (dsec up --swap).
func swapFileResult(r Result, st swap.Status) Result {
	switch {
	case st.Record.Path == "":
		return r
	case st.Active:
		r.Detail += fmt.Sprintf("; dsec's swap file %s (%s, %s used)", st.Record.Path, formatBytes(uint64(st.Record.Size)), formatBytes(uint64(st.Used)))
		return r
	}
	return warnf("the next dsec up, dsec down or dsec purge removes it",
		"%s; dsec's swap file %s is recorded but off (a dsec up that ended without turning it off)", r.Detail, st.Record.Path)
}
