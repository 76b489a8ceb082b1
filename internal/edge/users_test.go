package edge

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/errdefs"
)

const testPasswd = `root:x:0:0:root:/root:/bin/sh
daemon:x:1:1::/usr/sbin:/usr/sbin/nologin
broken line
agent:x:1000:1000:Agent:/home/agent:/bin/bash
`

const testGroup = `root:x:0:
wheel:x:10:agent,other
agent:x:1000:
docker:x:999:agent
`

func fakeFiles(files map[string]string) fileReader {
	return func(_ context.Context, p string) ([]byte, error) {
		s, ok := files[p]
		if !ok {
			return nil, errdefs.Newf(errdefs.ErrNotFound, "no %s", p)
		}
		return []byte(s), nil
	}
}

func TestResolveUser(t *testing.T) {
	read := fakeFiles(map[string]string{"/etc/passwd": testPasswd, "/etc/group": testGroup})
	tests := []struct {
		in      string
		want    identity
		wantErr error
	}{
		{"", identity{UID: 0, GID: 0, Home: "/root", Name: "root"}, nil},
		{"root", identity{UID: 0, GID: 0, Home: "/root", Name: "root"}, nil},
		{"agent", identity{UID: 1000, GID: 1000, Home: "/home/agent", Name: "agent", Groups: []uint32{10, 999}}, nil},
		{"1000", identity{UID: 1000, GID: 1000, Home: "/home/agent", Name: "agent", Groups: []uint32{10, 999}}, nil},
		{"1234", identity{UID: 1234, GID: 1234, Home: "/"}, nil},
		{"1234:5", identity{UID: 1234, GID: 5, Home: "/"}, nil},
		{"agent:wheel", identity{UID: 1000, GID: 10, Home: "/home/agent", Name: "agent", Groups: []uint32{999}}, nil},
		{"nobody", identity{}, errdefs.ErrInvalidArgument},
		{"agent:nogroup", identity{}, errdefs.ErrInvalidArgument},
		{"a:b:c", identity{}, errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		got, err := resolveUser(context.Background(), tt.in, read)
		if tt.wantErr != nil {
			if !errdefs.Is(err, tt.wantErr) {
				t.Errorf("resolveUser(%q) error = %v, want %v", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("resolveUser(%q) error = %v", tt.in, err)
			continue
		}
		if d := cmp.Diff(tt.want, got, cmp.AllowUnexported(identity{})); d != "" {
			t.Errorf("resolveUser(%q) mismatch (-want +got):\n%s", tt.in, d)
		}
	}
}

func TestResolveNumericWithoutFiles(t *testing.T) {
	read := fakeFiles(nil)
	got, err := resolveUser(context.Background(), "5:6", read)
	if err != nil || got.UID != 5 || got.GID != 6 {
		t.Errorf("resolveUser(5:6) = %+v, %v, want 5:6", got, err)
	}
}

func FuzzParsePasswd(f *testing.F) {
	f.Add([]byte(testPasswd), []byte(testGroup), "agent:wheel")
	f.Fuzz(func(t *testing.T, passwd, group []byte, user string) {
		read := fakeFiles(map[string]string{"/etc/passwd": string(passwd), "/etc/group": string(group)})
		_, _ = resolveUser(context.Background(), user, read)
	})
}

func TestResolveRootWithoutPasswd(t *testing.T) {
	got, err := resolveUser(context.Background(), "", fakeFiles(nil))
	if err != nil || got.UID != 0 || got.GID != 0 || got.Home != "/root" {
		t.Errorf("resolveUser(\"\") without /etc/passwd = %+v, %v, want root", got, err)
	}
	if _, err := resolveUser(context.Background(), "agent", fakeFiles(nil)); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("resolveUser(agent) without /etc/passwd error = %v, want NotFound", err)
	}
}
