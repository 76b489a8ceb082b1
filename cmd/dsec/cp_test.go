package main

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// noTemp fails when dir holds a .dsec-cp-* file.
func noTemp(t *testing.T, dir string) {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".dsec-cp-") {
			t.Errorf("temporary file left behind: %s", filepath.Join(dir, e.Name()))
		}
	}
}

// TestCpMaxSize: a file over --max-size is refused, naming the flag,
// before anything is written or sent.
func TestCpMaxSize(t *testing.T) {
	f := newFakeAPI()
	addr := startFake(t, f)
	dir := t.TempDir()
	// /etc/hostname is 5 bytes in the fake.
	_, errOut, code := dsecRun(t, addr, "", "cp", "--max-size", "4", sbID+":/etc/hostname", filepath.Join(dir, "h"))
	if code == 0 || !strings.Contains(errOut, "--max-size") {
		t.Errorf("cp of a 5-byte file with --max-size 4 = exit %d, %q; want an error naming --max-size", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(dir, "h")); err == nil {
		t.Errorf("the refused copy was written")
	}
	noTemp(t, dir)

	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = dsecRun(t, addr, "", "cp", "--max-size", "9", big, sbID+":/big")
	if code == 0 || !strings.Contains(errOut, "--max-size") {
		t.Errorf("cp of a 10-byte file with --max-size 9 = exit %d, %q; want an error naming --max-size", code, errOut)
	}
	_, errOut, code = dsecRun(t, addr, "0123456789", "cp", "--max-size", "9", "-", sbID+":/big")
	if code == 0 || !strings.Contains(errOut, "--max-size") {
		t.Errorf("cp of 10 bytes of stdin with --max-size 9 = exit %d, %q; want an error naming --max-size", code, errOut)
	}
	if n := len(callsOf[*sandboxv1.UploadTarHeader](f)); n != 0 {
		t.Errorf("refused copies sent %d archives", n)
	}
	if _, _, code := dsecRun(t, addr, "", "cp", "--max-size", "x", big, sbID+":/big"); code != 2 {
		t.Errorf("cp --max-size x exits %d, want 2", code)
	}
}

// TestCpSparseUpload: a local file with holes goes into the sandbox as a
// one-entry sparse archive into the destination's directory.
func TestCpSparseUpload(t *testing.T) {
	f := newFakeAPI()
	addr := startFake(t, f)
	dir := t.TempDir()
	p := filepath.Join(dir, "sparse")
	fl, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	const size = 20 << 30
	if err := fl.Truncate(size); err != nil {
		t.Fatal(err)
	}
	fl.WriteAt([]byte("tail"), size-4)
	fl.Close()
	var st syscall.Stat_t
	if syscall.Stat(p, &st) != nil || st.Blocks*512 > 1<<20 {
		t.Skip("the temporary directory keeps no holes")
	}
	if _, errOut, code := dsecRun(t, addr, "", "cp", "--max-size", "20G", p, sbID+":/data/x.img"); code != 0 {
		t.Fatalf("cp SPARSE ID:/data/x.img exits %d: %s", code, errOut)
	}
	heads := callsOf[*sandboxv1.UploadTarHeader](f)
	if len(heads) != 1 || heads[0].GetPath() != "/data/" || !heads[0].GetMakeParents() {
		t.Fatalf("cp of a sparse file sent %v, want one archive into /data/", heads)
	}
	f.mu.Lock()
	archive := f.tars["/data/"]
	f.mu.Unlock()
	if len(archive) > 64<<10 {
		t.Errorf("the archive of a 20 GiB sparse file is %d bytes", len(archive))
	}
	tr := tar.NewReader(bytes.NewReader(archive))
	hdr, err := tr.Next()
	if err != nil || hdr.Name != "x.img" || hdr.Size != size || hdr.PAXRecords["GNU.sparse.major"] != "1" {
		t.Fatalf("archive entry = %+v, %v; want a sparse x.img of %d bytes", hdr, err, int64(size))
	}
}

// TestCpBadID: a side that looks like ID:/path but whose ID is not a
// sandbox ID is named, with what an ID looks like; an unknown ID is the
// server's NotFound, naming it.
func TestCpBadID(t *testing.T) {
	f := newFakeAPI()
	addr := startFake(t, f)
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"cp", "abc:/x", "-"}, `SRC "abc:/x": "abc" is not a sandbox ID; IDs look like node1-`},
		{[]string{"cp", "node1-SHOUTING1234:/x", dir}, `SRC "node1-SHOUTING1234:/x": "node1-SHOUTING1234" is not a sandbox ID`},
		{[]string{"cp", "-", ":/x"}, `DST ":/x": the sandbox ID before the colon is empty`},
		{[]string{"cp", dir, "node1-abc:/workspace"}, `DST "node1-abc:/workspace": "node1-abc" is not a sandbox ID`},
		{[]string{"cp", dir, "-"}, "neither SRC nor DST is in a sandbox"},
		{[]string{"cp", sbID + ":/a", sbID + ":/b"}, "SRC and DST are both in sandboxes"},
		{[]string{"fs", "ls", "abc:/x"}, `argument "abc:/x": "abc" is not a sandbox ID`},
	} {
		_, errOut, code := dsecRun(t, addr, "", tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("dsec %s = exit %d, %q; want exit 2 saying %q", strings.Join(tc.args, " "), code, errOut, tc.want)
		}
	}
	if calls := len(callsOf[*sandboxv1.ReadFileRequest](f)) + len(callsOf[*sandboxv1.UploadTarHeader](f)); calls != 0 {
		t.Errorf("bad IDs reached the server %d times", calls)
	}
}
