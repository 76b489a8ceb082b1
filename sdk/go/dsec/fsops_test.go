package dsec

import (
	"errors"
	"io/fs"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

func TestFileOperations(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	ctx := t.Context()
	sb := c.Sandbox("sb-a")
	mt := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

	f.mu.Lock()
	f.files["sb-a/etc/hostname"] = []byte("sb-a\n")
	f.dirs["/w"] = []*sandboxv1.FileInfo{
		{Path: "/w/src", Name: "src", Type: "dir", IsDir: true, Mode: 0o755, ModTime: fakeTime},
		{Path: "/w/l", Name: "l", Type: "symlink", LinkTarget: "../etc", Mode: 0o777, ModTime: fakeTime},
		{Path: "/w/p", Name: "p", Type: "fifo", Mode: 0o600, Uid: 1000, Gid: 1000},
	}
	f.mu.Unlock()

	info, err := sb.Stat(ctx, "/etc/hostname")
	if err != nil {
		t.Fatalf("Stat: %v", err)
	}
	wantInfo := FileInfo{Path: "/etc/hostname", Type: TypeFile, Size: 5, Mode: 0o644, ModTime: mt}
	if diff := cmp.Diff(wantInfo, info); diff != "" {
		t.Errorf("Stat (-want +got):\n%s", diff)
	}
	if _, err := sb.Stat(ctx, "/nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Stat(/nope) = %v, want ErrNotFound", err)
	}

	entries, truncated, err := sb.ListDir(ctx, "/w")
	if err != nil {
		t.Fatalf("ListDir: %v", err)
	}
	wantEntries := []FileInfo{
		{Path: "/w/src", Name: "src", Type: TypeDir, IsDir: true, Mode: fs.ModeDir | 0o755, ModTime: mt},
		{Path: "/w/l", Name: "l", Type: TypeSymlink, LinkTarget: "../etc", Mode: fs.ModeSymlink | 0o777, ModTime: mt},
		{Path: "/w/p", Name: "p", Type: TypeFIFO, Mode: fs.ModeNamedPipe | 0o600, UID: 1000, GID: 1000},
	}
	if diff := cmp.Diff(wantEntries, entries); diff != "" || !truncated {
		t.Errorf("ListDir = truncated %v, (-want +got):\n%s", truncated, diff)
	}
	if _, _, err := sb.ListDir(ctx, "/nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("ListDir(/nope) = %v, want ErrNotFound", err)
	}

	calls := []struct {
		name string
		call func() error
		want proto.Message
		err  error
	}{
		{
			name: "MakeDir",
			call: func() error { return sb.MakeDir(ctx, "/a/b", WithMakeParents(), WithMode(0o700), WithOwner("app")) },
			want: &sandboxv1.MakeDirRequest{SandboxId: "sb-a", Path: "/a/b", Mode: 0o700, Parents: true, User: "app"},
		},
		{
			name: "MakeDir defaults",
			call: func() error { return sb.MakeDir(ctx, "/c") },
			want: &sandboxv1.MakeDirRequest{SandboxId: "sb-a", Path: "/c"},
		},
		{
			name: "Remove",
			call: func() error { return sb.Remove(ctx, "/nonempty", true) },
			want: &sandboxv1.RemoveRequest{SandboxId: "sb-a", Path: "/nonempty", Recursive: true},
		},
		{
			name: "Remove non-recursive",
			call: func() error { return sb.Remove(ctx, "/nonempty", false) },
			want: &sandboxv1.RemoveRequest{SandboxId: "sb-a", Path: "/nonempty"},
			err:  ErrFailedPrecondition,
		},
		{
			name: "Rename",
			call: func() error { return sb.Rename(ctx, "/a", "/exists", true) },
			want: &sandboxv1.RenameRequest{SandboxId: "sb-a", From: "/a", To: "/exists", Overwrite: true},
		},
		{
			name: "Rename onto an existing file",
			call: func() error { return sb.Rename(ctx, "/a", "/exists", false) },
			want: &sandboxv1.RenameRequest{SandboxId: "sb-a", From: "/a", To: "/exists"},
			err:  ErrAlreadyExists,
		},
	}
	for _, tt := range calls {
		err := tt.call()
		if (tt.err == nil && err != nil) || !errors.Is(err, tt.err) {
			t.Errorf("%s = %v, want %v", tt.name, err, tt.err)
		}
		if diff := cmp.Diff(tt.want, f.lastCall(), protocmp.Transform()); diff != "" {
			t.Errorf("%s request (-want +got):\n%s", tt.name, diff)
		}
	}
}
