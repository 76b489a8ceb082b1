package adversarial

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/testenv/platform"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// Attacks through `dsec cp` (finding 8): a sandbox makes a file whose
// apparent size is far beyond its disk, for the host to write out in full,
// and copies get cut off mid-way. Protection: holes are found with
// SEEK_DATA/SEEK_HOLE and carried as PAX GNU sparse entries (only data
// travels, holes are made with seek and ftruncate at the other end), every
// copy is bounded by --max-size (apparent size, holes included) before
// anything is written, and a download goes to an unnamed O_TMPFILE file
// that only its last step names.

// sparseGiB is the attack's file: truncate -s 20G in a 100M sandbox.
const sparseGiB = 20

// cpCmd returns the CLI running dsec cp args against p.
func cpCmd(p *platform.Platform, args ...string) *exec.Cmd {
	cmd := exec.Command(p.Bin, append([]string{"cp"}, args...)...)
	cmd.Env = append(os.Environ(), "DSEC_ADDR="+p.URL(), "DSEC_STATE_DIR="+p.StateDir, "DSEC_API_KEY=", "HOME="+p.StateDir)
	return cmd
}

// hostAllocated returns the bytes the host file p takes on disk (du).
func hostAllocated(t *testing.T, p string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatalf("stat %s: %v", p, err)
	}
	return st.Blocks * 512
}

// refusedByMaxSize reports whether dsec cp's error output says --max-size
// refused the copy (not that the flag is unknown).
func refusedByMaxSize(stderr string) bool {
	return strings.Contains(stderr, "more than --max-size")
}

// tempLeft lists .dsec-cp-* files in dir.
func tempLeft(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".dsec-cp-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// sparseSandbox makes a 100M-disk sandbox holding /tmp/sparse, a 20 GiB
// file of holes with "mark" written at 7 GiB and at its last bytes.
func sparseSandbox(t *testing.T) *dsec.Sandbox {
	t.Helper()
	sb := NewSandbox(t, dsec.CreateOptions{Disk: 100 << 20})
	MustSh(t, sb, fmt.Sprintf(`truncate -s %dG /tmp/sparse &&
		printf mark | dd of=/tmp/sparse bs=1 seek=%d conv=notrunc 2>/dev/null &&
		printf mark | dd of=/tmp/sparse bs=1 seek=%d conv=notrunc 2>/dev/null`, sparseGiB, 7<<30, sparseGiB<<30-4))
	return sb
}

// TestCpSparseOut: copying the 20 GiB file out writes a 20 GiB sparse
// file that takes next to no disk on the host, quickly; by default (--max-size
// 10G) the copy is refused before anything is written.
func TestCpSparseOut(t *testing.T) {
	p := Env(t)
	t.Parallel()
	sb := sparseSandbox(t)
	dir := t.TempDir()
	x := filepath.Join(dir, "x")

	// As the attack ran it: the default --max-size refuses it, naming the flag.
	_, errOut, code := p.CLI(t, "", "cp", sb.ID+":/tmp/sparse", x)
	if code == 0 || !refusedByMaxSize(errOut) {
		t.Errorf("dsec cp ID:/tmp/sparse ./x (20 GiB, default --max-size) = exit %d, %q; want refused naming --max-size", code, errOut)
	}
	if _, err := os.Stat(x); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused copy left ./x (%v)", err)
	}

	start := time.Now()
	_, errOut, code = p.CLI(t, "", "cp", "--max-size", "30G", sb.ID+":/tmp/sparse", x)
	took := time.Since(start)
	if code != 0 {
		t.Fatalf("dsec cp --max-size 30G ID:/tmp/sparse ./x = exit %d, %q", code, errOut)
	}
	fi, err := os.Stat(x)
	if err != nil || fi.Size() != sparseGiB<<30 {
		t.Fatalf("./x = %v, %v; want %d bytes", fi, err, int64(sparseGiB<<30))
	}
	if a := hostAllocated(t, x); a > 1<<20 {
		t.Errorf("./x takes %d bytes on the host's disk (du), want next to none: the holes were written", a)
	}
	f, err := os.Open(x)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, off := range []int64{7 << 30, sparseGiB<<30 - 4} {
		b := make([]byte, 4)
		if _, err := f.ReadAt(b, off); err != nil || string(b) != "mark" {
			t.Errorf("./x at %d = %q, %v; want %q", off, b, err, "mark")
		}
	}
	t.Logf("copied a %d GiB sparse file out in %v; %d bytes on disk", sparseGiB, took, hostAllocated(t, x))
	if took > time.Minute {
		t.Errorf("copying a %d GiB sparse file out took %v, as if its holes travelled", sparseGiB, took)
	}
	if left := tempLeft(t, dir); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// TestCpSparseIn: a 20 GiB sparse file of the host copied into a 100M-disk
// sandbox is a 20 GiB sparse file there, its data in place.
func TestCpSparseIn(t *testing.T) {
	p := Env(t)
	t.Parallel()
	sb := NewSandbox(t, dsec.CreateOptions{Disk: 100 << 20})
	src := filepath.Join(t.TempDir(), "sparse")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(sparseGiB << 30); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("mark"), 5<<30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if hostAllocated(t, src) > 1<<20 {
		t.Skip("the host's temporary directory keeps no holes")
	}
	start := time.Now()
	if _, errOut, code := p.CLI(t, "", "cp", "--max-size", "30G", src, sb.ID+":/tmp/in"); code != 0 {
		t.Fatalf("dsec cp SPARSE ID:/tmp/in = exit %d, %q", code, errOut)
	}
	t.Logf("copied a %d GiB sparse file in in %v", sparseGiB, time.Since(start))
	out := MustSh(t, sb, `stat -c '%s %b %B' /tmp/in && dd if=/tmp/in bs=1 skip=5368709120 count=4 2>/dev/null`)
	var size, blocks, bsize int64
	var mark string
	if _, err := fmt.Sscan(out, &size, &blocks, &bsize, &mark); err != nil {
		t.Fatalf("stat in the sandbox = %q: %v", out, err)
	}
	if size != sparseGiB<<30 || mark != "mark" {
		t.Errorf("/tmp/in in the sandbox: %d bytes, %q at 5 GiB; want %d and mark", size, mark, int64(sparseGiB<<30))
	}
	if blocks*bsize > 1<<20 {
		t.Errorf("/tmp/in takes %d bytes of the sandbox's disk, want next to none: the holes were written", blocks*bsize)
	}
}

// TestCpMaxSize: a file over --max-size is refused, naming the flag, before
// any of it is written (out) or sent (in); a tree is bounded as a whole.
func TestCpMaxSize(t *testing.T) {
	p := Env(t)
	t.Parallel()
	sb := Shared(t)
	scratch := Scratch(t, sb)
	MustSh(t, sb, "truncate -s 2G "+scratch+"/f && mkdir -p "+scratch+"/tree && truncate -s 600M "+scratch+"/tree/a "+scratch+"/tree/b")
	dir := t.TempDir()
	for _, tt := range []struct {
		name string
		args []string
		dst  string // must not exist after the refusal
	}{
		{"file out", []string{"--max-size", "1G", sb.ID + ":" + scratch + "/f", filepath.Join(dir, "f")}, filepath.Join(dir, "f")},
		{"file to stdout", []string{"--max-size", "1G", sb.ID + ":" + scratch + "/f", "-"}, ""},
		{"tree out", []string{"--max-size", "1G", sb.ID + ":" + scratch + "/tree", filepath.Join(dir, "tree")}, filepath.Join(dir, "tree", "b")},
	} {
		stdout, errOut, code := p.CLI(t, "", append([]string{"cp"}, tt.args...)...)
		if code == 0 || !refusedByMaxSize(errOut) {
			t.Errorf("%s: dsec cp %v = exit %d, %q; want refused naming --max-size", tt.name, tt.args, code, errOut)
		}
		if len(stdout) > 0 {
			t.Errorf("%s: %d bytes written to standard output", tt.name, len(stdout))
		}
		if tt.dst != "" {
			if _, err := os.Stat(tt.dst); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: the refused file was written (%v)", tt.name, err)
			}
		}
	}
	if left := tempLeft(t, dir); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}

	// In: a 2 GiB (sparse) host file with --max-size 1G.
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, 2<<30); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := p.CLI(t, "", "cp", "--max-size", "1G", big, sb.ID+":"+scratch+"/in"); code == 0 || !refusedByMaxSize(errOut) {
		t.Errorf("dsec cp --max-size 1G BIG ID:… = exit %d, %q; want refused naming --max-size", code, errOut)
	}
	if r := Sh(t, sb, "test -e "+scratch+"/in"); r.Code() == 0 {
		t.Errorf("the refused upload created %s/in", scratch)
	}
}

// writingIn reports whether process pid has written data to a file of dir
// it holds open (an O_TMPFILE file shows as "dir/#inode (deleted)").
func writingIn(pid int, dir string) bool {
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		p := fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())
		l, err := os.Readlink(p)
		if err != nil || !strings.HasPrefix(l, dir+"/") {
			continue
		}
		if fi, err := os.Stat(p); err == nil && fi.Size() > 0 {
			return true
		}
	}
	return false
}

// TestCpKilledLeavesNothing: a download killed mid-way, by SIGINT,
// SIGTERM or SIGKILL, leaves no .dsec-cp-* file and no destination.
func TestCpKilledLeavesNothing(t *testing.T) {
	p := Env(t)
	t.Parallel()
	sb := Shared(t)
	scratch := Scratch(t, sb)
	// 512 MiB of data (no holes): long enough to be caught mid-way.
	MustSh(t, sb, "yes dsec | head -c 536870912 > "+scratch+"/big")
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			dst := filepath.Join(dir, "big")
			cmd := cpCmd(p, sb.ID+":"+scratch+"/big", dst)
			var errOut bytes.Buffer
			cmd.Stderr = &errOut
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// Wait until the copy has written data here, then kill it.
			deadline := time.Now().Add(30 * time.Second)
			for !writingIn(cmd.Process.Pid, dir) {
				if time.Now().After(deadline) {
					cmd.Process.Kill()
					cmd.Wait()
					t.Fatalf("the copy never started writing in %s: %s", dir, errOut.String())
				}
				time.Sleep(2 * time.Millisecond)
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			err := cmd.Wait()
			if err == nil {
				t.Skipf("the copy finished before %v reached it", sig)
			}
			if left := tempLeft(t, dir); len(left) != 0 {
				t.Errorf("dsec cp killed by %v left %v", sig, left)
			}
			if _, err := os.Stat(dst); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("dsec cp killed by %v left its destination (%v)", sig, err)
			}
			t.Logf("killed by %v: %v, %s", sig, err, strings.TrimSpace(errOut.String()))
		})
	}
	// And on an error after the temporary file was made: a fifo, which
	// the file API refuses to read.
	MustSh(t, sb, "rm -f "+scratch+"/big && mkfifo "+scratch+"/fifo")
	dir := t.TempDir()
	if _, errOut, code := p.CLI(t, "", "cp", sb.ID+":"+scratch+"/fifo", filepath.Join(dir, "fifo")); code == 0 {
		t.Errorf("dsec cp of a fifo = exit 0 (%s), want an error", errOut)
	}
	if left := tempLeft(t, dir); len(left) != 0 {
		t.Errorf("a failed copy left %v", left)
	}
}
