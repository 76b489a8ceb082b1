package doctor

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/rootfs"
	"github.com/dsecproject/dsec/internal/testenv"
)

var (
	buildMu sync.Mutex
	built   = map[string]string{} // cgo setting → binary
)

// initBinary returns a static binary built from testdata/staticinit: with
// cgo it carries nsexec's sandbox init like `make build`'s dsec, without
// it does not. With cgo, the platform binary of $DSEC_BIN (set by make
// test-root) is used instead when set.
func initBinary(t *testing.T, cgo bool) string {
	t.Helper()
	if cgo && os.Getenv("DSEC_BIN") != "" {
		return testenv.NodeBinary(t)
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	key := fmt.Sprint(cgo)
	if p, ok := built[key]; ok {
		return p
	}
	dir, err := os.MkdirTemp("", "dsec-doctor-test-")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "staticinit")
	args := []string{"build", "-o", out}
	env := append(os.Environ(), "CGO_ENABLED=0")
	if cgo {
		args = append(args, "-tags", "netgo,osusergo", "-ldflags", "-linkmode external -extldflags -static")
		env = append(os.Environ(), "CGO_ENABLED=1")
	}
	cmd := exec.Command("go", append(args, "./internal/doctor/testdata/staticinit")...)
	cmd.Dir, cmd.Env = testenv.ModuleRoot(), env
	if b, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		t.Fatalf("build testdata/staticinit (cgo %v): %v\n%s", cgo, err, b)
	}
	built[key] = out
	atExit = append(atExit, func() { os.RemoveAll(dir) })
	return out
}

// traversableDir returns a new directory, which it and the test's own
// temporary directory above it leave open to others (t.TempDir's are 0700),
// as /var/lib is.
func traversableDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// realEnv is the Env of the real-machine tests: a fresh state dir, the
// static init binary and a free API address.
func realEnv(t *testing.T) Env {
	t.Helper()
	testenv.RequireRoot(t)
	return Env{
		StateDir: filepath.Join(traversableDir(t), "state"),
		Binary:   initBinary(t, true),
		Listen:   freeAddr(t),
	}.withDefaults()
}

// TestChecksOnThisMachine runs every check for real. The machine tests run
// on has everything dsec needs; only its open-file limit may be low.
func TestChecksOnThisMachine(t *testing.T) {
	env := realEnv(t)
	if err := os.Mkdir(env.StateDir, 0o711); err != nil {
		t.Fatal(err)
	}
	var nofile unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, c := range Checks() {
		if names[c.Name] {
			t.Errorf("check %q is listed twice", c.Name)
		}
		names[c.Name] = true
		t.Run(c.Name, func(t *testing.T) {
			want := OK
			if c.Name == "open files" && nofile.Max < 65536 {
				want = Warn
			}
			got := c.Run(t.Context(), env)
			if got.Status != want || got.Detail == "" {
				t.Errorf("%s.Run() = %+v, want %v with a detail", c.Name, got, want)
			}
			if want == OK && got.Fix != "" {
				t.Errorf("%s.Run() = %+v, want no fix when OK", c.Name, got)
			}
			t.Logf("%s %s: %s", got.Status.Symbol(), c.Name, got.Detail)
		})
	}
	entries, err := os.ReadDir(env.StateDir)
	if err != nil || len(entries) != 0 {
		t.Errorf("state dir after the checks holds %v (%v), want nothing", entries, err)
	}
}

// mountTable is the part of this process's mount table the probes could
// change: the mounts under their directories, which are all named
// dsec-doctor. Other tests running at the same time (mmdebstrap in
// internal/debian) mount elsewhere, and those mounts are not compared.
func mountTable(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var mine []string
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) > 4 && strings.Contains(f[4], "dsec-doctor") {
			mine = append(mine, line)
		}
	}
	return strings.Join(mine, "")
}

func TestMountProbesLeaveNothing(t *testing.T) {
	env := realEnv(t)
	if err := os.Mkdir(env.StateDir, 0o711); err != nil {
		t.Fatal(err)
	}
	before := mountTable(t)
	var seen []string
	for _, check := range []func(context.Context, Env) Result{checkEROFSMount, checkIDMappedMount, checkOverlayOnIDMap} {
		if r := check(t.Context(), env); r.Status != OK {
			t.Fatalf("probe = %+v, want OK", r)
		}
		if after := mountTable(t); after != before {
			t.Errorf("mount table changed by a probe:\nbefore:\n%s\nafter:\n%s", before, after)
		}
		ents, _ := os.ReadDir(env.StateDir)
		for _, e := range ents {
			seen = append(seen, e.Name())
		}
	}
	if len(seen) > 0 {
		t.Errorf("probes left %q in the state dir", seen)
	}
	// The probes' temporary directory goes to the temp dir when the state
	// dir does not exist yet; nothing is left there either.
	env.StateDir = filepath.Join(env.StateDir, "missing")
	pattern := filepath.Join(os.TempDir(), ".dsec-doctor-*")
	old, _ := filepath.Glob(pattern)
	if r := checkOverlayOnIDMap(t.Context(), env); r.Status != OK {
		t.Fatalf("checkOverlayOnIDMap(no state dir) = %+v, want OK", r)
	}
	if now, _ := filepath.Glob(pattern); len(now) > len(old) {
		t.Errorf("probe left %q in %s", now, os.TempDir())
	}
}

func TestMountProbeFails(t *testing.T) {
	env := realEnv(t)
	// A range the kernel refuses to map: the probe cannot make its user
	// namespace, and says so.
	env.IDMap = rootfs.IDMap{HostID: 0, Size: 10}
	for _, check := range []func(context.Context, Env) Result{checkIDMappedMount, checkOverlayOnIDMap, checkUserns} {
		r := check(t.Context(), env)
		if r.Status != Fail || !strings.Contains(r.Fix, "uid range") || !strings.Contains(r.Detail, "uid range 0+10") {
			t.Errorf("probe with uid range 0+10 = %+v, want a failure naming the range, with a fix pointing at it", r)
		}
	}
	if r := checkUIDRange(t.Context(), env); r.Status != Fail || !strings.Contains(r.Fix, "--uid-base") {
		t.Errorf("checkUIDRange(0+10) = %+v, want a failure with a --uid-base fix", r)
	}

	// No helper to make the user namespace with: the probe fails after it
	// built its image, and removes it.
	env = realEnv(t)
	if err := os.Mkdir(env.StateDir, 0o711); err != nil {
		t.Fatal(err)
	}
	env.Binary = filepath.Join(t.TempDir(), "no-dsec")
	for _, check := range []func(context.Context, Env) Result{checkIDMappedMount, checkOverlayOnIDMap, checkUserns} {
		r := check(t.Context(), env)
		if r.Status != Fail || r.Fix == "" || !strings.Contains(r.Detail, "no such file") {
			t.Errorf("probe with a missing dsec binary = %+v, want a failure saying so, with a fix", r)
		}
	}
	if ents, err := os.ReadDir(env.StateDir); err != nil || len(ents) > 0 {
		t.Errorf("failed probes left %v (%v) in the state dir, want nothing", ents, err)
	}
}

func TestStateDir(t *testing.T) {
	testenv.RequireRoot(t) // root traverses anything: the check reads modes, not access
	base := traversableDir(t)
	mk := func(p string, mode os.FileMode) string {
		t.Helper()
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	locked := mk(filepath.Join(base, "locked"), 0o700)
	mk(filepath.Join(locked, "state"), 0o711)
	open := mk(filepath.Join(base, "open"), 0o711)
	private := mk(filepath.Join(base, "private"), 0o700)
	link := filepath.Join(base, "link")
	if err := os.Symlink(filepath.Join(locked, "state"), link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dir string
		want      want
	}{
		{"under a 0700 directory", filepath.Join(locked, "state"), want{Fail, locked + " (0700) cannot be traversed", "chmod o+x " + locked}},
		{"missing under a 0700 directory", filepath.Join(locked, "new"), want{Fail, locked + " (0700)", "chmod o+x " + locked}},
		{"symlink into a 0700 directory", link, want{Fail, locked + " (0700)", "chmod o+x " + locked}},
		{"exists", open, want{OK, "(0711), and every directory above", ""}},
		{"itself 0700", private, want{OK, "dsec up makes it 0711", ""}},
		{"missing", filepath.Join(open, "state"), want{OK, "does not exist yet", ""}},
		{"missing two levels", filepath.Join(open, "a", "state"), want{Warn, "without access for others", "mkdir -p -m 0711 " + filepath.Join(open, "a")}},
		{"a file", filepath.Join(file, "state"), want{Fail, "not a directory", "--state-dir"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.want.check(t, fmt.Sprintf("checkStateDir(%s)", tc.dir), checkStateDir(t.Context(), Env{StateDir: tc.dir}))
		})
	}
	if r := checkDiskSpace(t.Context(), Env{StateDir: filepath.Join(open, "a", "b")}); r.Status == Fail || !strings.Contains(r.Detail, "free for "+open) {
		t.Errorf("checkDiskSpace(missing) = %+v, want the space of %s", r, open)
	}
}

func TestBinaryResult(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		want       want
	}{
		{"static with init", initBinary(t, true), want{OK, "static and carries the sandbox init", ""}},
		{"static without cgo", initBinary(t, false), want{Fail, "no sandbox init", "make build"}},
		{"dynamic", self, want{Fail, "dynamically linked (through /", "make build"}}, // go test links cgo binaries dynamically
		{"missing", filepath.Join(t.TempDir(), "dsec"), want{Fail, "no such file", "make build"}},
		{"not ELF", "/proc/self/status", want{Fail, "read /proc/self/status", "make build"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.want.check(t, fmt.Sprintf("binaryResult(%s)", tc.path), binaryResult(tc.path))
		})
	}
}

func TestRuntimeMissing(t *testing.T) {
	r := checkRuntime(t.Context(), Env{Runtime: filepath.Join(t.TempDir(), "crun")})
	want{Fail, "not found", "apt-get install crun"}.check(t, "checkRuntime(missing)", r)
}

func TestAPIAddr(t *testing.T) {
	serve := func(h http.HandlerFunc) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: h}
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Serve(ln) }()
		t.Cleanup(func() { srv.Close(); <-done })
		return ln.Addr().String()
	}
	dsec := serve(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			fmt.Fprintln(w, "ok")
			return
		}
		http.NotFound(w, r)
	})
	starting := serve(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "starting", http.StatusServiceUnavailable) })
	other := serve(http.NotFound)
	_, otherPort, _ := net.SplitHostPort(other)
	raw, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers HTTP
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	for _, tc := range []struct {
		name, addr string
		want       want
	}{
		{"free", freeAddr(t), want{OK, "is free", ""}},
		{"served by dsec", dsec, want{OK, "served by a running dsec (GET /healthz answers ok)", ""}},
		{"dsec starting", starting, want{OK, "starting", ""}},
		{"served by something else", other, want{Fail, "in use by another program (GET /healthz answers 404", "sport = :" + otherPort}},
		{"not HTTP", raw.Addr().String(), want{Fail, "in use by another program", "--listen"}},
		{"unspecified host, served by dsec", "0.0.0.0:" + dsec[strings.LastIndex(dsec, ":")+1:], want{OK, "served by a running dsec", ""}},
		{"no port", "127.0.0.1", want{Fail, "missing port", "--listen"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.want.check(t, fmt.Sprintf("checkAPIAddr(%s)", tc.addr), checkAPIAddr(t.Context(), Env{Listen: tc.addr}))
		})
	}
}

func TestNotRoot(t *testing.T) {
	if os.Geteuid() == 0 {
		r, ok := needRoot()
		if !ok || r != (Result{}) {
			t.Errorf("needRoot() as root = %+v, %v, want nothing, true", r, ok)
		}
		return
	}
	for _, check := range []func(context.Context, Env) Result{checkRoot, checkEROFSMount, checkIDMappedMount, checkOverlayOnIDMap} {
		if r := check(t.Context(), Env{}.withDefaults()); r.Status != Fail || !strings.Contains(r.Fix, "sudo") {
			t.Errorf("probe as uid %d = %+v, want a failure saying to use sudo", os.Geteuid(), r)
		}
	}
}
