// Package sandboxtest is the conformance suite every sandbox.Backend
// passes: container today, and fncall, microvm, vm and gVisor as they land.
// Each case names the isolation tiers it belongs to and the capabilities
// it needs, so each backend runs the cases that apply to it. The suite
// drives real sandboxes. Fake (fake.go) is a hand-written backend in
// memory for the edge's own tests.
package sandboxtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// Fixture is what a backend's test gives the suite.
type Fixture struct {
	Backend sandbox.Backend
	// Layers of a busybox root file system (scripts/busybox-rootfs.sh).
	Layers []sandbox.Layer
	// Footprint describes what the backend holds on the host for its
	// sandboxes (mounts, cgroups, processes, directories), as comparable
	// strings; after a sandbox is deleted it must be what it was before.
	Footprint func(t *testing.T) []string
	// Pids reports how many processes a sandbox has now (for the pids
	// limit case); nil skips that check.
	Pids func(t *testing.T, id string) int64
	// Reopen closes the backend and opens a new one on the same state, as
	// a restarted edge would (for backends with sandbox.CapRestart).
	Reopen func(t *testing.T) sandbox.Backend
}

// Case is one conformance case.
type Case struct {
	Name string
	// Tiers are the isolation tiers the case belongs to; nil is every
	// tier. A tier's own policy (a container must refuse new user
	// namespaces) is checked for that tier only.
	Tiers []sandbox.Tier
	// Needs are the capabilities a backend must have to run the case.
	Needs []sandbox.Capability
	Run   func(t *testing.T, f *Fixture)
}

// sharedKernel are the tiers whose sandboxes run on the host's kernel.
var sharedKernel = []sandbox.Tier{sandbox.TierProcess, sandbox.TierContainer}

// Cases returns the conformance cases, each listed here once: no case
// registers itself.
func Cases() []Case {
	return slices.Concat(lifecycleCases(), execCases(), fileCases(), pauseCases())
}

func lifecycleCases() []Case {
	return []Case{
		{Name: "ExecStdoutStderrExit", Run: testExecStreams},
		{Name: "ExitCodesAndSignals", Run: testExitCodes},
		{Name: "CommandNotFound", Run: testNotFound},
		{Name: "EnvCwdUserHostname", Run: testEnvCwdUser},
		{Name: "FileRoundTrip", Run: testFileRoundTrip},
		{Name: "SymlinkEscapeRefused", Run: testSymlinkEscape},
		{Name: "KernelFilesRefused", Tiers: sharedKernel, Run: testKernelFiles},
		{Name: "MemoryLimitOOMKills", Needs: []sandbox.Capability{sandbox.CapMemoryLimit}, Run: testOOM},
		{Name: "PidsLimitStopsForkBomb", Needs: []sandbox.Capability{sandbox.CapPidsLimit}, Run: testForkBomb},
		{Name: "DeleteLeavesNothing", Run: testDeleteClean},
		{Name: "ExecOnDeletedIsNotFound", Run: testExecDeleted},
		{Name: "SurvivesRestart", Needs: []sandbox.Capability{sandbox.CapRestart}, Run: testRestart},
		{Name: "SpecNeedsRefused", Run: testSpecNeeds},
	}
}

// Applies reports whether case c runs on a backend of tier with caps, and
// if not, why.
func (c Case) Applies(tier sandbox.Tier, caps []sandbox.Capability) (bool, string) {
	if c.Tiers != nil && !slices.Contains(c.Tiers, tier) {
		return false, fmt.Sprintf("the case is for tiers %v, not %s", c.Tiers, tier)
	}
	for _, n := range c.Needs {
		if !slices.Contains(caps, n) {
			return false, fmt.Sprintf("the backend lacks %s", n)
		}
	}
	return true, ""
}

// Run runs every case that applies to the backend's tier and
// capabilities. newFixture is called once; cases share its backend.
func Run(t *testing.T, newFixture func(t *testing.T) *Fixture) {
	f := newFixture(t)
	d := f.Backend.Describe()
	caps := sandbox.Capabilities(f.Backend)
	for _, c := range Cases() {
		t.Run(c.Name, func(t *testing.T) {
			if ok, why := c.Applies(d.Tier, caps); !ok {
				t.Skipf("backend %s: %s", d.Name, why)
			}
			c.Run(t, f)
		})
	}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func newID(t *testing.T) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "conf-" + hex.EncodeToString(b)
}

// create makes a sandbox that is deleted when the test ends.
func create(t *testing.T, f *Fixture, res sandbox.Resources) string {
	t.Helper()
	ctx := ctxFor(t)
	id := newID(t)
	if res.MemoryBytes == 0 {
		res.MemoryBytes = 256 << 20
	}
	if res.CPUs == 0 {
		res.CPUs = 1
	}
	if res.Pids == 0 {
		res.Pids = 512
	}
	st, err := f.Backend.Create(ctx, sandbox.Spec{ID: id, Layers: f.Layers, Resources: res})
	if err != nil {
		t.Fatalf("Create(%s) = %v", id, err)
	}
	if st.State != sandbox.StateRunning {
		t.Fatalf("Create(%s) state = %q, want running", id, st.State)
	}
	t.Cleanup(func() {
		if err := f.Backend.Delete(context.Background(), id); err != nil {
			t.Errorf("Delete(%s) = %v", id, err)
		}
	})
	return id
}

// Result is a finished exec.
type Result struct {
	sandbox.ExitStatus
	Stdout, Stderr string
}

// execSeq numbers execs of tests that run them concurrently.
var execSeq atomic.Int64

// Exec runs argv in sandbox id and collects its output.
func Exec(t *testing.T, f *Fixture, id string, spec sandbox.ExecSpec) Result {
	t.Helper()
	r, err := ExecErr(ctxFor(t), f.Backend, id, spec)
	if err != nil {
		t.Fatalf("exec %q in %s: %v", spec.Argv, id, err)
	}
	return r
}

// ExecErr runs a command and collects its output.
func ExecErr(ctx context.Context, b sandbox.Backend, id string, spec sandbox.ExecSpec) (Result, error) {
	seq := execSeq.Add(1)
	if spec.ID == "" {
		spec.ID = fmt.Sprintf("t%d-%d", time.Now().UnixNano(), seq)
	}
	if spec.Env == nil {
		spec.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
	}
	if err := b.StartExec(ctx, id, spec); err != nil {
		return Result{}, err
	}
	st, err := b.WaitExec(ctx, id, spec.ID)
	if err != nil {
		return Result{}, err
	}
	var out [2]string
	for i, s := range []sandbox.Stream{sandbox.Stdout, sandbox.Stderr} {
		o, err := b.OpenOutput(ctx, id, spec.ID, s)
		if err != nil {
			return Result{}, err
		}
		n, err := o.Size()
		if err != nil {
			o.Close()
			return Result{}, err
		}
		buf := make([]byte, n)
		if _, err := o.ReadAt(buf, 0); err != nil && !errors.Is(err, io.EOF) {
			o.Close()
			return Result{}, err
		}
		o.Close()
		out[i] = string(buf)
	}
	return Result{ExitStatus: st, Stdout: out[0], Stderr: out[1]}, nil
}

func sh(cmd string) sandbox.ExecSpec { return sandbox.ExecSpec{Argv: []string{"/bin/sh", "-c", cmd}} }

func testExecStreams(t *testing.T, f *Fixture) {
	id := create(t, f, sandbox.Resources{})
	r := Exec(t, f, id, sh("echo out; echo err >&2; echo more out"))
	if r.Code != 0 || r.Signal != 0 {
		t.Errorf("exit = %d signal %d, want 0", r.Code, r.Signal)
	}
	if r.Stdout != "out\nmore out\n" || r.Stderr != "err\n" {
		t.Errorf("stdout %q stderr %q, want %q and %q", r.Stdout, r.Stderr, "out\nmore out\n", "err\n")
	}
	r = Exec(t, f, id, sandbox.ExecSpec{Argv: []string{"cat"}, Stdin: []byte("from stdin")})
	if r.Stdout != "from stdin" {
		t.Errorf("cat with stdin printed %q, want %q", r.Stdout, "from stdin")
	}
}

func testExitCodes(t *testing.T, f *Fixture) {
	id := create(t, f, sandbox.Resources{})
	for _, tt := range []struct {
		cmd          string
		code, signal int
	}{
		{"exit 0", 0, 0},
		{"exit 3", 3, 0},
		{"exit 255", 255, 0},
		{"kill -9 $$", 0, 9},
		{"kill -15 $$", 0, 15},
	} {
		r := Exec(t, f, id, sh(tt.cmd))
		if r.Code != tt.code || r.Signal != tt.signal {
			t.Errorf("sh -c %q = code %d signal %d, want %d, %d", tt.cmd, r.Code, r.Signal, tt.code, tt.signal)
		}
	}
	r := Exec(t, f, id, sandbox.ExecSpec{Argv: []string{"sleep", "10"}, Timeout: 300 * time.Millisecond})
	if !r.TimedOut || r.Signal != 9 {
		t.Errorf("sleep 10 with a 300ms timeout = %+v, want timed out by SIGKILL", r.ExitStatus)
	}
}

func testNotFound(t *testing.T, f *Fixture) {
	id := create(t, f, sandbox.Resources{})
	r := Exec(t, f, id, sandbox.ExecSpec{Argv: []string{"no-such-command", "x"}})
	if r.Code != 127 || !strings.Contains(r.Stderr, "no-such-command") || !strings.Contains(r.Stderr, "not found") {
		t.Errorf("no-such-command = code %d stderr %q, want 127 and a message", r.Code, r.Stderr)
	}
}

func testEnvCwdUser(t *testing.T, f *Fixture) {
	id := create(t, f, sandbox.Resources{})
	r := Exec(t, f, id, sandbox.ExecSpec{
		Argv: []string{"/bin/sh", "-c", `echo "$A|$(pwd)|$(id -u):$(id -g)|$(hostname)"`},
		Env:  []string{"PATH=/bin", "A=hello world"},
		Cwd:  "/tmp", UID: 1000, GID: 1000,
	})
	want := fmt.Sprintf("hello world|/tmp|1000:1000|%s\n", id)
	if r.Stdout != want {
		t.Errorf("env/cwd/user/hostname = %q (stderr %q), want %q", r.Stdout, r.Stderr, want)
	}
	// A command sits in exactly its sandbox init's cgroups (seen through
	// the sandbox's cgroup namespace, both are its root).
	r = Exec(t, f, id, sh("cat /proc/1/cgroup; echo --; cat /proc/self/cgroup"))
	if init, self, _ := strings.Cut(r.Stdout, "--\n"); init != self || init == "" {
		t.Errorf("init's cgroups and an exec's differ:\n%s", r.Stdout)
	}
	r = Exec(t, f, id, sh("id -u; ls -ld / | cut -c1-10"))
	if !strings.HasPrefix(r.Stdout, "0\n") {
		t.Errorf("default user = %q, want root (0)", r.Stdout)
	}
	// The sandbox's root can write its own root file system.
	r = Exec(t, f, id, sh("echo x > /new && chown 1000:1000 /new && stat -c %u:%g /new"))
	if r.Stdout != "1000:1000\n" {
		t.Errorf("chown as sandbox root = %q (stderr %q), want 1000:1000", r.Stdout, r.Stderr)
	}
}

func testFileRoundTrip(t *testing.T, f *Fixture) {
	ctx := ctxFor(t)
	id := create(t, f, sandbox.Resources{})
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16+7) // ~1 MiB, not chunk aligned
	info, err := f.Backend.WriteFile(ctx, id, "/work/deep/file.bin", sandbox.WriteOptions{Mode: 0o640, MakeParents: true, UID: 1000, GID: 1000}, bytes.NewReader(data))
	if err != nil {
		t.Fatalf("WriteFile = %v", err)
	}
	if info.Size != int64(len(data)) || info.Mode.Perm() != 0o640 || info.UID != 1000 || info.GID != 1000 {
		t.Errorf("WriteFile info = %+v, want size %d mode 0640 owner 1000:1000", info, len(data))
	}
	rc, rinfo, err := f.Backend.ReadFile(ctx, id, "/work/deep/file.bin")
	if err != nil {
		t.Fatalf("ReadFile = %v", err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Errorf("ReadFile returned %d bytes (err %v), want the %d written", len(got), err, len(data))
	}
	if rinfo.Size != int64(len(data)) {
		t.Errorf("ReadFile info size = %d, want %d", rinfo.Size, len(data))
	}
	r := Exec(t, f, id, sh("stat -c '%a %u:%g %s' /work/deep/file.bin; stat -c '%u' /work/deep"))
	want := fmt.Sprintf("640 1000:1000 %d\n1000\n", len(data))
	if r.Stdout != want {
		t.Errorf("inside the sandbox stat = %q, want %q", r.Stdout, want)
	}
	// A file written inside is read outside.
	Exec(t, f, id, sh("printf 'from inside' > /tmp/in"))
	rc, _, err = f.Backend.ReadFile(ctx, id, "/tmp/in")
	if err != nil {
		t.Fatalf("ReadFile(/tmp/in) = %v", err)
	}
	got, _ = io.ReadAll(rc)
	rc.Close()
	if string(got) != "from inside" {
		t.Errorf("ReadFile(/tmp/in) = %q, want %q", got, "from inside")
	}
	if _, _, err := f.Backend.ReadFile(ctx, id, "/no/such/file"); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ReadFile(missing) error = %v, want NotFound", err)
	}
	if _, _, err := f.Backend.ReadFile(ctx, id, "/tmp"); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("ReadFile(dir) error = %v, want InvalidArgument", err)
	}
}

func testSymlinkEscape(t *testing.T, f *Fixture) {
	ctx := ctxFor(t)
	id := create(t, f, sandbox.Resources{})
	host, _ := os.ReadFile("/etc/shadow")
	Exec(t, f, id, sh("ln -s / /x && ln -s ../../../../.. /y && ln -s /proc/self/root /z && ln -s /etc /abs"))
	for _, p := range []string{"/x/etc/shadow", "/y/etc/shadow", "/../../../etc/shadow", "/z/etc/shadow", "/abs/shadow", "/proc/1/root/etc/shadow"} {
		rc, _, err := f.Backend.ReadFile(ctx, id, p)
		if err == nil {
			got, _ := io.ReadAll(rc)
			rc.Close()
			if len(host) > 0 && bytes.Equal(got, host) {
				t.Fatalf("ReadFile(%s) returned the HOST's /etc/shadow", p)
			}
			t.Errorf("ReadFile(%s) = %d bytes, want NotFound or PermissionDenied (the image has no /etc/shadow)", p, len(got))
			continue
		}
		if !errdefs.Is(err, errdefs.ErrNotFound) && !errdefs.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("ReadFile(%s) error = %v, want NotFound or PermissionDenied", p, err)
		}
	}
	// Writing through the link lands inside the sandbox.
	if _, err := f.Backend.WriteFile(ctx, id, "/x/tmp/through-link", sandbox.WriteOptions{}, strings.NewReader("in")); err != nil {
		t.Fatalf("WriteFile through /x = %v", err)
	}
	if _, err := os.Stat("/tmp/through-link"); err == nil {
		t.Fatalf("WriteFile through a symlink to / wrote the HOST's /tmp")
	}
	r := Exec(t, f, id, sh("cat /tmp/through-link"))
	if r.Stdout != "in" {
		t.Errorf("file written through /x = %q inside, want %q", r.Stdout, "in")
	}
}

func testKernelFiles(t *testing.T, f *Fixture) {
	ctx := ctxFor(t)
	id := create(t, f, sandbox.Resources{})
	for _, p := range []string{"/proc/kcore", "/proc/self/environ", "/proc/kpagecgroup", "/sys/kernel/notes"} {
		// Refused: not readable (PermissionDenied), masked by a device
		// node (InvalidArgument), or absent.
		rc, _, err := f.Backend.ReadFile(ctx, id, p)
		if err == nil {
			rc.Close()
			t.Errorf("ReadFile(%s) succeeded, want it refused", p)
			continue
		}
		if k := errdefs.Kind(err); k != errdefs.ErrPermissionDenied && k != errdefs.ErrNotFound && k != errdefs.ErrInvalidArgument {
			t.Errorf("ReadFile(%s) error = %v, want PermissionDenied, InvalidArgument or NotFound", p, err)
		}
	}
	if _, err := f.Backend.WriteFile(ctx, id, "/proc/sys/kernel/hostname", sandbox.WriteOptions{}, strings.NewReader("x")); err == nil {
		t.Errorf("WriteFile(/proc/sys/kernel/hostname) succeeded, want refused")
	}
}

func testOOM(t *testing.T, f *Fixture) {
	id := create(t, f, sandbox.Resources{MemoryBytes: 64 << 20})
	// The shell holds 200 MB in a variable.
	r := Exec(t, f, id, sh(`x=$(head -c 200000000 /dev/zero | tr '\0' a); echo survived ${#x}`))
	if r.Signal != 9 || !r.OOMKilled {
		t.Errorf("allocating 200 MB in 64 MiB = %+v (stdout %q), want SIGKILL with OOMKilled", r.ExitStatus, r.Stdout)
	}
	r = Exec(t, f, id, sh("echo still here"))
	if r.Stdout != "still here\n" {
		t.Errorf("after the OOM kill the sandbox answered %q, want it alive", r.Stdout)
	}
}

func testForkBomb(t *testing.T, f *Fixture) {
	const limit = 64
	id := create(t, f, sandbox.Resources{Pids: limit})
	// A classic fork bomb, stopped by the timeout; the limit keeps it small.
	r := Exec(t, f, id, sandbox.ExecSpec{Argv: []string{"/bin/sh", "-c", "b() { b | b & }; b; sleep 3"}, Timeout: 5 * time.Second})
	_ = r
	if f.Pids != nil {
		if n := f.Pids(t, id); n > limit {
			t.Errorf("sandbox has %d processes, above its limit of %d", n, limit)
		}
	}
	// The bomb's survivors fill the limit: forks fail inside, the host is
	// unaffected, and deleting the sandbox removes them all (checked by
	// DeleteLeavesNothing's footprint on the other cases, and here by the
	// cleanup's Delete returning nil).
	r2, err := ExecErr(ctxFor(t), f.Backend, id, sh("echo alive"))
	if err == nil && r2.Code == 0 && r2.Stdout != "alive\n" {
		t.Errorf("exec after the fork bomb = %+v", r2)
	}
}

func testDeleteClean(t *testing.T, f *Fixture) {
	if f.Footprint == nil {
		t.Skip("the backend gives no footprint")
	}
	ctx := ctxFor(t)
	before := f.Footprint(t)
	id := newID(t)
	if _, err := f.Backend.Create(ctx, sandbox.Spec{ID: id, Layers: f.Layers, Resources: sandbox.Resources{MemoryBytes: 128 << 20, CPUs: 1, Pids: 256}}); err != nil {
		t.Fatalf("Create = %v", err)
	}
	Exec(t, f, id, sh("sleep 1000 & sleep 1000 & echo data > /tmp/f"))
	during := f.Footprint(t)
	if cmp.Equal(before, during) {
		t.Errorf("footprint did not change while a sandbox ran: the check cannot fail")
	}
	if err := f.Backend.Delete(ctx, id); err != nil {
		t.Fatalf("Delete = %v", err)
	}
	if err := f.Backend.Delete(ctx, id); err != nil {
		t.Errorf("second Delete = %v, want nil (idempotent)", err)
	}
	after := f.Footprint(t)
	if d := cmp.Diff(before, after); d != "" {
		t.Errorf("Delete left something behind (-before +after):\n%s", d)
	}
	if _, err := f.Backend.Status(ctx, id); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Status after Delete error = %v, want NotFound", err)
	}
}

func testExecDeleted(t *testing.T, f *Fixture) {
	ctx := ctxFor(t)
	id := newID(t)
	if _, err := f.Backend.Create(ctx, sandbox.Spec{ID: id, Layers: f.Layers, Resources: sandbox.Resources{MemoryBytes: 64 << 20, CPUs: 1, Pids: 64}}); err != nil {
		t.Fatalf("Create = %v", err)
	}
	if err := f.Backend.Delete(ctx, id); err != nil {
		t.Fatalf("Delete = %v", err)
	}
	err := f.Backend.StartExec(ctx, id, sandbox.ExecSpec{ID: "after", Argv: []string{"true"}})
	if !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("StartExec on a deleted sandbox error = %v, want NotFound", err)
	}
	if _, _, err := f.Backend.ReadFile(ctx, id, "/etc/passwd"); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ReadFile on a deleted sandbox error = %v, want NotFound", err)
	}
}

func testRestart(t *testing.T, f *Fixture) {
	if f.Reopen == nil {
		t.Skip("the fixture cannot reopen the backend")
	}
	ctx := ctxFor(t)
	id := create(t, f, sandbox.Resources{})
	Exec(t, f, id, sh("echo kept > /tmp/state"))
	if err := f.Backend.StartExec(ctx, id, sandbox.ExecSpec{ID: "long", Argv: []string{"/bin/sh", "-c", "sleep 1; echo done late"}, Env: []string{"PATH=/bin"}}); err != nil {
		t.Fatalf("StartExec = %v", err)
	}
	f.Backend = f.Reopen(t)
	sts, err := f.Backend.List(ctx)
	if err != nil {
		t.Fatalf("List after reopen = %v", err)
	}
	found := false
	for _, s := range sts {
		found = found || (s.ID == id && s.State == sandbox.StateRunning)
	}
	if !found {
		t.Fatalf("List after reopen = %+v, want %s running", sts, id)
	}
	st, err := f.Backend.WaitExec(ctx, id, "long")
	if err != nil || st.Code != 0 {
		t.Errorf("WaitExec(long) after reopen = %+v, %v", st, err)
	}
	r := Exec(t, f, id, sh("cat /tmp/state"))
	if r.Stdout != "kept\n" {
		t.Errorf("state after reopen = %q, want %q", r.Stdout, "kept\n")
	}
}

// testSpecNeeds: a spec that asks for what the backend lacks (a network
// attachment, a QoS class it does not apply) is refused as
// FailedPrecondition naming the capability, and leaves nothing.
func testSpecNeeds(t *testing.T, f *Fixture) {
	ctx := ctxFor(t)
	caps := sandbox.Capabilities(f.Backend)
	for _, tc := range []struct {
		need sandbox.Capability
		spec sandbox.Spec
	}{
		{sandbox.CapNetwork, sandbox.Spec{Network: &sandbox.NetworkAttachment{Namespace: "/nonexistent"}}},
		{sandbox.CapQoS, sandbox.Spec{QoS: sandbox.QoSBestEffort}},
	} {
		if slices.Contains(caps, tc.need) {
			continue
		}
		spec := tc.spec
		spec.ID, spec.Layers = newID(t), f.Layers
		spec.Resources = sandbox.Resources{MemoryBytes: 64 << 20, CPUs: 1, Pids: 64}
		_, err := f.Backend.Create(ctx, spec)
		if !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), string(tc.need)) {
			t.Errorf("Create needing %s on a backend without it = %v, want FailedPrecondition naming it", tc.need, err)
		}
		if _, err := f.Backend.Status(ctx, spec.ID); !errdefs.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Status of a refused create = %v, want NotFound", err)
			_ = f.Backend.Delete(ctx, spec.ID)
		}
	}
}
