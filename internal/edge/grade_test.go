package edge

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"io/fs"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/ceiling"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
	"github.com/dsecproject/dsec/internal/sandbox/sandboxtest"
)

// GradeFrom on the fake backend: validation, what is copied (links as
// links, never followed; fifos refused), the bounds, and the grading
// sandbox deleted on every path out.

func TestGradePaths(t *testing.T) {
	many := make([]string, maxGradePaths+1)
	for i := range many {
		many[i] = "/w/" + strings.Repeat("x", i+1)
	}
	for _, bad := range [][]string{
		nil, {"rel/path"}, {"/a/../etc"}, {"/a/"}, {"/a//b"}, {"/"}, {"/a\x00b"},
		{"/proc"}, {"/proc/1/root"}, {"/a/b", "/a/b/c"}, {"/a/b/c", "/x", "/a/b"}, {"/sys/fs"}, {"/dev"}, {"/dev/shm/x"}, {""}, many,
	} {
		if _, err := gradePaths(bad); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("gradePaths(%.60q) = %v, want InvalidArgument", bad, err)
		}
	}
	got, err := gradePaths([]string{"/workspace/repo", "/devices", "/workspace/repo", "/procfile", "/workspace/repo2"})
	if err != nil || !slices.Equal(got, []string{"/workspace/repo", "/devices", "/procfile", "/workspace/repo2"}) {
		t.Errorf("gradePaths(good) = %v, %v", got, err)
	}
}

// gradeEnv is an edge on a fake node with a graded sandbox holding an
// agent's work.
type gradeEnv struct {
	t      *testing.T
	n      *testNode
	e      *Edge
	fake   *sandboxtest.Fake
	graded *Record

	mu sync.Mutex
	// guarded by mu
	seen map[string]sandbox.FileInfo // the grader's files while its command ran
	data map[string]string
	spec sandbox.Spec
}

func newGradeEnv(t *testing.T) *gradeEnv {
	n := newTestNode(t)
	g := &gradeEnv{t: t, n: n, fake: n.node.Open()}
	g.e = n.open()
	t.Cleanup(func() { g.e.Close() })
	g.graded = create(t, g.e, 32*testMiB)
	ctx := context.Background()
	for p, f := range map[string]struct {
		data string
		mode fs.FileMode
	}{
		"/etc/shadow":                    {"AGENT-MARKER", 0o600},
		"/workspace/repo/main.py":        {"print('hi')\n", 0o644},
		"/workspace/repo/pkg/mod.py":     {"x = 1\n", 0o644},
		"/workspace/repo/shadow":         {"/etc/shadow", fs.ModeSymlink | 0o777},
		"/workspace/repo/up":             {"../../../etc", fs.ModeSymlink | 0o777},
		"/workspace/notes.txt":           {"not copied", 0o644},
		"/workspace/link-to-repo":        {"/workspace/repo", fs.ModeSymlink | 0o777},
		"/workspace/pipe/fifo":           {"", fs.ModeNamedPipe | 0o644},
		"/workspace/big/file":            {strings.Repeat("b", 4096), 0o644},
		"/workspace/repo/pkg/deeper/z.a": {"zzz", 0o600},
	} {
		if _, err := g.fake.WriteFile(ctx, g.graded.ID, p, sandbox.WriteOptions{Mode: f.mode, MakeParents: true}, strings.NewReader(f.data)); err != nil {
			t.Fatal(err)
		}
	}
	return g
}

// hold makes commands named "check" run until the test ends them; when one
// starts in a sandbox other than the graded one, the grader's files are
// recorded and then act runs (nil: the command exits 3).
func (g *gradeEnv) hold(act func(graderID, execID string)) {
	g.n.node.Lock()
	g.n.node.Run = func(spec sandbox.ExecSpec) (string, sandbox.ExitStatus, bool) {
		if len(spec.Argv) > 0 && spec.Argv[0] == "check" {
			return "checking\n", sandbox.ExitStatus{}, true
		}
		return strings.Join(spec.Argv, " ") + "\n", sandbox.ExitStatus{}, false
	}
	g.n.node.Unlock()
	go func() {
		ctx := context.Background()
		for range 500 {
			for _, id := range g.n.node.IDs() {
				if id == g.graded.ID {
					continue
				}
				xs, _ := g.fake.ListExecs(ctx, id)
				for _, x := range xs {
					if !x.Running {
						continue
					}
					g.record(ctx, id)
					if act == nil {
						g.n.node.Finish(id, x.ID, 3)
					} else {
						act(id, x.ID)
					}
					return
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
}

func (g *gradeEnv) record(ctx context.Context, id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.seen, g.data = map[string]sandbox.FileInfo{}, map[string]string{}
	g.spec, _ = g.n.node.Spec(id)
	var walk func(dir string)
	walk = func(dir string) {
		ents, _, _ := g.fake.ReadDir(ctx, id, dir, 0)
		for _, e := range ents {
			g.seen[e.Path] = e
			switch {
			case e.Mode.IsDir():
				walk(e.Path)
			case e.Mode.IsRegular(), e.Mode&fs.ModeSymlink != 0:
				rc, _, err := g.fake.ReadFile(ctx, id, e.Path)
				if err == nil {
					b, _ := io.ReadAll(rc)
					rc.Close()
					g.data[e.Path] = string(b)
				}
			}
		}
	}
	walk("/")
}

// onlyGraded checks that the grading sandbox is gone: from the backend
// and from the edge's records.
func (g *gradeEnv) onlyGraded() {
	g.t.Helper()
	if ids := g.n.node.IDs(); !slices.Equal(ids, []string{g.graded.ID}) {
		g.t.Errorf("sandboxes on the node after the grade = %v, want only the graded %s", ids, g.graded.ID)
	}
	recs, err := g.e.List(context.Background(), admin, nil)
	if err != nil {
		g.t.Fatal(err)
	}
	for _, r := range recs {
		if r.ID != g.graded.ID {
			g.t.Errorf("record of %s (labels %v) left after the grade", r.ID, r.Labels)
		}
	}
}

func TestGradeFromCopiesOnlyThePathsAndNeverFollowsLinks(t *testing.T) {
	g := newGradeEnv(t)
	g.hold(nil)
	res, err := g.e.GradeFrom(context.Background(), admin, GradeParams{
		Sandbox: g.graded.ID, Paths: []string{"/workspace/repo"}, Argv: []string{"check"},
	})
	if err != nil {
		t.Fatalf("GradeFrom = %v", err)
	}
	if res.Exit.Code != 3 || string(res.Stdout) != "checking\n" {
		t.Errorf("GradeFrom = exit %d, stdout %q; want the command's exit 3 and its output", res.Exit.Code, res.Stdout)
	}
	if res.CopiedFiles != 5 || res.CopiedBytes != int64(len("print('hi')\nx = 1\nzzz")) {
		t.Errorf("copied %d files, %d bytes; want 5 (3 files, 2 links) and the files' bytes", res.CopiedFiles, res.CopiedBytes)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for p, want := range map[string]string{
		"/workspace/repo/main.py":        "print('hi')\n",
		"/workspace/repo/pkg/mod.py":     "x = 1\n",
		"/workspace/repo/pkg/deeper/z.a": "zzz",
	} {
		if got := g.data[p]; got != want {
			t.Errorf("grader's %s = %q, want %q", p, got, want)
		}
	}
	for p, target := range map[string]string{"/workspace/repo/shadow": "/etc/shadow", "/workspace/repo/up": "../../../etc"} {
		if fi := g.seen[p]; fi.Mode&fs.ModeSymlink == 0 || g.data[p] != target {
			t.Errorf("grader's %s = mode %v, %q; want a link to %q, not what it points to", p, fi.Mode, g.data[p], target)
		}
	}
	for _, p := range []string{"/etc/shadow", "/workspace/notes.txt", "/workspace/link-to-repo", "/workspace/pipe", "/workspace/big"} {
		if _, ok := g.seen[p]; ok {
			t.Errorf("grader has %s, which was not asked for", p)
		}
	}
	if g.spec.Resources != g.graded.Resources || !slices.Equal(g.spec.Layers, g.graded.Layers) {
		t.Errorf("grader spec = %+v, want the graded sandbox's layers %v and resources %+v", g.spec, g.graded.Layers, g.graded.Resources)
	}
	g.onlyGraded()
	// The graded sandbox is as it was.
	rc, _, err := g.fake.ReadFile(context.Background(), g.graded.ID, "/etc/shadow")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "AGENT-MARKER" {
		t.Errorf("graded /etc/shadow = %q after the grade", b)
	}
	if r, err := g.e.Get(context.Background(), admin, g.graded.ID); err != nil || r.State != StateRunning {
		t.Errorf("graded sandbox after the grade = %v, %v; want it running", r, err)
	}
}

func TestGradeFromRefusesAndCleansUp(t *testing.T) {
	for _, tt := range []struct {
		name  string
		paths []string
		max   int64
		want  error
		text  string
	}{
		{"fifo", []string{"/workspace/repo", "/workspace/pipe"}, 0, errdefs.ErrFailedPrecondition, "/workspace/pipe/fifo is a fifo"},
		{"top-level link", []string{"/workspace/link-to-repo"}, 0, errdefs.ErrFailedPrecondition, "symbolic link"},
		{"copy limit", []string{"/workspace/big"}, 4095, errdefs.ErrResourceExhausted, "copy limit"},
		{"copy limit over paths", []string{"/workspace/repo", "/workspace/big"}, 4096, errdefs.ErrResourceExhausted, "copy limit"},
		{"missing", []string{"/workspace/nothing"}, 0, errdefs.ErrNotFound, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := newGradeEnv(t)
			_, err := g.e.GradeFrom(context.Background(), admin, GradeParams{
				Sandbox: g.graded.ID, Paths: tt.paths, Shell: "true", MaxCopyBytes: tt.max,
			})
			if !errdefs.Is(err, tt.want) || !strings.Contains(err.Error(), tt.text) {
				t.Errorf("GradeFrom(%v) = %v, want %v saying %q", tt.paths, err, tt.want, tt.text)
			}
			if g.n.node.Calls("StartExec") != 0 {
				t.Errorf("the command ran after a refused copy")
			}
			g.onlyGraded()
		})
	}
}

func TestGradeFromCleansUpWhenTheCallerGoes(t *testing.T) {
	g := newGradeEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g.hold(func(string, string) { cancel() })
	_, err := g.e.GradeFrom(ctx, admin, GradeParams{Sandbox: g.graded.ID, Paths: []string{"/workspace/repo"}, Argv: []string{"check"}})
	if err == nil {
		t.Fatalf("GradeFrom with the caller gone mid-command = nil, want an error")
	}
	g.onlyGraded()
}

func TestGradeFromCallerAndRequestChecks(t *testing.T) {
	g := newGradeEnv(t)
	ctx := context.Background()
	creates := g.n.node.Calls("Create")
	other := Caller{Project: "team-b", KeyID: "k2"}
	if _, err := g.e.GradeFrom(ctx, other, GradeParams{Sandbox: g.graded.ID, Paths: []string{"/workspace/repo"}, Shell: "true"}); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GradeFrom by another project = %v, want NotFound", err)
	}
	for name, p := range map[string]GradeParams{
		"no command":       {Paths: []string{"/w"}},
		"argv and shell":   {Paths: []string{"/w"}, Argv: []string{"x"}, Shell: "x"},
		"negative timeout": {Paths: []string{"/w"}, Shell: "x", Timeout: -time.Second},
		"endless timeout":  {Paths: []string{"/w"}, Shell: "x", Timeout: 1 << 62},
		"negative limit":   {Paths: []string{"/w"}, Shell: "x", MaxCopyBytes: -1},
		"bad env":          {Paths: []string{"/w"}, Shell: "x", Env: map[string]string{"1A": "x"}},
		"bad path":         {Paths: []string{"w"}, Shell: "x"},
	} {
		p.Sandbox = g.graded.ID
		if _, err := g.e.GradeFrom(ctx, admin, p); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("GradeFrom(%s) = %v, want InvalidArgument", name, err)
		}
	}
	if got := g.n.node.Calls("Create"); got != creates {
		t.Errorf("refused grades made %d sandboxes", got-creates)
	}
}

// A source archive that names anything outside the copied tree, or with
// `..`, is refused; a good one passes through unchanged.
func TestTarCheck(t *testing.T) {
	mk := func(names ...string) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, n := range names {
			h := &tar.Header{Name: n, Mode: 0o644, Typeflag: tar.TypeReg, Size: 1}
			if strings.HasSuffix(n, "/") {
				h.Typeflag, h.Size = tar.TypeDir, 0
			}
			tw.WriteHeader(h)
			if h.Size > 0 {
				tw.Write([]byte("x"))
			}
		}
		tw.Close()
		return buf.Bytes()
	}
	for _, names := range [][]string{
		{"repo/", "repo/../etc/shadow"}, {"repo/", "other/x"}, {"repox/"}, {"repo/", "/etc/passwd"}, {"repo/./a"},
	} {
		c := &tarCheck{root: "/w/repo", budget: &gradeBudget{bytes: 1 << 20, entries: 10}}
		if err := c.copy(io.Discard, bytes.NewReader(mk(names...))); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("check(%q) = %v, want FailedPrecondition", names, err)
		}
	}
	good := mk("repo/", "repo/a", "repo/b/", "repo/b/c")
	var out bytes.Buffer
	c := &tarCheck{root: "/w/repo", budget: &gradeBudget{bytes: 1 << 20, entries: 10}}
	if err := c.copy(&out, bytes.NewReader(good)); err != nil || !bytes.Equal(out.Bytes(), good) {
		t.Errorf("check(good) = %v, passed %d of %d bytes", err, out.Len(), len(good))
	}
	c = &tarCheck{root: "/w/repo", budget: &gradeBudget{bytes: 1 << 20, entries: 3}}
	if err := c.copy(io.Discard, bytes.NewReader(good)); !errdefs.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("check(4 entries, room for 3) = %v, want ResourceExhausted", err)
	}
}

func TestGradeFromResources(t *testing.T) {
	g := newGradeEnv(t)
	g.hold(nil)
	if _, err := g.e.GradeFrom(context.Background(), admin, GradeParams{
		Sandbox: g.graded.ID, Paths: []string{"/workspace/repo"}, Argv: []string{"check"},
		Resources: sandbox.Resources{MemoryBytes: 48 * testMiB},
	}); err != nil {
		t.Fatalf("GradeFrom = %v", err)
	}
	want := g.graded.Resources
	want.MemoryBytes = 48 * testMiB
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.spec.Resources != want {
		t.Errorf("grader resources = %+v, want %+v (the memory asked for, the rest the graded sandbox's)", g.spec.Resources, want)
	}
	g.onlyGraded()
}

// A grade cut short by the edge's end leaves its grading sandbox; the next
// edge on the node deletes it, and only it.
func TestGradeSandboxDeletedAfterRestart(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	graded := create(t, e, 32*testMiB)
	// What GradeFrom makes before its copy, left by an edge that ended.
	g, err := e.create(context.Background(), admin, CreateParams{Image: "busybox", grader: true, Resources: sandbox.Resources{MemoryBytes: 32 * testMiB}})
	if err != nil {
		t.Fatal(err)
	}
	e.Close()
	e = n.open()
	defer e.Close()
	if ids := n.node.IDs(); !slices.Equal(ids, []string{graded.ID}) {
		t.Errorf("sandboxes after the restart = %v, want only %s (grading sandbox %s deleted)", ids, graded.ID, g.ID)
	}
	if _, err := e.Get(context.Background(), admin, g.ID); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get(grading sandbox) after the restart = %v, want NotFound", err)
	}
	if r, err := e.Get(context.Background(), admin, graded.ID); err != nil || r.State != StateRunning {
		t.Errorf("Get(graded) after the restart = %v, %v; want it running", r, err)
	}
}

// FuzzTarCheck feeds arbitrary archives to the grade's check: it never
// panics, and what it accepts it passes on unchanged.
func FuzzTarCheck(f *testing.F) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "repo/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "repo/a", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2})
	tw.Write([]byte("hi"))
	tw.WriteHeader(&tar.Header{Name: "repo/l", Typeflag: tar.TypeSymlink, Linkname: "/etc/shadow"})
	tw.Close()
	f.Add(buf.Bytes())
	f.Add([]byte("not a tar"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var out bytes.Buffer
		c := &tarCheck{root: "/w/repo", budget: &gradeBudget{bytes: 1 << 20, entries: 1000}}
		if err := c.copy(&out, bytes.NewReader(data)); err == nil && !bytes.Equal(out.Bytes(), data) {
			t.Fatalf("accepted %d bytes, passed on %d different ones", len(data), out.Len())
		}
	})
}

// skippingFake is the fake backend whose archives leave out one entry, as
// the container backend's leave out sockets and devices.
type skippingFake struct{ *sandboxtest.Fake }

func (f skippingFake) DownloadTarStats(ctx context.Context, id, p string, w io.Writer, maxBytes int64) (sandbox.TarStats, error) {
	return sandbox.TarStats{Skipped: 1}, f.DownloadTar(ctx, id, p, w)
}

func TestGradeFromRefusesWhatTheArchiveLeftOut(t *testing.T) {
	n := newTestNode(t)
	e, err := New(context.Background(), Config{
		Node: "n", StateDir: n.dir,
		Backends: map[string]sandbox.Backend{"fake": skippingFake{n.node.Open()}},
		Images:   fakeImages{}, MemoryBytes: 1 << 30, MemoryOvercommit: 1, MemoryReserve: 1, CPUs: 2,
		Defaults:    Defaults{MemoryBytes: 64 * testMiB, DiskBytes: 16 * testMiB},
		OutputQuota: 16 * testMiB, ReconcileEvery: 20 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.diskSpace = func() (ceiling.Space, error) { return ceiling.Space{Free: 1 << 40, Size: 1 << 41}, nil }
	graded := create(t, e, 32*testMiB)
	if _, err := n.node.Open().WriteFile(context.Background(), graded.ID, "/w/repo/a", sandbox.WriteOptions{MakeParents: true}, strings.NewReader("a")); err != nil {
		t.Fatal(err)
	}
	_, err = e.GradeFrom(context.Background(), admin, GradeParams{Sandbox: graded.ID, Paths: []string{"/w/repo"}, Shell: "true"})
	if !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "1 of the entries under /w/repo cannot be copied (device nodes, sockets") {
		t.Errorf("GradeFrom(a tree with a socket) = %v, want FailedPrecondition naming what was left out", err)
	}
	if ids := n.node.IDs(); !slices.Equal(ids, []string{graded.ID}) || n.node.Calls("StartExec") != 0 {
		t.Errorf("after the refusal: sandboxes %v, %d execs; want only the graded one, none", ids, n.node.Calls("StartExec"))
	}
}
