package e2e

import (
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"encoding/json"
	"errors"
	imagev1 "github.com/dsecproject/dsec/api/dsec/image/v1"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsecproject/dsec/internal/testenv"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// buildImage builds name from the directory root with the CLI and returns
// its one layer's digest.
func (p *platform) buildImage(t *testing.T, c *dsec.Client, name, root string, flags ...string) string {
	t.Helper()
	out, errOut, code := p.CLI(t, "", append([]string{"image", "build", name, "--from-dir", root}, flags...)...)
	if code != 0 || strings.TrimSpace(out) != name {
		t.Fatalf("dsec image build %s = %q, %q, exit %d", name, out, errOut, code)
	}
	img, err := c.GetImage(ctxT(t), name)
	if err != nil || len(img.Layers) != 1 {
		t.Fatalf("GetImage(%s) = %+v, %v", name, img, err)
	}
	return img.Layers[0].Digest
}

// blobPath is where the platform's store keeps a layer's bytes.
func (p *platform) blobPath(digest string) string {
	return filepath.Join(p.StateDir, "store", "sha256", strings.TrimPrefix(digest, "sha256:"))
}

func (p *platform) hasBlob(digest string) bool {
	_, err := os.Stat(p.blobPath(digest))
	return err == nil
}

// cliJSON runs the CLI, wants exit 0, and decodes its JSON output into v.
func (p *platform) cliJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out, errOut, code := p.CLI(t, "", args...)
	if code != 0 {
		t.Fatalf("dsec %v = exit %d: %s", args, code, errOut)
	}
	var err error
	if m, ok := v.(proto.Message); ok {
		// -o json of API objects is protobuf's JSON mapping.
		err = protojson.Unmarshal([]byte(out), m)
	} else {
		err = json.Unmarshal([]byte(out), v)
	}
	if err != nil {
		t.Fatalf("dsec %v: %v in %q", args, err, out)
	}
}

// tinyTree makes a directory with one file of content.
func tinyTree(t *testing.T, content string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "file.txt"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func removed(r *imagev1.GarbageCollectResponse) []string {
	var out []string
	for _, l := range r.GetRemoved() {
		out = append(out, l.GetDigest())
	}
	return out
}

// TestImageHousekeeping: a layer a live sandbox uses survives the removal
// of its images and GC until the sandbox is gone; a dry run removes
// nothing; df adds up.
func TestImageHousekeeping(t *testing.T) {
	p := newPlatform(t)
	c := p.Client(t, p.AdminKey(t))
	ctx := ctxT(t)
	root := testenv.BusyboxRootfs(t)
	// Two names for the same busybox layer, and a small image of its own.
	bb := p.buildImage(t, c, "tk/harness:12", root)
	if d := p.buildImage(t, c, "base/py310:3", root); d != bb {
		t.Fatalf("the same tree built twice has digests %s and %s", bb, d)
	}
	small := p.buildImage(t, c, "ws/sphinx-9658:1", tinyTree(t, "workspace"))

	du := &imagev1.DiskUsageResponse{}
	p.cliJSON(t, du, "image", "df", "-o", "json")
	if du.LayerCount != 2 || du.SharedCount != 1 || du.UniqueCount != 1 || du.ImageCount != 3 ||
		du.SharedBytes+du.UniqueBytes+du.UnreferencedInUseBytes+du.ReclaimableBytes != du.TotalBytes {
		t.Errorf("dsec image df = %+v, want 2 layers (1 shared, 1 unique) in 3 images, adding up", du)
	}
	out, _, code := p.CLI(t, "", "image", "ls")
	if code != 0 || !strings.Contains(out, "LAYERS") || !strings.Contains(out, "tk/harness:12") {
		t.Errorf("dsec image ls = %q, exit %d, want a table with layer counts and sizes", out, code)
	}
	out, _, code = p.CLI(t, "", "image", "inspect", "tk/harness:12")
	if code != 0 || !strings.Contains(out, bb) || !strings.Contains(out, "base/py310:3") {
		t.Errorf("dsec image inspect = %q, exit %d, want the layer and the image sharing it", out, code)
	}

	sb, err := c.Create(ctx, dsec.CreateOptions{Image: "tk/harness:12", Memory: 64 << 20})
	if err != nil {
		t.Fatalf("Create(tk/harness:12) = %v", err)
	}
	out, errOut, code := p.CLI(t, "", "image", "rm", "tk/harness:12", "base/py310:3", "ws/sphinx-9658:1")
	if code != 0 || strings.Fields(out)[0] != "tk/harness:12" || len(strings.Fields(out)) != 3 {
		t.Fatalf("dsec image rm = %q, %q, exit %d", out, errOut, code)
	}
	if _, _, code := p.CLI(t, "", "image", "inspect", "tk/harness:12"); code == 0 {
		t.Error("dsec image inspect of a removed image succeeded")
	}
	p.cliJSON(t, du, "image", "df", "-o", "json")
	if du.UnreferencedInUseCount != 1 || du.ReclaimableCount != 1 || du.SandboxCount != 1 ||
		du.SharedBytes+du.UniqueBytes+du.UnreferencedInUseBytes+du.ReclaimableBytes != du.TotalBytes {
		t.Errorf("dsec image df after rm = %+v, want the busybox layer in use and the small one reclaimable", du)
	}

	gc := &imagev1.GarbageCollectResponse{}
	p.cliJSON(t, gc, "image", "gc", "--dry-run", "--grace", "0s", "-o", "json")
	if r := removed(gc); len(r) != 1 || r[0] != small {
		t.Errorf("dsec image gc --dry-run would remove %v, want only %s", r, small)
	}
	if _, err := c.GetLayer(ctx, small); err != nil || !p.hasBlob(small) {
		t.Errorf("after a dry run: GetLayer = %v, blob kept %v; want the layer kept", err, p.hasBlob(small))
	}
	p.cliJSON(t, gc, "image", "gc", "--grace", "0s", "-o", "json")
	if r := removed(gc); len(r) != 1 || r[0] != small || len(gc.Kept) != 1 || gc.Kept[0].GetLayer().GetDigest() != bb {
		t.Errorf("dsec image gc = %+v, want %s removed and %s kept in use", gc, small, bb)
	}
	if _, err := c.GetLayer(ctx, small); !errors.Is(err, dsec.ErrNotFound) || p.hasBlob(small) {
		t.Errorf("after gc: GetLayer(small) = %v, blob kept %v; want both gone", err, p.hasBlob(small))
	}
	if !p.hasBlob(bb) {
		t.Error("gc removed the blob of a layer a live sandbox uses")
	}
	if r, err := sb.Shell(ctx, "echo alive"); err != nil || string(r.Stdout) != "alive\n" {
		t.Errorf("the sandbox after gc: %+v, %v", r, err)
	}

	if err := sb.Delete(ctx); err != nil {
		t.Fatalf("Delete = %v", err)
	}
	p.cliJSON(t, gc, "image", "gc", "--grace", "0s", "-o", "json")
	if r := removed(gc); len(r) != 1 || r[0] != bb || p.hasBlob(bb) {
		t.Errorf("dsec image gc after the sandbox left = %+v (blob kept %v), want %s removed", gc, p.hasBlob(bb), bb)
	}
	p.cliJSON(t, du, "image", "df", "-o", "json")
	if du.LayerCount != 0 || du.TotalBytes != 0 {
		t.Errorf("dsec image df at the end = %+v, want an empty store", du)
	}
	if _, err := c.Create(ctx, dsec.CreateOptions{Image: "tk/harness:12"}); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("Create(removed image) = %v, want NotFound", err)
	}
}

// TestImagePushPull copies images between two dsec up, each with its own
// store, both ways, and refuses a corrupt layer.
func TestImagePushPull(t *testing.T) {
	a, b := newPlatform(t), newPlatform(t)
	ca, cb := a.Client(t, a.AdminKey(t)), b.Client(t, b.AdminKey(t))
	ctx := ctxT(t)
	bb := a.buildImage(t, ca, "base/py310:3", testenv.BusyboxRootfs(t), "--env", "FOO=bar", "--workdir", "/tmp")

	// push: a → b; the sandbox on b runs from the pushed image, with its
	// config.
	out, errOut, code := a.CLI(t, "", "image", "push", "base/py310:3", "--to", "http://"+b.Addr, "--to-state-dir", b.StateDir)
	if code != 0 || strings.TrimSpace(out) != "base/py310:3" || !strings.Contains(errOut, "1 layers copied") {
		t.Fatalf("dsec image push = %q, %q, exit %d", out, errOut, code)
	}
	if !b.hasBlob(bb) {
		t.Errorf("after push, b lacks the blob of %s", bb)
	}
	out, errOut, code = b.CLI(t, "", "run", "base/py310:3", "--", "sh", "-c", "echo $FOO; pwd")
	if code != 0 || out != "bar\n/tmp\n" {
		t.Errorf("dsec run on b from the pushed image = %q, %q, exit %d; want bar and /tmp", out, errOut, code)
	}
	// Again: the layer is there already.
	_, errOut, code = a.CLI(t, "", "image", "push", "base/py310:3", "--to", "http://"+b.Addr, "--to-key", b.AdminKey(t))
	if code != 0 || !strings.Contains(errOut, "already there") || !strings.Contains(errOut, "0 layers copied") {
		t.Errorf("second dsec image push = %q, exit %d, want the layer skipped", errOut, code)
	}

	// pull: b → a, of an image b built.
	ws := b.buildImage(t, cb, "ws/sphinx-9658:1", tinyTree(t, "workspace"))
	out, errOut, code = a.CLI(t, "", "image", "pull", "ws/sphinx-9658:1", "--from", "http://"+b.Addr, "--from-key", b.AdminKey(t))
	if code != 0 || strings.TrimSpace(out) != "ws/sphinx-9658:1" {
		t.Fatalf("dsec image pull = %q, %q, exit %d", out, errOut, code)
	}
	if img, err := ca.GetImage(ctx, "ws/sphinx-9658:1"); err != nil || len(img.Layers) != 1 || img.Layers[0].Digest != ws {
		t.Errorf("a's GetImage(ws/sphinx-9658:1) after pull = %+v, %v, want layer %s", img, err, ws)
	}

	// A corrupt blob on the source: the pull fails with a digest error and
	// registers nothing.
	bad := a.buildImage(t, ca, "tk/harness:12", tinyTree(t, "harness v12"))
	p := a.blobPath(bad)
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = b.CLI(t, "", "image", "pull", "tk/harness:12", "--from", "http://"+a.Addr, "--from-state-dir", a.StateDir)
	if code == 0 || !strings.Contains(errOut, "digest") {
		t.Errorf("dsec image pull of a corrupt layer = %q, %q, exit %d; want a digest error", out, errOut, code)
	}
	if _, err := cb.GetImage(ctx, "tk/harness:12"); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("b's GetImage(tk/harness:12) after a failed pull = %v, want NotFound", err)
	}
	if _, err := cb.GetLayer(ctx, bad); !errors.Is(err, dsec.ErrNotFound) || b.hasBlob(bad) {
		t.Errorf("b's GetLayer(corrupt) = %v, blob %v; want neither", err, b.hasBlob(bad))
	}
}

// TestImageSquash packs two sandboxes' changes (a deleted file among them)
// into layers, squashes them, and checks a sandbox on the squashed image
// sees the same tree.
func TestImageSquash(t *testing.T) {
	p := newPlatform(t)
	p.Busybox(t)
	c := p.Client(t, p.AdminKey(t))
	ctx := ctxT(t)
	step := func(image, script, packAs string) {
		t.Helper()
		sb, err := c.Create(ctx, dsec.CreateOptions{Image: image, Memory: 64 << 20})
		if err != nil {
			t.Fatalf("Create(%s) = %v", image, err)
		}
		defer sb.Delete(ctx)
		if r, err := sb.Shell(ctx, script); err != nil || r.ExitCode != 0 {
			t.Fatalf("Shell(%q) = %+v, %v", script, r, err)
		}
		if _, err := sb.PackDiff(ctx, packAs); err != nil {
			t.Fatalf("PackDiff(%s) = %v", packAs, err)
		}
	}
	step("busybox", "rm /bin/ls && mkdir /task && echo one > /task/a && echo gone > /task/b", "ws/env:1")
	step("ws/env:1", "echo two > /task/a && rm /task/b && mkdir -p /opt/x && echo x > /opt/x/f", "ws/env:2")
	before, err := c.GetImage(ctx, "ws/env:2")
	if err != nil || len(before.Layers) != 3 {
		t.Fatalf("GetImage(ws/env:2) = %+v, %v, want 3 layers", before, err)
	}
	// busybox's layer (about 2 MB) stays; the two small diffs merge.
	out, errOut, code := p.CLI(t, "", "image", "squash", "ws/env:2", "--to", "ws/env:2-squashed", "--max-layer-size", "512K")
	if code != 0 || strings.TrimSpace(out) != "ws/env:2-squashed" {
		t.Fatalf("dsec image squash = %q, %q, exit %d", out, errOut, code)
	}
	after, err := c.GetImage(ctx, "ws/env:2-squashed")
	if err != nil || len(after.Layers) != 2 || after.Layers[0].Digest != before.Layers[0].Digest {
		t.Fatalf("GetImage(squashed) = %+v, %v, want busybox's layer and one more", after, err)
	}
	const check = "test -e /bin/ls && echo has-ls; cat /task/a; test -e /task/b || echo no-b; cat /opt/x/f; echo hi | cat"
	want := "two\nno-b\nx\nhi\n"
	for _, image := range []string{"ws/env:2", "ws/env:2-squashed"} {
		out, errOut, code := p.CLI(t, "", "run", image, "--", "sh", "-c", check)
		if code != 0 || out != want {
			t.Errorf("dsec run %s: %q, %q, exit %d; want %q", image, out, errOut, code, want)
		}
	}
}
