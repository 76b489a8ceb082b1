package debian

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/errdefs"
)

func TestParsePackages(t *testing.T) {
	tests := []struct {
		in   string
		want []string
		ok   bool
	}{
		{"python3", []string{"python3"}, true},
		{"bash, coreutils,grep,,sed ", []string{"bash", "coreutils", "grep", "sed"}, true},
		{"g++,libstdc++6=12.2.0-14", []string{"g++", "libstdc++6=12.2.0-14"}, true},
		{"", nil, false},
		{",", nil, false},
		{"Python3", nil, false},
		{"--hook=x", nil, false},
		{"a", nil, false},
		{"a b", nil, false},
		{"x;rm -rf /", nil, false},
		{"pkg=", nil, false},
	}
	for _, tt := range tests {
		got, err := ParsePackages(tt.in)
		if (err == nil) != tt.ok || !cmp.Equal(got, tt.want) {
			t.Errorf("ParsePackages(%q) = %q, %v; want %q, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParsePackages(%q) error %v is not InvalidArgument", tt.in, err)
		}
	}
}

func TestCommand(t *testing.T) {
	args, env, err := command(Options{
		Packages: []string{"golang-go"}, Suite: "bookworm", Sources: []string{"/etc/apt/sources.list.d/debian.sources"},
		Customize: []string{"go build std", "echo 'it''s'"}, Env: []string{"CGO_ENABLED=0", "X=it's"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"--variant=essential", "--format=tar", "--include=golang-go",
		"--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
		"--dpkgopt=path-exclude=/usr/share/info/*", "--dpkgopt=path-exclude=/usr/share/locale/*",
		"--dpkgopt=path-exclude=/usr/share/lintian/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright",
		`--customize-hook=env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root 'CGO_ENABLED=0' 'X=it'\''s'  chroot "$1" /bin/sh -ec "$DSEC_BUILD_RUN_0"`,
		`--customize-hook=env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root 'CGO_ENABLED=0' 'X=it'\''s'  chroot "$1" /bin/sh -ec "$DSEC_BUILD_RUN_1"`,
		"bookworm", "-", "/etc/apt/sources.list.d/debian.sources",
	}
	if d := cmp.Diff(want, args); d != "" {
		t.Errorf("command args (-want +got):\n%s", d)
	}
	wantEnv := []string{"DSEC_BUILD_RUN_0=go build std", "DSEC_BUILD_RUN_1=echo 'it''s'"}
	if d := cmp.Diff(wantEnv, env); d != "" {
		t.Errorf("command env (-want +got):\n%s", d)
	}
	for name, o := range map[string]Options{
		"no packages": {Suite: "bookworm", Sources: []string{"x"}},
		"bad package": {Packages: []string{"-x"}, Suite: "bookworm", Sources: []string{"x"}},
		"bad suite":   {Packages: []string{"bash"}, Suite: "../x", Sources: []string{"x"}},
		"bad variant": {Packages: []string{"bash"}, Suite: "bookworm", Variant: "--x", Sources: []string{"x"}},
		"no sources":  {Packages: []string{"bash"}, Suite: "bookworm", Sources: []string{}},
	} {
		if args, _, err := command(o); err == nil {
			t.Errorf("command(%s) = %q, want an error", name, args)
		}
	}
}

func TestSourcesIn(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("sources.list", "# only a comment\n\n")
	write("sources.list.d/b.sources", "Types: deb\nURIs: http://example.invalid/debian\n")
	write("sources.list.d/a.list", "deb http://example.invalid/debian bookworm main\n")
	write("sources.list.d/c.list.disabled", "deb http://example.invalid/x bookworm main\n")
	write("sources.list.d/d.list", "# deb http://example.invalid/x bookworm main\n")
	got, err := sourcesIn(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "sources.list.d/a.list"), filepath.Join(dir, "sources.list.d/b.sources")}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("sourcesIn (-want +got):\n%s", d)
	}
}

func TestOSReleaseField(t *testing.T) {
	b := []byte("PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_CODENAME=bookworm\nID=debian\n")
	if got := osReleaseField(b, "VERSION_CODENAME"); got != "bookworm" {
		t.Errorf("VERSION_CODENAME = %q", got)
	}
	if got := osReleaseField(b, "PRETTY_NAME"); got != "Debian GNU/Linux 12 (bookworm)" {
		t.Errorf("PRETTY_NAME = %q", got)
	}
}

func TestTailWriter(t *testing.T) {
	var sink strings.Builder
	tw := &tailWriter{w: &sink}
	for i := range 20 {
		_, _ = tw.Write([]byte(strings.Repeat("x", i) + "\n"))
	}
	_, _ = tw.Write([]byte("E: last words"))
	lines := strings.Split(tw.last(), "\n")
	if len(lines) != tailLines+1 || lines[len(lines)-1] != "E: last words" {
		t.Errorf("last() = %q", tw.last())
	}
	if !strings.HasPrefix(sink.String(), "\nx\nxx\n") {
		t.Errorf("the writer did not pass everything on: %q", sink.String()[:10])
	}
}

func FuzzParsePackages(f *testing.F) {
	for _, s := range []string{"python3", "a,b", "--include=x", "pkg=1:2.0~rc1-3", "x y", "$(id)"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		pkgs, err := ParsePackages(s)
		if err != nil {
			return
		}
		for _, p := range pkgs {
			// Nothing that mmdebstrap or a shell could read as more than
			// a package name gets through.
			if strings.HasPrefix(p, "-") || strings.ContainsAny(p, " \t\n,;$`'\"\\/|&<>*?") {
				t.Errorf("ParsePackages(%q) let %q through", s, p)
			}
		}
	})
}

func TestBuildWithoutMmdebstrap(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	err := Build(t.Context(), Options{Packages: []string{"bash"}, Suite: "bookworm", Sources: []string{"x.sources"}}, io.Discard)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "apt-get install mmdebstrap") {
		t.Errorf("Build without mmdebstrap = %v, want FailedPrecondition saying how to install it", err)
	}
}

// TestBuildFails checks that a failed mmdebstrap's last lines reach the
// error, with a stand-in mmdebstrap that fails like the real one.
func TestBuildFails(t *testing.T) {
	dir := t.TempDir()
	script := "#!/bin/sh\necho 'I: running apt-get update...' >&2\necho 'E: Unable to locate package nosuchpkg' >&2\nexit 1\n"
	if err := os.WriteFile(filepath.Join(dir, "mmdebstrap"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	var log strings.Builder
	err := Build(t.Context(), Options{Packages: []string{"nosuchpkg"}, Suite: "bookworm", Sources: []string{"x.sources"}, Log: &log}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "Unable to locate package nosuchpkg") {
		t.Errorf("Build = %v, want mmdebstrap's last lines", err)
	}
	if !strings.Contains(log.String(), "running apt-get update") {
		t.Errorf("the log got %q, want mmdebstrap's progress", log.String())
	}
}
