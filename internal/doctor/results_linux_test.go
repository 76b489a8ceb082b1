package doctor

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/cgroup"
	"github.com/dsecproject/dsec/internal/rootfs"
	"github.com/dsecproject/dsec/internal/swap"
)

// want is what a test expects of a Result: its status, and words its
// detail and fix must contain.
type want struct {
	status Status
	detail string
	fix    string
}

func (w want) check(t *testing.T, call string, got Result) {
	t.Helper()
	if got.Status != w.status || !strings.Contains(got.Detail, w.detail) || !strings.Contains(got.Fix, w.fix) {
		t.Errorf("%s = %+v, want status %v, detail containing %q, fix containing %q", call, got, w.status, w.detail, w.fix)
	}
	if got.Status != OK && got.Detail == "" {
		t.Errorf("%s = %+v, want a detail", call, got)
	}
	if got.Status == Fail && got.Fix == "" {
		t.Errorf("%s = %+v, want a fix", call, got)
	}
}

func TestKernelResult(t *testing.T) {
	for _, tc := range []struct {
		release string
		want    want
	}{
		{"6.18.44-fc-v782", want{OK, "6.12 or newer", ""}},
		{"6.12.0", want{OK, "fb176750266a", ""}},
		{"6.6.30", want{Warn, "arrived in 6.12", "6.12"}},
		{"5.10.0-28-amd64", want{Warn, "arrived in 6.12", "6.12"}},
		{"weird", want{Warn, "cannot read", ""}},
	} {
		tc.want.check(t, fmt.Sprintf("kernelResult(%q)", tc.release), kernelResult(tc.release))
	}
}

func TestFilesystemResult(t *testing.T) {
	for _, tc := range []struct {
		name               string
		registered, module bool
		want               want
	}{
		{"erofs", true, false, want{OK, "in /proc/filesystems", ""}},
		{"erofs", false, true, want{OK, "modprobe erofs", ""}},
		{"erofs", false, false, want{Fail, "image layers", "CONFIG_EROFS_FS"}},
		{"overlay", false, false, want{Fail, "sandbox roots", "modprobe overlay"}},
		{"xfs", false, false, want{Warn, "disk limits", "modprobe xfs"}},
		{"fuse", false, false, want{Warn, "FUSE", "modprobe fuse"}},
	} {
		tc.want.check(t, fmt.Sprintf("filesystemResult(%q, %v, %v)", tc.name, tc.registered, tc.module),
			filesystemResult(tc.name, tc.registered, tc.module))
	}
}

func TestModuleAvailable(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "6.1.0-18-amd64"), 0o755); err != nil {
		t.Fatal(err)
	}
	dep := "kernel/fs/erofs/erofs.ko.xz: kernel/lib/lz4.ko.xz\nkernel/fs/overlayfs/overlay.ko:\nkernel/fs/fuse/cuse.ko.zst: kernel/fs/fuse/fuse.ko.zst\n"
	if err := os.WriteFile(filepath.Join(dir, "6.1.0-18-amd64", "modules.dep"), []byte(dep), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		release, name string
		want          bool
	}{
		{"6.1.0-18-amd64", "erofs", true},
		{"6.1.0-18-amd64", "overlay", true},
		{"6.1.0-18-amd64", "fuse", false}, // only a dependency of cuse on this line: not listed as a module of its own
		{"6.1.0-18-amd64", "xfs", false},
		{"6.1.0-18-amd64", "lz4", false},
		{"6.2.0", "erofs", false},
		{"..", "erofs", false},
		{"", "erofs", false},
	} {
		if got := moduleAvailable(dir, tc.release, tc.name); got != tc.want {
			t.Errorf("moduleAvailable(%q, %q) = %v, want %v", tc.release, tc.name, got, tc.want)
		}
	}
}

func TestUIDRangeResult(t *testing.T) {
	alice := []subIDRange{{"alice", 100000, 65536}}
	clash := []subIDRange{{"bob", 1_000_000_000, 65536}}
	for _, tc := range []struct {
		name           string
		m              rootfs.IDMap
		subuid, subgid []subIDRange
		want           want
	}{
		{"free", rootfs.Default, alice, alice, want{OK, "1000000000–1000065535 (65536 ids)", ""}},
		{"subuid overlap", rootfs.Default, clash, nil, want{Warn, "/etc/subuid bob:1000000000:65536", "--uid-base 1000079360"}},
		{"subgid overlap", rootfs.Default, nil, clash, want{Warn, "/etc/subgid bob", "--uid-base"}},
		{"past 32 bits", rootfs.IDMap{HostID: 4_294_967_000, Size: 65536}, nil, nil, want{Fail, "exceeds 32-bit", "--uid-base"}},
		{"zero base", rootfs.IDMap{HostID: 0, Size: 65536}, nil, nil, want{Fail, "above 0", "--uid-base"}},
	} {
		tc.want.check(t, "uidRangeResult("+tc.name+")", uidRangeResult(tc.m, tc.subuid, tc.subgid))
	}
}

func TestLayoutResult(t *testing.T) {
	v1 := map[string]string{"memory": "/sys/fs/cgroup/memory", "cpu": "/sys/fs/cgroup/cpu,cpuacct", "pids": "/sys/fs/cgroup/pids"}
	for _, tc := range []struct {
		l    cgroup.Layout
		want want
	}{
		{cgroup.Layout{Mode: cgroup.V1, V1: v1}, want{OK, "v1: controllers under /sys/fs/cgroup", ""}},
		{cgroup.Layout{Mode: cgroup.Hybrid, V1: v1, Unified: "/sys/fs/cgroup/unified"}, want{OK, "cgroup2 at /sys/fs/cgroup/unified", ""}},
		{cgroup.Layout{Mode: cgroup.Unified, Unified: "/sys/fs/cgroup"}, want{OK, "unified: cgroup2 at /sys/fs/cgroup", ""}},
	} {
		tc.want.check(t, fmt.Sprintf("layoutResult(%v)", tc.l.Mode), layoutResult(tc.l))
	}
}

func TestControllersResult(t *testing.T) {
	full := map[string]string{"memory": "/m", "pids": "/p", "cpu": "/c", "freezer": "/f"}
	without := func(c string) map[string]string {
		m := map[string]string{}
		for k, v := range full {
			if k != c {
				m[k] = v
			}
		}
		return m
	}
	for _, tc := range []struct {
		name string
		l    cgroup.Layout
		v2   map[string]bool
		want want
	}{
		{"hybrid", cgroup.Layout{Mode: cgroup.Hybrid, V1: full, Unified: "/u"}, map[string]bool{"cgroup.kill": true, "cgroup.freeze": true},
			want{OK, "memory, pids, cpu, freezer, cgroup2 kill", ""}},
		{"v1 no memory", cgroup.Layout{Mode: cgroup.V1, V1: without("memory")}, nil, want{Fail, "no memory controller", "cgroup_enable=memory"}},
		{"v1 no pids", cgroup.Layout{Mode: cgroup.V1, V1: without("pids")}, nil, want{Fail, "no pids controller", "reboot"}},
		{"v1 no cpu", cgroup.Layout{Mode: cgroup.V1, V1: without("cpu")}, nil, want{Warn, "no CPU caps", "enable"}},
		{"hybrid freeze through cgroup2", cgroup.Layout{Mode: cgroup.Hybrid, V1: without("freezer"), Unified: "/u"}, map[string]bool{"cgroup.freeze": true},
			want{OK, "cgroup2 freeze", ""}},
		{"v1 no freezer", cgroup.Layout{Mode: cgroup.V1, V1: without("freezer")}, nil, want{Warn, "cannot be frozen", "enable"}},
		{"unified", cgroup.Layout{Mode: cgroup.Unified, Unified: "/u", UnifiedControllers: []string{"cpu", "memory", "pids"}},
			map[string]bool{"cgroup.kill": true, "cgroup.freeze": true}, want{OK, "memory, pids, cpu, cgroup2 freeze, cgroup2 kill", ""}},
		{"unified no memory", cgroup.Layout{Mode: cgroup.Unified, Unified: "/u", UnifiedControllers: []string{"cpu", "pids"}},
			nil, want{Fail, "no memory controller in cgroup2", "cgroup_enable=memory"}},
	} {
		tc.want.check(t, "controllersResult("+tc.name+")", controllersResult(tc.l, tc.v2))
	}
}

func TestNofileResult(t *testing.T) {
	for _, tc := range []struct {
		soft, hard, nrOpen uint64
		want               want
	}{
		{20000, 20000, 1048576, want{Warn, "room for about 4000 running execs", "ulimit -n 1048576"}},
		{1024, 4096, 65536, want{Warn, "hard limit 4096 (soft 1024)", "LimitNOFILE=65536"}},
		{1048576, 1048576, 1048576, want{OK, "about 209715 running execs", ""}},
		{unix.RLIM_INFINITY, unix.RLIM_INFINITY, 0, want{OK, "no limit", ""}},
	} {
		tc.want.check(t, fmt.Sprintf("nofileResult(%d, %d, %d)", tc.soft, tc.hard, tc.nrOpen), nofileResult(tc.soft, tc.hard, tc.nrOpen))
	}
}

func TestLimitResults(t *testing.T) {
	for _, tc := range []struct {
		call string
		got  Result
		want want
	}{
		{"pidMaxResult(32768)", pidMaxResult(32768), want{OK, "32768 processes", ""}},
		{"pidMaxResult(4096)", pidMaxResult(4096), want{Warn, "few sandboxes", "kernel.pid_max"}},
		{"memoryResult(24G)", memoryResult(24<<30, 20<<30), want{OK, "86.4 GiB (172 sandboxes of 512 MiB", ""}},
		{"memoryResult(1G)", memoryResult(1<<30, 1<<29), want{Warn, "few sandboxes fit", "more memory"}},
		{"swapResult(0)", swapResult(0, 0), want{OK, "none", ""}},
		{"swapResult(8G)", swapResult(8<<30, 4<<30), want{OK, "8.0 GiB, 4.0 GiB free", ""}},
		{"swapFileResult(none)", swapFileResult(swapResult(0, 0), swap.Status{}), want{OK, "none", ""}},
		{"swapFileResult(on)", swapFileResult(swapResult(8<<30, 4<<30), swap.Status{Record: swap.Record{Path: "/var/swap", Size: 8 << 30}, Active: true, Used: 1 << 30}),
			want{OK, "dsec's swap file /var/swap (8.0 GiB, 1.0 GiB used)", ""}},
		{"swapFileResult(off)", swapFileResult(swapResult(0, 0), swap.Status{Record: swap.Record{Path: "/var/swap", Size: 8 << 30}}),
			want{Warn, "recorded but off", "dsec purge"}},
		{"diskResult(75G)", diskResult("/var/lib/dsec", "ext4", 75<<30), want{OK, "75.0 GiB free for /var/lib/dsec (ext4)", ""}},
		{"diskResult(2G)", diskResult("/var/lib/dsec", "ext4", 2<<30), want{Warn, "under 10.0 GiB", "--state-dir"}},
	} {
		tc.want.check(t, tc.call, tc.got)
	}
}

func TestMountFailure(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		for_ stage
		want want
	}{
		{"no file-backed mounts", &stageError{stageEROFS, fmt.Errorf("mount: %w", unix.ENOTBLK)}, stageEROFS,
			want{Fail, "only from block devices", "CONFIG_EROFS_FS_BACKED_BY_FILE"}},
		{"no erofs", &stageError{stageEROFS, unix.ENODEV}, stageEROFS, want{Fail, "no EROFS", "modprobe erofs"}},
		{"not permitted", &stageError{stageEROFS, unix.EPERM}, stageEROFS, want{Fail, "not permitted", "privileged container"}},
		{"other erofs", &stageError{stageEROFS, unix.EIO}, stageEROFS, want{Fail, "from a file fails", "dmesg"}},
		{"earlier stage", &stageError{stageEROFS, unix.ENOTBLK}, stageOverlay, want{Fail, "earlier step", "erofs mount check first"}},
		{"idmap", &stageError{stageIDMap, unix.EINVAL}, stageIDMap, want{Fail, "idmapping an EROFS mount", "idmapped mounts"}},
		{"idmap before overlay", &stageError{stageIDMap, unix.EINVAL}, stageOverlay, want{Fail, "earlier step", "idmapped mount check first"}},
		{"overlay", &stageError{stageOverlay, unix.EINVAL}, stageOverlay, want{Fail, "overlayfs over an idmapped", "ext4, xfs or btrfs"}},
		{"setup", &stageError{stageSetup, unix.ENOSPC}, stageOverlay, want{Fail, "could not set up", "state dir"}},
	} {
		tc.want.check(t, "mountFailure("+tc.name+")", mountFailure(tc.err, tc.for_))
	}
}
