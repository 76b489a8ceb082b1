package diskquota

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/rootfs"
	"github.com/dsecproject/dsec/internal/testenv"
)

// sandboxUID is the host uid of a sandbox's root: the files sandboxes write
// belong to uids like it.
const sandboxUID = 1000000000

// The helper mode of the test binary: with fillEnv set it writes
// $fillEnv (a file) up to $fillMaxEnv bytes or the first error and prints
// the result as JSON. Tests run it under another uid.
const (
	fillEnv    = "DISKQUOTA_TEST_FILL"
	fillMaxEnv = "DISKQUOTA_TEST_FILL_MAX"
)

func TestMain(m *testing.M) {
	if path := os.Getenv(fillEnv); path != "" {
		limit, _ := strconv.ParseInt(os.Getenv(fillMaxEnv), 10, 64)
		n, err := fill(path, limit)
		r := fillResult{Written: n}
		var errno syscall.Errno
		if errors.As(err, &errno) {
			r.Errno = int(errno)
		} else if err != nil {
			r.Other = err.Error()
		}
		json.NewEncoder(os.Stdout).Encode(r)
		os.Exit(0)
	}
	code := m.Run()
	if helperPath != "" {
		os.RemoveAll(filepath.Dir(helperPath))
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

type fillResult struct {
	Written int64
	Errno   int
	Other   string
}

// fill writes path with up to limit bytes in 1 MiB writes and syncs it; it
// returns how much was written and the first error.
func fill(path string, limit int64) (int64, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, err
	}
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	var n int64
	for n < limit {
		w, err := f.Write(buf[:min(int64(len(buf)), limit-n)])
		n += int64(w)
		if err != nil {
			f.Close()
			return n, err
		}
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return n, err
}

var (
	helperOnce sync.Once
	helperPath string
	helperErr  error
)

// fillAs runs fill(path, limit) as uid (and gid uid) in a copy of the test
// binary that uid can run.
func fillAs(t *testing.T, uid int, path string, limit int64) (int64, error) {
	t.Helper()
	helperOnce.Do(func() {
		dir, err := os.MkdirTemp("", "diskquota-helper-")
		if err != nil {
			helperErr = err
			return
		}
		helperPath = filepath.Join(dir, "helper")
		helperErr = copyFile(os.Args[0], helperPath, 0o755)
		if helperErr == nil {
			helperErr = os.Chmod(dir, 0o755)
		}
	})
	if helperErr != nil {
		t.Fatalf("copy test binary: %v", helperErr)
	}
	cmd := exec.Command(helperPath, "-test.run=^$")
	cmd.Env = append(os.Environ(), fillEnv+"="+path, fillMaxEnv+"="+strconv.FormatInt(limit, 10))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("fill %s as uid %d: %v", path, uid, err)
	}
	var r fillResult
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("fill %s as uid %d: %v (output %q)", path, uid, err, out)
	}
	switch {
	case r.Other != "":
		return r.Written, errors.New(r.Other)
	case r.Errno != 0:
		return r.Written, syscall.Errno(r.Errno)
	}
	return r.Written, nil
}

func copyFile(from, to string, mode os.FileMode) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	_, err = io.Copy(dst, src)
	return errors.Join(err, dst.Close())
}

// modes returns the modes this kernel can test.
func modes() []Mode { return []Mode{ModeImage, ModeProject} }

// requireMode skips t when the kernel cannot do mode; a kernel without XFS
// quota support skips ModeProject even in CI, where ModeImage covers the
// same behaviour.
func requireMode(t *testing.T, mode Mode) {
	t.Helper()
	testenv.RequireRoot(t)
	if mode == ModeProject {
		if !xfsQuotaSupported() {
			t.Skip("this kernel's XFS has no quota support (CONFIG_XFS_QUOTA); ModeImage covers the same tests")
		}
		_, err := exec.LookPath("mkfs.xfs")
		testenv.Require(t, err == nil, "mkfs.xfs not installed (apt-get install xfsprogs)")
	}
	_, err := exec.LookPath("mkfs.ext4")
	testenv.Require(t, err == nil, "mkfs.ext4 not installed (apt-get install e2fsprogs)")
}

// testDir returns a temporary directory that other uids can traverse, and
// checks when the test ends that nothing is mounted under it and no loop
// device is bound to a file in it.
func testDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if m := testenv.MountsUnder(t, dir); len(m) > 0 {
			t.Errorf("mounts left under %s: %q", dir, m)
			for i := len(m) - 1; i >= 0; i-- {
				unix.Unmount(m[i], unix.MNT_DETACH)
			}
		}
		if l := loopsLeftUnder(t, dir); len(l) > 0 {
			t.Errorf("loop devices left bound to files under %s: %q", dir, l)
		}
	})
	return dir
}

// loopsUnder lists the loop devices bound to a file under dir.
// loopsLeftUnder is loopsUnder once the kernel has had time to unbind
// autoclear loop devices: it does so after the last reference to the file
// system on them goes, which after a lazy unmount happens asynchronously.
func loopsLeftUnder(t *testing.T, dir string) []string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		l := loopsUnder(t, dir)
		if len(l) == 0 || time.Now().After(deadline) {
			return l
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func loopsUnder(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if p := strings.TrimSpace(string(b)); strings.HasPrefix(p, dir+"/") {
			got = append(got, filepath.Base(filepath.Dir(filepath.Dir(f)))+"="+p)
		}
	}
	return got
}

// config returns the Config of a test file system in dir.
func config(dir string, mode Mode) Config {
	return Config{
		Mode:       mode,
		Image:      filepath.Join(dir, "disk.img"),
		Size:       1 << 30,
		MountPoint: filepath.Join(dir, "mnt"),
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// open opens cfg and closes it when the test ends.
func open(t *testing.T, cfg Config) *FS {
	t.Helper()
	f, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Open(%+v) = %v", cfg, err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
	})
	if f.Mode() != cfg.Mode {
		t.Fatalf("Open(%+v).Mode() = %q, want %q", cfg, f.Mode(), cfg.Mode)
	}
	return f
}

func create(t *testing.T, f *FS, name string, bytes, inodes int64) Dir {
	t.Helper()
	d, err := f.Create(context.Background(), name, bytes, inodes)
	if err != nil {
		t.Fatalf("Create(%q, %d, %d) = %v", name, bytes, inodes, err)
	}
	return d
}

// checkFull fills file as uid up to twice limit and checks that the writes
// stop with ENOSPC or EDQUOT within slack bytes under limit.
func checkFull(t *testing.T, uid int, file string, limit, slack int64) error {
	t.Helper()
	var n int64
	var err error
	if uid == 0 {
		n, err = fill(file, 2*limit)
	} else {
		n, err = fillAs(t, uid, file, 2*limit)
	}
	if !IsFull(err) {
		t.Fatalf("fill(%q, %d) as uid %d = %d, %v, want ENOSPC or EDQUOT", file, 2*limit, uid, n, err)
	}
	if n > limit || n < limit-slack {
		t.Errorf("fill(%q) as uid %d wrote %d bytes before %v, want %d to %d", file, uid, n, err, limit-slack, limit)
	}
	t.Logf("uid %d: wrote %d of %d bytes, then %v", uid, n, limit, err)
	return err
}

// slack is how far under its limit a full directory may be: the upper and
// work directories, and in ModeImage the file system's own metadata.
func slack(mode Mode, limit int64) int64 {
	if mode == ModeImage {
		return limit/10 + 1<<20
	}
	return 1 << 20
}

func checkUsage(t *testing.T, f *FS, name string, low, high int64) {
	t.Helper()
	b, _, err := f.Usage(name)
	if err != nil {
		t.Fatalf("Usage(%q) = %v", name, err)
	}
	if b < low || b > high {
		t.Errorf("Usage(%q) = %d bytes, want %d to %d", name, b, low, high)
	}
}

func TestEnforce(t *testing.T) {
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			requireMode(t, mode)
			f := open(t, config(testDir(t), mode))
			const limA, limB = 20 << 20, 40 << 20
			a := create(t, f, "a", limA, 0)
			b := create(t, f, "b", limB, 0)

			errA := checkFull(t, 0, filepath.Join(a.Upper, "big"), limA, slack(mode, limA))
			checkUsage(t, f, "a", limA-slack(mode, limA), limA+1<<20)

			// b is unaffected by a being full, and limits a sandbox's uid
			// as it limits root.
			if err := os.Chown(b.Upper, sandboxUID, sandboxUID); err != nil {
				t.Fatal(err)
			}
			if n, err := fillAs(t, sandboxUID, filepath.Join(b.Upper, "small"), 10<<20); err != nil {
				t.Fatalf("fill(%q, 10 MiB) as uid %d = %d, %v, want no error while a is full", "b/upper/small", sandboxUID, n, err)
			}
			os.Remove(filepath.Join(b.Upper, "small"))
			errB := checkFull(t, sandboxUID, filepath.Join(b.Upper, "big"), limB, slack(mode, limB))
			checkUsage(t, f, "b", limB-slack(mode, limB), limB+1<<20)
			if !errors.Is(errA, errB) {
				t.Errorf("root got %v, uid %d got %v, want the same error", errA, sandboxUID, errB)
			}
		})
	}
}

func TestInodeLimit(t *testing.T) {
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			requireMode(t, mode)
			f := open(t, config(testDir(t), mode))
			const limit = 200
			d := create(t, f, "c", 20<<20, limit)
			var n int
			var err error
			for n = 0; n < 2*limit; n++ {
				if err = os.WriteFile(filepath.Join(d.Upper, strconv.Itoa(n)), nil, 0o644); err != nil {
					break
				}
			}
			if !IsFull(err) {
				t.Fatalf("creating %d files with an inode limit of %d = %v, want ENOSPC or EDQUOT", n, limit, err)
			}
			// ext4 rounds the inode count up to fill its inode table blocks.
			if n < limit-20 || n > limit+limit/2 {
				t.Errorf("created %d files with an inode limit of %d before %v", n, limit, err)
			}
			_, inodes, err := f.Usage("c")
			if err != nil || inodes < int64(n) {
				t.Errorf("Usage(%q) = %d inodes, %v, want at least %d", "c", inodes, err, n)
			}
		})
	}
}

// TestOverlay writes through an overlay whose upper and work are in a
// limited directory, as a sandbox does.
func TestOverlay(t *testing.T) {
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			requireMode(t, mode)
			dir := testDir(t)
			f := open(t, config(dir, mode))
			const limit = 20 << 20
			d := create(t, f, "box", limit, 0)
			if err := os.Chown(d.Upper, sandboxUID, sandboxUID); err != nil {
				t.Fatal(err)
			}
			lower := filepath.Join(dir, "lower")
			merged := filepath.Join(dir, "merged")
			for _, p := range []string{lower, merged} {
				if err := os.Mkdir(p, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(lower, "hello"), []byte("hi\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			lowerDir, err := os.Open(lower)
			if err != nil {
				t.Fatal(err)
			}
			defer lowerDir.Close()
			if err := rootfs.Overlay(merged, d.Upper, d.Work, []*os.File{lowerDir}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := unix.Unmount(merged, 0); err != nil && !errors.Is(err, unix.EINVAL) {
					t.Errorf("unmount overlay: %v", err)
				}
			})

			err = checkFull(t, sandboxUID, filepath.Join(merged, "big"), limit, slack(mode, limit))
			t.Logf("%s: a sandbox past its limit gets %v (errno %d)", mode, err, err)
			checkUsage(t, f, "box", limit-slack(mode, limit), limit+1<<20)
			if b, err := os.ReadFile(filepath.Join(merged, "hello")); err != nil || string(b) != "hi\n" {
				t.Errorf("ReadFile(merged/hello) = %q, %v, want %q", b, err, "hi\n")
			}
			// Remove works under a live overlay; what the overlay holds goes
			// when it is unmounted.
			if err := f.Remove(context.Background(), "box"); err != nil {
				t.Errorf("Remove(%q) under a mounted overlay = %v", "box", err)
			}
			if got, err := f.List(); err != nil || len(got) != 0 {
				t.Errorf("List() after Remove = %v, %v, want none", got, err)
			}
			if err := unix.Unmount(merged, 0); err != nil {
				t.Fatalf("unmount overlay: %v", err)
			}
			if l := loopsLeftUnder(t, dir); len(l) > 0 {
				t.Errorf("loop devices after Remove and unmounting the overlay: %q", l)
			}
		})
	}
}

func TestRemove(t *testing.T) {
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			requireMode(t, mode)
			f := open(t, config(testDir(t), mode))
			ctx := context.Background()
			const limit = 20 << 20
			d := create(t, f, "a", limit, 0)
			checkFull(t, 0, filepath.Join(d.Upper, "big"), limit, slack(mode, limit))
			if err := f.Remove(ctx, "a"); err != nil {
				t.Fatalf("Remove(%q) = %v", "a", err)
			}
			if _, err := os.Stat(d.Path); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("Stat(%q) after Remove = %v, want not exist", d.Path, err)
			}
			if _, _, err := f.Usage("a"); !errdefs.Is(err, errdefs.ErrNotFound) {
				t.Errorf("Usage(%q) after Remove = %v, want NotFound", "a", err)
			}
			if mode == ModeProject {
				q, err := getProjectQuota(int(f.root.Fd()), d.ProjectID)
				if err == nil && (q.bcount != 0 || q.blkHardlimit != 0) {
					t.Errorf("project %d after Remove: %d blocks used, limit %d, want 0 and 0", d.ProjectID, q.bcount, q.blkHardlimit)
				}
			}
			if err := f.Remove(ctx, "a"); err != nil {
				t.Errorf("Remove(%q) again = %v, want nil", "a", err)
			}
			// The space is free again: a new directory of the same name
			// fills to its whole limit.
			d = create(t, f, "a", limit, 0)
			if n, err := fill(filepath.Join(d.Upper, "f"), limit-slack(mode, limit)); err != nil {
				t.Errorf("fill after Remove and Create = %d, %v, want no error", n, err)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			requireMode(t, mode)
			f, err := Open(context.Background(), config(testDir(t), mode))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			create(t, f, "a", 0, 0)
			tests := []struct {
				op   string
				err  error
				want error
			}{
				{"Create(a) again", second(f.Create(ctx, "a", 0, 0)), errdefs.ErrAlreadyExists},
				{"Create(../x)", second(f.Create(ctx, "../x", 0, 0)), errdefs.ErrInvalidArgument},
				{"Create(small)", second(f.Create(ctx, "small", 1<<20, 0)), errdefs.ErrInvalidArgument},
				{"Usage(nope)", third(f.Usage("nope")), errdefs.ErrNotFound},
				{"SetLimit(nope)", f.SetLimit(ctx, "nope", 0, 0), errdefs.ErrNotFound},
				{"Remove(nope)", f.Remove(ctx, "nope"), nil},
				{"Remove(.images)", f.Remove(ctx, ".images"), errdefs.ErrInvalidArgument},
			}
			for _, tt := range tests {
				if errdefs.Kind(tt.err) != tt.want {
					t.Errorf("%s = %v, want %v", tt.op, tt.err, tt.want)
				}
			}
			if err := f.Remove(ctx, "a"); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatalf("Close() = %v", err)
			}
			if err := f.Close(); err != nil {
				t.Errorf("Close() again = %v, want nil", err)
			}
			if _, err := f.Create(ctx, "b", 0, 0); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
				t.Errorf("Create after Close = %v, want FailedPrecondition", err)
			}
		})
	}
}

func second[T any](_ T, err error) error        { return err }
func third[T, U any](_ T, _ U, err error) error { return err }

func TestReopen(t *testing.T) {
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			requireMode(t, mode)
			dir := testDir(t)
			cfg := config(dir, mode)
			ctx := context.Background()
			f, err := Open(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			a := create(t, f, "a", 20<<20, 0)
			b := create(t, f, "b", 40<<20, 0)
			if err := os.WriteFile(filepath.Join(a.Upper, "keep"), []byte("kept"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := f.Remove(ctx, "b"); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatalf("Close() = %v", err)
			}
			if m := testenv.MountsUnder(t, dir); len(m) > 0 {
				t.Errorf("mounts after Close: %q", m)
			}
			if l := loopsUnder(t, dir); len(l) > 0 {
				t.Errorf("loop devices after Close: %q", l)
			}

			f = open(t, cfg)
			got, err := f.List()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]Dir{a}, got); diff != "" {
				t.Errorf("List() after reopening (-want +got):\n%s", diff)
			}
			if data, err := os.ReadFile(filepath.Join(a.Upper, "keep")); string(data) != "kept" {
				t.Errorf("ReadFile(a/upper/keep) after reopening = %q, %v, want %q", data, err, "kept")
			}
			checkFull(t, 0, filepath.Join(a.Upper, "big"), 20<<20, slack(mode, 20<<20))
			c := create(t, f, "c", 0, 0)
			if mode == ModeProject {
				for _, old := range []Dir{a, b} {
					if c.ProjectID <= old.ProjectID {
						t.Errorf("project id of a new directory after reopening = %d, want above %d (%s)", c.ProjectID, old.ProjectID, old.Name)
					}
				}
			}
		})
	}
}

// TestReuseMount opens the same configuration twice, as a keeper restarted
// in the same mount namespace does: the second Open uses the mounts and
// loop devices of the first.
func TestReuseMount(t *testing.T) {
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			requireMode(t, mode)
			dir := testDir(t)
			cfg := config(dir, mode)
			first, err := Open(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			d := create(t, first, "a", 0, 0)
			loops := loopsUnder(t, dir)
			mounts := testenv.MountsUnder(t, dir)

			second := open(t, cfg)
			if got := loopsUnder(t, dir); !cmp.Equal(got, loops) {
				t.Errorf("loop devices after a second Open = %q, want %q", got, loops)
			}
			if got := testenv.MountsUnder(t, dir); !cmp.Equal(got, mounts) {
				t.Errorf("mounts after a second Open = %q, want %q", got, mounts)
			}
			if got, err := second.List(); err != nil || !cmp.Equal(got, []Dir{d}) {
				t.Errorf("List() of the second FS = %v, %v, want %v", got, err, []Dir{d})
			}
			if _, _, err := second.Usage("a"); err != nil {
				t.Errorf("Usage(%q) of the second FS = %v", "a", err)
			}
		})
	}
}

func TestGrowImage(t *testing.T) {
	requireMode(t, ModeImage)
	f := open(t, config(testDir(t), ModeImage))
	ctx := context.Background()
	d := create(t, f, "a", 20<<20, 0)
	if !hasCapability(unix.CAP_SYS_RESOURCE) {
		// This machine's root lacks CAP_SYS_RESOURCE, which ext4 online
		// resize needs: the directory keeps its limit.
		if err := f.SetLimit(ctx, "a", 40<<20, 0); !errdefs.Is(err, errdefs.ErrFailedPrecondition) ||
			!strings.Contains(err.Error(), "CAP_SYS_RESOURCE") {
			t.Errorf("SetLimit(%q, 40 MiB) without CAP_SYS_RESOURCE = %v, want FailedPrecondition naming it", "a", err)
		}
		checkFull(t, 0, filepath.Join(d.Upper, "big"), 20<<20, slack(ModeImage, 20<<20))
		return
	}
	if err := f.SetLimit(ctx, "a", 40<<20, 0); err != nil {
		t.Fatalf("SetLimit(%q, 40 MiB) = %v", "a", err)
	}
	checkFull(t, 0, filepath.Join(d.Upper, "big"), 40<<20, slack(ModeImage, 40<<20))
	if err := f.SetLimit(ctx, "a", 20<<20, 0); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("SetLimit(%q, 20 MiB) after 40 MiB = %v, want FailedPrecondition", "a", err)
	}
	if err := f.SetLimit(ctx, "a", 40<<20, 1<<20); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("SetLimit(%q, 40 MiB, 1Mi inodes) = %v, want FailedPrecondition", "a", err)
	}
}

func TestSetLimitProject(t *testing.T) {
	requireMode(t, ModeProject)
	f := open(t, config(testDir(t), ModeProject))
	d := create(t, f, "a", 40<<20, 0)
	if err := f.SetLimit(context.Background(), "a", 20<<20, 0); err != nil {
		t.Fatalf("SetLimit(%q, 20 MiB) = %v", "a", err)
	}
	checkFull(t, 0, filepath.Join(d.Upper, "big"), 20<<20, slack(ModeProject, 20<<20))
}

func TestGrowProject(t *testing.T) {
	requireMode(t, ModeProject)
	dir := testDir(t)
	cfg := config(dir, ModeProject)
	f, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.Size = 2 << 30
	g := open(t, cfg)
	create(t, g, "a", 0, 0)
	var st unix.Statfs_t
	if err := unix.Statfs(cfg.MountPoint, &st); err != nil {
		t.Fatal(err)
	}
	if size := int64(st.Blocks) * st.Bsize; size < 3<<29 {
		t.Errorf("size of the file system after Open with Size 2 GiB = %d, want about 2 GiB", size)
	}
}

// TestProjectUnsupported checks that on a kernel without XFS quotas
// ModeProject fails with a message that names the way out, and leaves no
// image, mount or loop device behind.
func TestProjectUnsupported(t *testing.T) {
	testenv.RequireRoot(t)
	if xfsQuotaSupported() {
		t.Skip("this kernel's XFS has quota support")
	}
	_, err := exec.LookPath("mkfs.xfs")
	testenv.Require(t, err == nil, "mkfs.xfs not installed (apt-get install xfsprogs)")
	dir := testDir(t)
	cfg := config(dir, ModeProject)
	f, err := Open(context.Background(), cfg)
	if !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), string(ModeImage)) {
		if f != nil {
			f.Close()
		}
		t.Fatalf("Open(%+v) = %v, want FailedPrecondition naming mode %q", cfg, err, ModeImage)
	}
	if _, err := os.Stat(cfg.Image); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Stat(image) after a failed Open = %v, want not exist", err)
	}
}

func TestAutoMode(t *testing.T) {
	requireMode(t, ModeImage)
	want := ModeImage
	if xfsQuotaSupported() {
		want = ModeProject
	}
	cfg := config(testDir(t), ModeAuto)
	f, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Mode() != want {
		t.Errorf("Open(ModeAuto).Mode() = %q, want %q", f.Mode(), want)
	}
	create(t, f, "a", 0, 0)
	if want == ModeProject {
		return
	}
	// A second automatic Open follows the state the first left, even
	// where the kernel could do ModeProject.
	g, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if g.Mode() != ModeImage {
		t.Errorf("second Open(ModeAuto).Mode() = %q, want %q", g.Mode(), ModeImage)
	}
}

// TestConcurrentCreate creates directories at once: each gets its own
// project id.
func TestConcurrentCreate(t *testing.T) {
	for _, mode := range modes() {
		t.Run(string(mode), func(t *testing.T) {
			requireMode(t, mode)
			f := open(t, config(testDir(t), mode))
			const n = 8
			var wg sync.WaitGroup
			errs := make([]error, n)
			dirs := make([]Dir, n)
			for i := range n {
				wg.Go(func() {
					dirs[i], errs[i] = f.Create(context.Background(), fmt.Sprintf("c%d", i), 0, 0)
				})
			}
			wg.Wait()
			ids := map[uint32]bool{}
			for i, err := range errs {
				if err != nil {
					t.Errorf("Create(c%d) = %v", i, err)
					continue
				}
				if mode == ModeProject && ids[dirs[i].ProjectID] {
					t.Errorf("Create(c%d) got project id %d twice", i, dirs[i].ProjectID)
				}
				ids[dirs[i].ProjectID] = true
			}
			got, err := f.List()
			if err != nil || len(got) != n {
				t.Errorf("List() = %d dirs, %v, want %d", len(got), err, n)
			}
			// Directories made at once (in ModeImage, some from one
			// template) are independent.
			if err := os.WriteFile(filepath.Join(dirs[0].Upper, "only0"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			for _, d := range dirs[1:] {
				if _, err := os.Stat(filepath.Join(d.Upper, "only0")); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("Stat(%s/only0) = %v, want not exist", d.Name, err)
				}
			}
		})
	}
}

// TestProjectIDOnXFS sets project ids on plain XFS, which needs no quota
// support: what Create does to a directory, and what Usage reads back.
func TestProjectIDOnXFS(t *testing.T) {
	testenv.RequireRoot(t)
	_, err := exec.LookPath("mkfs.xfs")
	testenv.Require(t, err == nil, "mkfs.xfs not installed (apt-get install xfsprogs)")
	dir := testDir(t)
	img, mnt := filepath.Join(dir, "xfs.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := makeImage(context.Background(), execRun, img, 1<<30, "mkfs.xfs", mkfsXFSArgs(1<<30)...); err != nil {
		t.Fatal(err)
	}
	if _, err := mountImage(img, mnt, "xfs", "", nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unmount(mnt); err != nil {
			t.Error(err)
		}
	})
	if mounted, ours, err := mountedFrom(mnt, img); !mounted || !ours || err != nil {
		t.Errorf("mountedFrom(mnt, img) = %v, %v, %v, want true, true, nil", mounted, ours, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(mnt, &st); err != nil {
		t.Fatal(err)
	}
	loop := loopOf(&st)
	dio, err := os.ReadFile("/sys/block/" + loop + "/loop/dio")
	t.Logf("%s: direct I/O %q, %v", loop, strings.TrimSpace(string(dio)), err)

	root, err := os.Open(mnt)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	f := &FS{mnt: mnt, root: root}
	d := newDir(mnt, "a", 4242)
	if err := os.Mkdir(d.Path, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := setProject(d.Path, d.ProjectID); err != nil {
		t.Fatalf("setProject(%q, %d) = %v", d.Path, d.ProjectID, err)
	}
	if err := makeUpperWork(d); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.Upper, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{d.Path, d.Work, filepath.Join(d.Upper, "f")} {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		a, err := getFsxattr(fd)
		unix.Close(fd)
		if err != nil || a.projid != d.ProjectID {
			t.Errorf("project of %s = %d, %v, want %d", p, a.projid, err, d.ProjectID)
		}
	}
	if id, err := f.projectOf("a"); err != nil || id != d.ProjectID {
		t.Errorf("projectOf(%q) = %d, %v, want %d", "a", id, err, d.ProjectID)
	}
	got, err := f.listProject()
	if diff := cmp.Diff([]Dir{d}, got); err != nil || diff != "" {
		t.Errorf("listProject() = %v (-want +got):\n%s", err, diff)
	}
	if _, enforced, err := projectQuotaState(int(root.Fd())); err == nil && enforced {
		t.Errorf("projectQuotaState of XFS mounted without prjquota = enforced, want not")
	}
}

func TestFullError(t *testing.T) {
	pathErr := func(e error) error { return &os.PathError{Op: "write", Path: "/f", Err: e} }
	tests := []struct {
		err  error
		want error
	}{
		{pathErr(unix.ENOSPC), errdefs.ErrResourceExhausted},
		{pathErr(unix.EDQUOT), errdefs.ErrResourceExhausted},
		{fmt.Errorf("copy: %w", unix.ENOSPC), errdefs.ErrResourceExhausted},
		{pathErr(unix.EIO), errdefs.ErrInternal},
		{nil, nil},
	}
	for _, tt := range tests {
		got := FullError("sandbox x", tt.err)
		if errdefs.Kind(got) != tt.want {
			t.Errorf("FullError(%v) = %v, want kind %v", tt.err, got, tt.want)
		}
		if tt.want != errdefs.ErrResourceExhausted && got != tt.err {
			t.Errorf("FullError(%v) = %v, want it unchanged", tt.err, got)
		}
	}
}
