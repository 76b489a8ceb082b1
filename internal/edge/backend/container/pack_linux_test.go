package container

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/erofs/go-erofs"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
	"github.com/dsecproject/dsec/internal/sandbox/sandboxtest"
)

func shell(t *testing.T, b *Backend, id, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := sandboxtest.ExecErr(ctx, b, id, sandbox.ExecSpec{Argv: []string{"sh", "-c", script}})
	if err != nil || r.Code != 0 {
		t.Fatalf("exec %q in %s = %+v, %v", script, id, r, err)
	}
	return r.Stdout
}

func readPack(t *testing.T, p *sandbox.PackedLayer) []byte {
	t.Helper()
	defer p.Body.Close()
	b, err := io.ReadAll(p.Body)
	if err != nil {
		t.Fatalf("read the packed layer: %v", err)
	}
	sum := sha256.Sum256(b)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != p.Digest || int64(len(b)) != p.Size {
		t.Fatalf("packed layer: %d bytes with digest %s, the reply said %d and %s", len(b), got, p.Size, p.Digest)
	}
	return b
}

// TestPackDiff packs a running sandbox's writable layer through the
// keeper: the layer holds the sandbox's changes with owners as the
// sandbox sees them, the sandbox runs on, a cancelled pack leaves it
// thawed and packable, and a deleted sandbox is NotFound.
func TestPackDiff(t *testing.T) {
	n := newNode(t)
	b := n.open(t)
	defer b.Close()
	ctx := context.Background()
	id := "pack-" + hex.EncodeToString([]byte{byte(time.Now().UnixNano())})
	if _, err := b.Create(ctx, sandbox.Spec{ID: id, Layers: n.layers, Resources: sandbox.Resources{MemoryBytes: 64 << 20, CPUs: 1, Pids: 64, DiskBytes: 1 << 30}}); err != nil {
		t.Fatalf("Create = %v", err)
	}
	shell(t, b, id, "echo data > /home/agent/mine && chown 1000:1000 /home/agent/mine && rm /etc/hostname && mkdir -p /tmp/scratch && touch /tmp/scratch/x")

	p, err := b.PackDiff(ctx, id, []string{"/tmp/scratch"})
	if err != nil {
		t.Fatalf("PackDiff = %v", err)
	}
	img := readPack(t, p)
	// The writable layer's file system, mounted again in the keeper to be
	// read, is detached again.
	for _, m := range n.footprint(t, b) {
		if strings.HasPrefix(m, "mount /run/disks/") && !pooled(m) {
			t.Errorf("after PackDiff the keeper still has %s", m)
		}
	}
	fsys, err := erofs.Open(bytes.NewReader(img))
	if err != nil {
		t.Fatalf("the packed layer does not parse: %v", err)
	}
	fi, err := fs.Stat(fsys, "home/agent/mine")
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*erofs.Stat); st.UID != 1000 || st.GID != 1000 {
		t.Errorf("home/agent/mine in the layer is owned by %d:%d, want 1000:1000 (the sandbox's ids)", st.UID, st.GID)
	}
	if fi, err := fs.Stat(fsys, "etc/hostname"); err != nil || fi.Mode().Type()&fs.ModeCharDevice == 0 {
		t.Errorf("etc/hostname in the layer = %v, %v; want a whiteout", fi, err)
	}
	if _, err := fs.Stat(fsys, "tmp/scratch"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("scrubbed tmp/scratch in the layer: %v, want not there", err)
	}
	if got := shell(t, b, id, "cat /home/agent/mine"); got != "data\n" {
		t.Errorf("after the pack, the sandbox reads %q", got)
	}

	// A pack whose caller goes away while the sandbox is frozen: the
	// sandbox is thawed, and the next pack runs.
	shell(t, b, id, "mkdir /many && cd /many && i=0; while [ $i -lt 20000 ]; do : > f$i; i=$((i+1)); done")
	cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	if p, err := b.PackDiff(cctx, id, nil); err == nil {
		p.Body.Close()
		t.Log("the pack ended before it was cancelled; the cancelled path was not exercised")
	}
	cancel()
	ectx, ecancel := context.WithTimeout(ctx, 10*time.Second)
	r, err := sandboxtest.ExecErr(ectx, b, id, sandbox.ExecSpec{Argv: []string{"echo", "thawed"}})
	ecancel()
	if err != nil || r.Stdout != "thawed\n" {
		t.Fatalf("exec after a cancelled pack = %+v, %v; want the sandbox thawed", r, err)
	}
	var again *sandbox.PackedLayer
	for range 50 { // the keeper notices the cancelled call when it writes
		again, err = b.PackDiff(ctx, id, nil)
		if !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("PackDiff after a cancelled one = %v", err)
	}
	readPack(t, again)

	if _, err := b.PackDiff(ctx, id, []string{"relative"}); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("PackDiff with a relative scrub path = %v, want InvalidArgument", err)
	}
	if err := b.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := b.PackDiff(ctx, id, nil); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("PackDiff of a deleted sandbox = %v, want NotFound", err)
	}
	// The keeper's warm sandboxes may hold the busybox layer's mounts.
	left := slices.DeleteFunc(n.footprint(t, b), func(s string) bool { return strings.Contains(s, "/layers/") })
	if len(left) > 0 {
		t.Errorf("left after delete: %v", left)
	}
}
