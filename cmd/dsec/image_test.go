package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsecproject/dsec/internal/debian"
	"github.com/dsecproject/dsec/internal/layer"
)

// TestBuildDebianReadsToTheEnd builds a layer from a stand-in mmdebstrap
// that writes zeros after the tar archive's end marker, as tar's padding
// to its 10 KiB records is: they must be read, or mmdebstrap's last write
// fails and with it the build (the layer builder reads ahead 64 KiB, so
// the stand-in writes more than that).
func TestBuildDebianReadsToTheEnd(t *testing.T) {
	if _, err := exec.LookPath("tar"); err != nil {
		t.Skip("no tar")
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(filepath.Join(root, "usr", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "usr", "bin", "hello"), []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\necho 'I: creating tarball...' >&2\ntar -C '" + root + "' -cf - .\nhead -c 200000 /dev/zero\necho 'I: success' >&2\n"
	if err := os.WriteFile(filepath.Join(bin, "mmdebstrap"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	out, err := os.CreateTemp(dir, "layer-*.erofs")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	var progress strings.Builder
	for i := range 5 {
		if _, err := out.Seek(0, 0); err != nil {
			t.Fatal(err)
		}
		info, err := buildDebian(t.Context(), debian.Options{Packages: []string{"bash"}, Suite: "bookworm", Sources: []string{"x.sources"}}, out, layer.Options{}, &progress)
		if err != nil {
			t.Fatalf("build %d: buildDebian = %v\n%s", i, err, progress.String())
		}
		if info.Files != 3 { // usr, usr/bin, usr/bin/hello
			t.Errorf("build %d: %d files in the layer, want 3", i, info.Files)
		}
	}
	if !strings.Contains(progress.String(), "] I: creating tarball...") {
		t.Errorf("progress = %q, want mmdebstrap's lines with their times", progress.String())
	}
	_, _ = io.Copy(io.Discard, out)
}
