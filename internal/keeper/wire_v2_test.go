package keeper

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// The files in testdata/v2 are the keeper's wire messages of protocol 2,
// as dsec b56bd3e (the last release before the keeper API was versioned)
// sent them: the replies and on-disk records were read from a running
// keeper of that build (see testdata/v2/README.md), the requests are what
// its client marshalled. They never change: they pin what a keeper and an
// edge of today must still read from a peer or a state dir of that release.

var updateV2 = flag.Bool("update-v2", false, "rewrite the generated request fixtures of testdata/v2 (never after the release they pin)")

// v2Requests are the request bodies of protocol 2, marshalled by
// generated-v2 from these values.
var v2Requests = map[string]any{
	"create.request.json": CreateRequest{
		ID: "k11-6cgxz6zc4rba",
		Layers: []Layer{
			{Digest: "sha256:a7dfb74efb2f0a7c6b1b1c6b9a0e1f2d3c4b5a697887766554433221100ffeed", Path: "/var/lib/dsec/store/layers/sha256/a7dfb74efb2f.erofs"},
			{Digest: "sha256:1111111111111111111111111111111111111111111111111111111111111111", Lazy: &LazyLayer{
				Meta: "sha256:2222222222222222222222222222222222222222222222222222222222222222", Data: "sha256:3333333333333333333333333333333333333333333333333333333333333333",
				DataSize: 3 << 20, ChunkSize: 1 << 20, ChunkDigests: []string{"sha256:44", "sha256:55", "sha256:66"},
			}},
		},
		Resources: Resources{MemoryBytes: 64 << 20, CPUs: 1.5, Pids: 4096, DiskBytes: 10 << 30},
	},
	"exec.start.request.json": ExecRequest{Sandbox: "k11-6cgxz6zc4rba", Spec: ExecSpec{
		ID: "xmr5housfiq24yty", Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"},
		Env: []string{"PATH=/usr/bin:/bin", "HOME=/root"}, Cwd: "/srv", UID: 1000, GID: 1000, Groups: []uint32{27, 100},
		Stdin: []byte("hello\n"), StdinOpen: true, TTY: true, Rows: 40, Cols: 120,
		Timeout: 90 * time.Second, OutputLimit: 1 << 20,
	}},
	"exec.stdin.request.json":  StdinRequest{Sandbox: "k11-6cgxz6zc4rba", Exec: "xdowncyxtifq4h7h", Data: []byte("more\n"), Close: true},
	"exec.signal.request.json": SignalRequest{Sandbox: "k11-6cgxz6zc4rba", Exec: "xdowncyxtifq4h7h", Signal: 15},
	"exec.resize.request.json": ResizeRequest{Sandbox: "k11-6cgxz6zc4rba", Exec: "xdowncyxtifq4h7h", Rows: 50, Cols: 132},
	"pack.request.json":        PackRequest{Sandbox: "k11-6cgxz6zc4rba", Scrub: []string{"/tmp", "/root/.cache"}},
	"error.exhausted.json":     encodeError(errdefs.RetryAfter(errdefs.Newf(errdefs.ErrResourceExhausted, "node is full"), 1500*time.Millisecond)),
}

// TestV2RequestFixtures checks that the request fixtures are what protocol
// 2's client marshalled; with -update-v2 it writes them (done once, at
// b56bd3e).
func TestV2RequestFixtures(t *testing.T) {
	for name, v := range v2Requests {
		got, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("testdata", "v2", name)
		if *updateV2 {
			if err := os.WriteFile(path, append(got, '\n'), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, bytes.TrimSpace(want)) {
			t.Errorf("json.Marshal(%T) =\n%s\nwant (testdata/v2/%s)\n%s", v, got, name, want)
		}
	}
}

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "v2", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// decodeStrict decodes as the keeper of protocol 2 decoded requests.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func TestV2RequestsDecode(t *testing.T) {
	for name, want := range v2Requests {
		t.Run(name, func(t *testing.T) {
			b := readFixture(t, name)
			var got any
			var err error
			switch want.(type) {
			case CreateRequest:
				var v CreateRequest
				err, got = decodeStrict(b, &v), v
			case ExecRequest:
				var v ExecRequest
				err, got = decodeStrict(b, &v), v
			case StdinRequest:
				var v StdinRequest
				err, got = decodeStrict(b, &v), v
			case SignalRequest:
				var v SignalRequest
				err, got = decodeStrict(b, &v), v
			case ResizeRequest:
				var v ResizeRequest
				err, got = decodeStrict(b, &v), v
			case PackRequest:
				var v PackRequest
				err, got = decodeStrict(b, &v), v
			case wireError:
				var v wireError
				err, got = decodeStrict(b, &v), v
			default:
				t.Fatalf("no decoder for %T", want)
			}
			if err != nil {
				t.Fatalf("decode testdata/v2/%s: %v", name, err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("decode testdata/v2/%s (-want +got):\n%s", name, diff)
			}
		})
	}
}

var (
	v2Started = time.Date(2026, 12, 1, 17, 57, 51, 106372048, time.UTC)
	v2Ended   = time.Date(2026, 12, 1, 17, 57, 51, 131325134, time.UTC)
	v2NS      = map[string]NSID{
		"cgroup": {4, 4026532461}, "ipc": {4, 4026532390}, "mnt": {4, 4026532388}, "net": {4, 4026532392},
		"pid": {4, 4026532391}, "time": {4, 4026531834}, "user": {4, 4026532386}, "uts": {4, 4026532389},
	}
	v2Info = SandboxInfo{
		ID: "k11-6cgxz6zc4rba", State: StateRunning, Pid: 26260, StartTime: 733250,
		Created:   time.Date(2026, 12, 1, 17, 57, 50, 985993879, time.UTC),
		DiskLimit: 10 << 30, Disk: "pool-45f1756d952a", IDBase: 2000065536, IDSize: 65536, NS: v2NS,
	}
	v2Exit = ExitRecord{
		ExitStatus:  ExitStatus{Code: 3, Started: v2Started, Ended: v2Ended},
		StdoutBytes: 4, StderrBytes: 4,
	}
)

// TestV2RepliesDecode reads the replies and records of a protocol 2 keeper.
func TestV2RepliesDecode(t *testing.T) {
	running := v2Info
	running.RunningExecs = 1
	adopted := v2Info
	adopted.Adopted = true
	exited := SandboxInfo{
		ID: "k11-p4zx6k2xghsy", State: StateExited, Reason: "init killed by signal 9 (killed)", Pid: 31214, StartTime: 738097,
		Created:   time.Date(2026, 12, 1, 17, 58, 39, 513862930, time.UTC),
		DiskLimit: 10 << 30, Disk: "pool-06a1fb871fc1", IDBase: 2000393216, IDSize: 65536,
		NS: map[string]NSID{
			"cgroup": {4, 4026535584}, "ipc": {4, 4026535434}, "mnt": {4, 4026535432}, "net": {4, 4026535436},
			"pid": {4, 4026535435}, "time": {4, 4026531834}, "user": {4, 4026535349}, "uts": {4, 4026535433},
		},
	}
	done := ExecInfo{
		ID: "xmr5housfiq24yty", Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, Started: v2Started,
		Exit: &v2Exit.ExitStatus, StdoutBytes: 4, StderrBytes: 4,
	}
	sleepStarted := time.Date(2026, 12, 1, 17, 57, 51, 172849766, time.UTC)
	sleeping := ExecInfo{ID: "xdowncyxtifq4h7h", Argv: []string{"sh", "-c", "sleep 1000"}, Started: sleepStarted, Running: true}
	lost := sleeping
	lost.Running = false
	lost.Exit = &ExitStatus{Lost: true, Started: sleepStarted}
	oomStarted := time.Date(2026, 12, 1, 17, 58, 39, 198429587, time.UTC)
	oom := ExecInfo{
		ID: "xj6h6t6o45mv4byn", Argv: []string{"sh", "-c", "x=a; while true; do x=$x$x$x; done"}, Started: oomStarted,
		Exit: &ExitStatus{Signal: 9, OOMKilled: true, Started: oomStarted, Ended: time.Date(2026, 12, 1, 17, 58, 39, 483684893, time.UTC)},
	}
	tests := []struct {
		name string
		got  func([]byte) (any, error)
		want any
	}{
		{"version.reply.json", decodeAs[Version], Version{Protocol: 2, Version: "b56bd3e", Pid: 25930, Runtime: "crun"}},
		{"status.reply.json", decodeAs[SandboxInfo], running},
		{"status.adopted.reply.json", decodeAs[SandboxInfo], adopted},
		{"status.exited.reply.json", decodeAs[SandboxInfo], exited},
		{"sandbox.keeper.json", decodeAs[SandboxInfo], v2Info},
		{"list.reply.json", decodeAs[[]SandboxInfo], []SandboxInfo{running}},
		{"stats.reply.json", decodeAs[Stats], Stats{
			MemoryBytes: 2256896, MemoryLimit: 64 << 20, CPUUsage: 6107840, Pids: 2, PidsLimit: 4096,
			DiskBytes: 32768, DiskLimit: 10 << 30, OutputBytes: 8, OutputLimit: 256 << 20,
		}},
		{"wait.reply.json", decodeAs[ExitRecord], v2Exit},
		{"exec.exit.json", decodeAs[ExitRecord], v2Exit},
		{"wait.lost.reply.json", decodeAs[ExitRecord], ExitRecord{ExitStatus: ExitStatus{Lost: true}}},
		{"exec.spec.json", decodeAs[journalEntry], journalEntry{ID: "xmr5housfiq24yty", Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, Started: v2Started}},
		{"execlist.reply.json", decodeAs[[]ExecInfo], []ExecInfo{done, sleeping}},
		{"execlist.lost.reply.json", decodeAs[[]ExecInfo], []ExecInfo{done, lost}},
		{"execlist.oom.reply.json", decodeAs[[]ExecInfo], []ExecInfo{oom}},
		{"events.reply.json", decodeAs[EventsReply], EventsReply{Cursor: "c060e43194c8:2", Events: []Event{
			{Sandbox: "k11-2ioc5nvwr4hh", Type: EventOOM, Reason: "exec xj6h6t6o45mv4byn killed for memory (limit 32 MiB)", Time: time.Date(2026, 12, 1, 17, 58, 39, 483884321, time.UTC)},
			{Sandbox: "k11-p4zx6k2xghsy", Type: EventExited, Reason: "init killed by signal 9 (killed)", Time: time.Date(2026, 12, 1, 17, 58, 40, 233465260, time.UTC)},
		}}},
		{"status.notfound.json", decodeAs[wireError], wireError{Kind: "not found", Message: "sandbox k11-nosuch not found on this node"}},
		{"chunkcache.error.json", decodeAs[wireError], wireError{Kind: "not found", Message: "this keeper has no chunk cache: start dsec up with --blob-source"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.got(readFixture(t, tt.name))
			if err != nil {
				t.Fatalf("decode testdata/v2/%s: %v", tt.name, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("decode testdata/v2/%s (-want +got):\n%s", tt.name, diff)
			}
		})
	}
}

func decodeAs[T any](b []byte) (any, error) {
	var v T
	err := json.Unmarshal(b, &v)
	return v, err
}

// TestV2Errors checks that errors of a protocol 2 keeper keep their kind.
func TestV2Errors(t *testing.T) {
	for name, kind := range map[string]error{"status.notfound.json": errdefs.ErrNotFound, "error.exhausted.json": errdefs.ErrResourceExhausted} {
		var w wireError
		if err := json.Unmarshal(readFixture(t, name), &w); err != nil {
			t.Fatal(err)
		}
		if err := w.decode(); !errdefs.Is(err, kind) {
			t.Errorf("decode(testdata/v2/%s) = %v, want kind %v", name, err, kind)
		}
	}
	var w wireError
	_ = json.Unmarshal(readFixture(t, "error.exhausted.json"), &w)
	if d, ok := errdefs.RetryHint(w.decode()); !ok || d != 1500*time.Millisecond {
		t.Errorf("retry hint of testdata/v2/error.exhausted.json = %v, %v; want 1.5s", d, ok)
	}
}
