package e2e

import (
	"google.golang.org/protobuf/encoding/protojson"

	"errors"
	"fmt"
	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/dsecproject/dsec/internal/testenv"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// packBase registers packbase:1: busybox, a directory and a file that the
// tests replace and delete, and a config (env, workdir) a packed
// environment must inherit.
func packBase(t *testing.T, p *platform) {
	t.Helper()
	root := testenv.BusyboxRootfs(t)
	for name, data := range map[string]string{"srv/app/a": "a\n", "srv/app/b": "b\n", "srv/doomed": "doomed\n"} {
		f := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, errOut, code := p.CLI(t, "", "image", "build", "packbase:1", "--from-dir", root, "--env", "PACKBASE=yes", "--workdir", "/srv")
	if code != 0 || strings.TrimSpace(out) != "packbase:1" {
		t.Fatalf("dsec image build packbase:1 = %q, %q, exit %d", out, errOut, code)
	}
}

// packedState prints what the round trip checks, one fact a line.
const packedState = `cd /srv
echo "app: $(ls -A /srv/app | tr '\n' ' ')"
echo "c: $(cat /srv/app/c)"
test -e /srv/doomed && echo "doomed: present" || echo "doomed: gone"
echo "new: $(stat -c '%a %u:%g' /srv/new.txt) $(cat /srv/new.txt)"
echo "owned: $(stat -c '%a %u:%g' /home/agent/owned) $(cat /home/agent/owned)"
echo "link: $(readlink /srv/link)"
echo "exe: $(stat -c '%a' /srv/run.sh)"
test -e /root/.cache && echo "cache: present" || echo "cache: gone"
echo "kept: $(cat /root/keep)"
echo "env: $PACKBASE $(pwd)"
`

const wantPackedState = `app: c 
c: fresh
doomed: gone
new: 640 0:0 hello
owned: 600 1000:1000 agent
link: new.txt
exe: 755
cache: gone
kept: kept
env: yes /srv
`

// TestPackDiffRoundTrip packs a sandbox that deleted, replaced, created and
// chowned files, with a scrubbed path, and checks a sandbox started from
// the pack (by name, and by its list of layers) sees exactly that.
func TestPackDiffRoundTrip(t *testing.T) {
	p := newPlatform(t)
	packBase(t, p)
	c := p.Client(t, p.AdminKey(t))
	ctx := ctxT(t)
	sb, err := c.Create(ctx, dsec.CreateOptions{Image: "packbase:1", Workdir: "/tmp"})
	if err != nil {
		t.Fatalf("Create(packbase:1) = %v", err)
	}
	r, err := sb.Shell(ctx, `set -e
echo hello > /srv/new.txt && chmod 640 /srv/new.txt
rm /srv/doomed
rm -rf /srv/app && mkdir /srv/app && echo fresh > /srv/app/c
echo agent > /home/agent/owned && chown 1000:1000 /home/agent/owned && chmod 600 /home/agent/owned
ln -s new.txt /srv/link
printf '#!/bin/sh\necho run\n' > /srv/run.sh && chmod 755 /srv/run.sh
mkdir -p /root/.cache/pip && echo junk > /root/.cache/pip/wheel
echo kept > /root/keep`)
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("change files: %v, exit %d, %s", err, r.ExitCode, r.Stderr)
	}

	out, errOut, code := p.CLI(t, "", "pack", sb.ID, "--name", "packed:1", "--scrub", "/root/.cache", "-o", "json")
	if code != 0 {
		t.Fatalf("dsec pack = exit %d, %s", code, errOut)
	}
	pk := &sandboxv1.PackDiffResponse{}
	if err := protojson.Unmarshal([]byte(out), pk); err != nil {
		t.Fatalf("dsec pack -o json: %v\n%s", err, out)
	}
	base, err := c.GetImage(ctx, "packbase:1")
	if err != nil {
		t.Fatal(err)
	}
	var baseLayers []string
	for _, l := range base.Layers {
		baseLayers = append(baseLayers, l.Digest)
	}
	wantLayers := append(slices.Clone(baseLayers), pk.LayerDigest)
	if pk.Image != "packed:1" || !slices.Equal(pk.Layers, wantLayers) || pk.LayerSize <= 0 || pk.Files == 0 {
		t.Errorf("dsec pack = %+v, want packed:1 with layers %q", pk, wantLayers)
	}
	img, err := c.GetImage(ctx, "packed:1")
	if err != nil {
		t.Fatalf("GetImage(packed:1) = %v", err)
	}
	var got []string
	for _, l := range img.Layers {
		got = append(got, l.Digest)
	}
	if !slices.Equal(got, wantLayers) || !slices.Equal(img.Config.Env, []string{"PACKBASE=yes"}) || img.Config.Workdir != "/srv" {
		t.Errorf("GetImage(packed:1) = layers %q, config %+v; want layers %q and packbase:1's config", got, img.Config, wantLayers)
	}

	// The packed sandbox was thawed and runs on, its files untouched.
	if r, err := sb.Shell(ctx, "echo alive; cat /root/.cache/pip/wheel"); err != nil || string(r.Stdout) != "alive\njunk\n" {
		t.Errorf("packed sandbox after pack: %q, %v; want it running with its files", r.Stdout, err)
	}

	check := func(name string, sb *dsec.Sandbox) {
		t.Helper()
		r, err := sb.Shell(ctx, packedState)
		if err != nil || string(r.Stdout) != wantPackedState {
			t.Errorf("%s: state =\n%s(%v, %s)\nwant\n%s", name, r.Stdout, err, r.Stderr, wantPackedState)
		}
	}
	fromName, err := c.Create(ctx, dsec.CreateOptions{Image: "packed:1"})
	if err != nil {
		t.Fatalf("Create(packed:1) = %v", err)
	}
	check("from packed:1", fromName)

	// The same environment as an explicit list of layers and a config.
	fromLayers, err := c.Create(ctx, dsec.CreateOptions{Layers: pk.Layers, LayerConfig: &dsec.LayerConfig{Env: []string{"PACKBASE=yes"}, Workdir: "/srv"}})
	if err != nil {
		t.Fatalf("Create(layers %q) = %v", pk.Layers, err)
	}
	check("from its layers", fromLayers)
	unknown := "sha256:" + strings.Repeat("0", 64)
	if _, err := c.Create(ctx, dsec.CreateOptions{Layers: []string{baseLayers[0], unknown}}); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("Create from an unregistered layer = %v, want NotFound", err)
	}
	if _, err := c.Create(ctx, dsec.CreateOptions{Layers: []string{"sha256:nothex"}}); !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("Create from a malformed digest = %v, want InvalidArgument", err)
	}

	// Bad input registers nothing.
	for _, bad := range []struct {
		name  string
		scrub []string
	}{{"Bad Name!", nil}, {"fine:1", []string{"relative/path"}}, {"fine:2", []string{"/"}}} {
		if _, err := sb.PackDiff(ctx, bad.name, bad.scrub...); !errors.Is(err, dsec.ErrInvalidArgument) {
			t.Errorf("PackDiff(%q, %q) = %v, want InvalidArgument", bad.name, bad.scrub, err)
		}
	}
	for _, name := range []string{"fine:1", "fine:2"} {
		if _, err := c.GetImage(ctx, name); !errors.Is(err, dsec.ErrNotFound) {
			t.Errorf("GetImage(%s) after a refused pack = %v, want NotFound", name, err)
		}
	}

	for _, s := range []*dsec.Sandbox{sb, fromName, fromLayers} {
		if err := s.Delete(ctx); err != nil {
			t.Errorf("Delete(%s) = %v", s.ID, err)
		}
	}
	if left := p.Footprint(); len(left) > 0 {
		t.Errorf("after the sandboxes were deleted, left: %v", left)
	}
}

// TestPackBranches starts 10 sandboxes from one pack: each sees the packed
// state and none sees another's writes. Two packs of one sandbox at once:
// one wins, the other is FailedPrecondition. A deleted sandbox cannot be
// packed.
func TestPackBranches(t *testing.T) {
	p := newPlatform(t)
	p.Busybox(t)
	c := p.Client(t, p.AdminKey(t))
	ctx := ctxT(t)
	sb, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	// Enough data that a pack takes a while, so that the two packs
	// overlap.
	if r, err := sb.Shell(ctx, "mkdir /state && echo 1 > /state/step && dd if=/dev/zero of=/big bs=1M count=96 2>/dev/null"); err != nil || r.ExitCode != 0 {
		t.Fatalf("write state: %v, %s", err, r.Stderr)
	}

	var (
		wg   sync.WaitGroup
		errs [2]error
		pks  [2]*dsec.Pack
	)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pks[i], errs[i] = sb.PackDiff(ctx, fmt.Sprintf("branch:%d", i))
		}()
	}
	wg.Wait()
	won := -1
	for i, err := range errs {
		switch {
		case err == nil && won < 0:
			won = i
		case err == nil:
			t.Errorf("both packs at once succeeded; want one refused")
		case !errors.Is(err, dsec.ErrFailedPrecondition) || !strings.Contains(err.Error(), "being packed"):
			t.Errorf("the losing pack = %v, want FailedPrecondition saying the sandbox is being packed", err)
		}
	}
	if won < 0 {
		t.Fatalf("no pack succeeded: %v", errs)
	}
	loser := fmt.Sprintf("branch:%d", 1-won)
	if _, err := c.GetImage(ctx, loser); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("GetImage(%s) of the refused pack = %v, want NotFound", loser, err)
	}
	name := pks[won].Image

	out, errOut, code := p.CLI(t, "", "run", "-d", "--count", "10", name)
	ids := strings.Fields(out)
	if code != 0 || len(ids) != 10 {
		t.Fatalf("dsec run -d --count 10 %s = %q, %q, exit %d", name, out, errOut, code)
	}
	each := func(fn func(id string, s *dsec.Sandbox)) {
		var wg sync.WaitGroup
		for _, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				fn(id, c.Sandbox(id))
			}()
		}
		wg.Wait()
	}
	each(func(id string, s *dsec.Sandbox) {
		r, err := s.Shell(ctx, "cat /state/step && stat -c %s /big && echo $(hostname) > /state/mine")
		if err != nil || string(r.Stdout) != fmt.Sprintf("1\n%d\n", 96<<20) {
			t.Errorf("branch %s: packed state = %q, %v (%s)", id, r.Stdout, err, r.Stderr)
		}
	})
	each(func(id string, s *dsec.Sandbox) {
		r, err := s.Shell(ctx, "ls /state | tr '\\n' ' '; cat /state/mine")
		if want := "mine step " + id + "\n"; err != nil || string(r.Stdout) != want {
			t.Errorf("branch %s: /state = %q, %v; want %q (its own write only)", id, r.Stdout, err, want)
		}
	})
	// The branches' writes did not reach the packed sandbox either.
	if r, err := sb.Shell(ctx, "ls /state"); err != nil || string(r.Stdout) != "step\n" {
		t.Errorf("packed sandbox's /state = %q, %v; want step only", r.Stdout, err)
	}

	if _, _, code := p.CLI(t, "", append([]string{"rm"}, ids...)...); code != 0 {
		t.Errorf("dsec rm of the branches: exit %d", code)
	}
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.PackDiff(ctx, "branch:gone"); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("PackDiff of a deleted sandbox = %v, want NotFound", err)
	}
	if _, errOut, code := p.CLI(t, "", "pack", sb.ID, "--name", "branch:gone"); code == 0 || !strings.Contains(errOut, "not found") {
		t.Errorf("dsec pack of a deleted sandbox = exit %d, %q; want a failure saying not found", code, errOut)
	}
	if left := p.Footprint(); len(left) > 0 {
		t.Errorf("after the sandboxes were deleted, left: %v", left)
	}
}
