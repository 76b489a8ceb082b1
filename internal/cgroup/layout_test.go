package cgroup

import (
	"math"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/errdefs"
)

const (
	hybridMountinfo = `22 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:29 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
33 30 0:30 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
35 30 0:32 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
36 30 0:33 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
37 30 0:34 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
38 30 0:35 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
39 30 0:36 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	unifiedMountinfo = `21 26 0:20 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
25 21 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`
	v1Mountinfo = `24 18 0:20 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
25 24 0:21 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,xattr,release_agent=/lib/systemd/systemd-cgroups-agent,name=systemd
28 24 0:24 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:13 master:2 - cgroup cgroup rw,cpu,cpuacct
29 24 0:25 / /sys/fs/cgroup/net_cls,net_prio rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,net_cls,net_prio
30 24 0:26 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,memory
31 24 0:27 /sub /mnt/memory\040copy rw,relatime - cgroup cgroup rw,memory
`
)

func TestParseMountinfo(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want Layout
	}{{
		name: "hybrid",
		in:   hybridMountinfo,
		want: Layout{Mode: Hybrid, Unified: "/sys/fs/cgroup/unified", V1: map[string]string{
			"cpu": "/sys/fs/cgroup/cpu", "cpuacct": "/sys/fs/cgroup/cpuacct",
			"cpuset": "/sys/fs/cgroup/cpuset", "memory": "/sys/fs/cgroup/memory",
			"devices": "/sys/fs/cgroup/devices", "freezer": "/sys/fs/cgroup/freezer",
			"blkio": "/sys/fs/cgroup/blkio", "pids": "/sys/fs/cgroup/pids",
		}},
	}, {
		name: "unified",
		in:   unifiedMountinfo,
		want: Layout{Mode: Unified, Unified: "/sys/fs/cgroup"},
	}, {
		name: "v1 co-mounted, first mount of a controller counts",
		in:   v1Mountinfo,
		want: Layout{Mode: V1, V1: map[string]string{
			"cpu": "/sys/fs/cgroup/cpu,cpuacct", "cpuacct": "/sys/fs/cgroup/cpu,cpuacct",
			"net_cls": "/sys/fs/cgroup/net_cls,net_prio", "net_prio": "/sys/fs/cgroup/net_cls,net_prio",
			"memory": "/sys/fs/cgroup/memory",
		}},
	}, {
		name: "escaped mountpoint",
		in:   `31 24 0:27 / /mnt/my\040cg\134x rw - cgroup cgroup rw,pids` + "\n",
		want: Layout{Mode: V1, V1: map[string]string{"pids": `/mnt/my cg\x`}},
	}, {
		name: "cgroup2 hidden by a later mount on it",
		in: `25 21 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw
26 25 0:23 / /sys/fs/cgroup rw - tmpfs tmpfs rw
27 26 0:24 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
`,
		want: Layout{Mode: V1, V1: map[string]string{"pids": "/sys/fs/cgroup/pids"}},
	}, {
		name: "hidden by a later mount on a parent directory",
		in: `27 26 0:24 / /a/b/pids rw - cgroup cgroup rw,pids
28 26 0:25 / /a/b/memory rw - cgroup cgroup rw,memory
29 1 0:26 / /a rw - tmpfs tmpfs rw
30 1 0:27 / /a/bc rw - tmpfs tmpfs rw
`,
		want: Layout{},
	}, {
		name: "a dash among the first six fields is not the separator",
		in:   "31 24 - / /mnt rw x - cgroup cgroup rw,pids\n",
		want: Layout{Mode: V1, V1: map[string]string{"pids": "/mnt"}},
	}, {
		name: "optional fields and blank lines",
		in:   "\n40 30 0:37 / /u rw,relatime shared:5 master:1 propagate_from:2 - cgroup2 cgroup2 rw\n\n",
		want: Layout{Mode: Unified, Unified: "/u"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseMountinfo(strings.NewReader(tt.in))
			if tt.want.Mode == 0 {
				if !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
					t.Fatalf("ParseMountinfo() = %+v, %v, want ErrFailedPrecondition", got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseMountinfo() error = %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseMountinfo() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseMountinfoMalformed(t *testing.T) {
	for _, in := range []string{
		"31 24 0:27 / /mnt rw cgroup cgroup rw,pids\n",  // no separator
		"31 24 0:27 / /mnt rw - cgroup cgroup\n",        // no super options
		"31 24 0:27 / mnt rw - cgroup cgroup rw,pids\n", // relative mountpoint
		"31 24 0:27 / /mnt - cgroup cgroup rw,pids\n",   // too few fields before the separator
		strings.Repeat("x", maxMountinfoLine+1) + "\n",  // too long
	} {
		if l, err := ParseMountinfo(strings.NewReader(in)); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParseMountinfo(%.50q) = %+v, %v, want ErrInvalidArgument", in, l, err)
		}
	}
}

func FuzzParseMountinfo(f *testing.F) {
	for _, s := range []string{hybridMountinfo, unifiedMountinfo, v1Mountinfo,
		`1 2 3:4 / /a\040b\ rw - cgroup x rw,cpu,memory` + "\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		l, err := ParseMountinfo(strings.NewReader(in))
		if err != nil {
			if l.Mode != 0 {
				t.Errorf("ParseMountinfo(%q) = %+v with error %v, want zero Layout", in, l, err)
			}
			return
		}
		clean := func(p string) bool { return strings.HasPrefix(p, "/") && path.Clean(p) == p }
		switch {
		case l.Mode == Hybrid && len(l.V1) > 0 && l.Unified != "":
		case l.Mode == V1 && len(l.V1) > 0 && l.Unified == "":
		case l.Mode == Unified && len(l.V1) == 0 && l.Unified != "":
		default:
			t.Fatalf("ParseMountinfo(%q) = %+v, an inconsistent mode", in, l)
		}
		if l.Unified != "" && !clean(l.Unified) {
			t.Errorf("ParseMountinfo(%q).Unified = %q, want a clean absolute path", in, l.Unified)
		}
		for c, mp := range l.V1 {
			if !v1Controllers[c] || !clean(mp) {
				t.Errorf("ParseMountinfo(%q).V1[%q] = %q, want a known controller at a clean absolute path", in, c, mp)
			}
		}
	})
}

func TestLayoutAt(t *testing.T) {
	mk := func(t *testing.T, files map[string]string) string {
		root := t.TempDir()
		for f, data := range files {
			p := filepath.Join(root, f)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return root
	}
	t.Run("hybrid", func(t *testing.T) {
		root := mk(t, map[string]string{
			"cpu,cpuacct/cgroup.procs":   "",
			"memory/cgroup.procs":        "",
			"systemd/cgroup.procs":       "", // a named hierarchy, not a controller
			"notcgroup/file":             "",
			"unified/cgroup.procs":       "",
			"unified/cgroup.controllers": "hugetlb\n",
		})
		if err := os.Symlink("cpu,cpuacct", filepath.Join(root, "cpu")); err != nil {
			t.Fatal(err)
		}
		got, err := LayoutAt(root)
		if err != nil {
			t.Fatalf("LayoutAt() error = %v", err)
		}
		want := Layout{Mode: Hybrid, Unified: filepath.Join(root, "unified"),
			UnifiedControllers: []string{"hugetlb"},
			V1: map[string]string{
				"cpu":     filepath.Join(root, "cpu,cpuacct"),
				"cpuacct": filepath.Join(root, "cpu,cpuacct"),
				"memory":  filepath.Join(root, "memory"),
			}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("LayoutAt() mismatch (-want +got):\n%s", diff)
		}
	})
	t.Run("unified root", func(t *testing.T) {
		root := mk(t, map[string]string{"cgroup.controllers": "cpu io memory pids\n", "cgroup.procs": ""})
		got, err := LayoutAt(root)
		want := Layout{Mode: Unified, Unified: root, UnifiedControllers: []string{"cpu", "io", "memory", "pids"}}
		if err != nil || !cmp.Equal(want, got) {
			t.Errorf("LayoutAt() = %+v, %v, want %+v", got, err, want)
		}
	})
	t.Run("empty", func(t *testing.T) {
		if l, err := LayoutAt(t.TempDir()); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("LayoutAt(empty) = %+v, %v, want ErrFailedPrecondition", l, err)
		}
	})
}

func TestValidName(t *testing.T) {
	for name, want := range map[string]bool{
		"sb-1": true, "a": true, "a.b_c-9": true, "...": true, strings.Repeat("a", 128): true,
		"": false, ".": false, "..": false, "a/b": false, "../x": false, "/x": false,
		"A": false, "a b": false, "a\x00": false, "é": false, strings.Repeat("a", 129): false,
	} {
		if got := ValidName(name); got != want {
			t.Errorf("ValidName(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestResourcesValidate(t *testing.T) {
	for _, tt := range []struct {
		r    Resources
		want error
	}{
		{Resources{}, nil},
		{Resources{MemoryBytes: 1 << 30, CPUs: 0.5, Pids: 10}, nil},
		{Resources{MemoryBytes: -1}, errdefs.ErrInvalidArgument},
		{Resources{Pids: -1}, errdefs.ErrInvalidArgument},
		{Resources{CPUs: -0.1}, errdefs.ErrInvalidArgument},
		{Resources{CPUs: 1 << 20}, errdefs.ErrInvalidArgument},
		{Resources{CPUs: math.NaN()}, errdefs.ErrInvalidArgument},
		{Resources{CPUs: math.Inf(1)}, errdefs.ErrInvalidArgument},
	} {
		if err := tt.r.Validate(); errdefs.Kind(err) != tt.want {
			t.Errorf("%+v.Validate() = %v, want %v", tt.r, err, tt.want)
		}
	}
}
