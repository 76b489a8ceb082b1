package adversarial

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/testenv/platform"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// Image attacks of a hostile tenant (issue 10, finding 6): another
// project's key removes or overwrites the victim's image, or runs its
// private one. Protection: images belong to the project that made them
// (internal/cluster WriteImage, DeleteImage, SetImagePublic); only it or
// an admin key deletes, re-tags or publishes them; private ones run only
// for it.

// victimImage packs a sandbox of project into name, with /marker holding
// marker, and returns the project's key and client.
func victimImage(t *testing.T, p *platform.Platform, project, name, marker string) (string, *dsec.Client) {
	t.Helper()
	key := p.ProjectKey(t, project)
	c := p.Client(t, key)
	sb := newSandbox(t, c, dsec.CreateOptions{}, true)
	MustSh(t, sb, "echo "+marker+" > /marker")
	if _, err := sb.PackDiff(Ctx(t, 2*time.Minute), name); err != nil {
		t.Fatalf("PackDiff(%s) as %s = %v", name, project, err)
	}
	t.Cleanup(func() {
		_, _ = Admin(t).DeleteImage(Ctx(t, time.Minute), name)
	})
	return key, c
}

// runMarker starts a sandbox of image with c and returns its /marker.
func runMarker(t *testing.T, c *dsec.Client, image string) string {
	t.Helper()
	sb := newSandbox(t, c, dsec.CreateOptions{Image: image}, true)
	return strings.TrimSpace(Sh(t, sb, "cat /marker").Stdout)
}

// TestImageCrossProjectRm: `dsec image rm` of another project's image
// fails (not found while private, permission denied once public), and the
// victim's next run still prints its own marker.
func TestImageCrossProjectRm(t *testing.T) {
	p := Env(t)
	t.Parallel()
	const name = "advvictim-rm/app:latest"
	_, victim := victimImage(t, p, "advvictim-rm", name, "victim-rm-marker")
	intruder := p.ProjectKey(t, IntruderProject+"-rm")

	out, errOut, code := p.CLI(t, "", "image", "rm", "--api-key", intruder, name)
	if code == 0 || !strings.Contains(errOut, "not found") {
		t.Errorf("dsec image rm of another project's private image = %q, %q, exit %d; want a not-found failure", out, errOut, code)
	}
	if got := runMarker(t, victim, name); got != "victim-rm-marker" {
		t.Fatalf("victim's run after the intruder's image rm = %q, want victim-rm-marker", got)
	}
	if _, err := victim.SetImagePublic(Ctx(t, time.Minute), name, true); err != nil {
		t.Fatalf("SetImagePublic(own image) = %v", err)
	}
	out, errOut, code = p.CLI(t, "", "image", "rm", "--api-key", intruder, name)
	if code == 0 || !strings.Contains(errOut, "belongs to project advvictim-rm") {
		t.Errorf("dsec image rm of another project's public image = %q, %q, exit %d; want a refusal naming the owner project", out, errOut, code)
	}
	out, errOut, code = p.CLI(t, "", "image", "private", "--api-key", intruder, name)
	if code == 0 {
		t.Errorf("dsec image private of another project's image = %q, %q, exit 0; want a failure", out, errOut)
	}
	if got := runMarker(t, victim, name); got != "victim-rm-marker" {
		t.Errorf("victim's run after the intruder's attempts = %q, want victim-rm-marker", got)
	}
}

// TestImagePackOntoVictim: `dsec pack ID --name VICTIM:latest`, with and
// without --force, from a sandbox of another project fails; the victim's
// next run prints its own marker, not the attacker's.
func TestImagePackOntoVictim(t *testing.T) {
	p := Env(t)
	t.Parallel()
	const name = "advvictim-pack/app:latest"
	_, victim := victimImage(t, p, "advvictim-pack", name, "victim-pack-marker")
	intruderKey := p.ProjectKey(t, IntruderProject+"-pack")
	attacker := newSandbox(t, p.Client(t, intruderKey), dsec.CreateOptions{}, true)
	MustSh(t, attacker, "echo attacker-marker > /marker")
	for _, extra := range [][]string{nil, {"--force"}} {
		args := append([]string{"pack", "--api-key", intruderKey, attacker.ID, "--name", name}, extra...)
		out, errOut, code := p.CLI(t, "", args...)
		if code == 0 || !strings.Contains(errOut, "taken by another project") {
			t.Errorf("dsec %s = %q, %q, exit %d; want a refusal: the name is another project's", strings.Join(args[3:], " "), out, errOut, code)
		}
	}
	if got := runMarker(t, victim, name); got != "victim-pack-marker" {
		t.Errorf("victim's run after the attacker's pack = %q, want victim-pack-marker", got)
	}
	// Through the image API too: CreateImage onto the name with the
	// attacker's layers.
	img, err := victim.GetImage(Ctx(t, time.Minute), name)
	if err != nil {
		t.Fatal(err)
	}
	digests := make([]string, len(img.Layers))
	for i, l := range img.Layers {
		digests[i] = l.Digest
	}
	_, err = p.Client(t, intruderKey).CreateImage(Ctx(t, time.Minute), name, digests[:1], dsec.ImageConfig{}, dsec.WithForce())
	if !errors.Is(err, dsec.ErrPermissionDenied) {
		t.Errorf("CreateImage(onto another project's image, force) = %v, want %v", err, dsec.ErrPermissionDenied)
	}
}

// TestImageRetagByOwner: the owner packing the same content onto its tag
// again needs no --force (a no-op, so scripts re-run); other content
// needs --force.
func TestImageRetagByOwner(t *testing.T) {
	p := Env(t)
	t.Parallel()
	const name = "advowner/app:latest"
	key := p.ProjectKey(t, "advowner")
	c := p.Client(t, key)
	sb := newSandbox(t, c, dsec.CreateOptions{}, true)
	MustSh(t, sb, "echo one > /marker")
	t.Cleanup(func() { _, _ = Admin(t).DeleteImage(Ctx(t, time.Minute), name) })
	pack := func(extra ...string) (string, string, int) {
		return p.CLI(t, "", append([]string{"pack", "--api-key", key, sb.ID, "--name", name}, extra...)...)
	}
	if out, errOut, code := pack(); code != 0 {
		t.Fatalf("dsec pack (new name) = %q, %q, exit %d", out, errOut, code)
	}
	// Nothing changed in the sandbox: the same layers again.
	if out, errOut, code := pack(); code != 0 || strings.TrimSpace(out) != name {
		t.Errorf("dsec pack (same content, no --force) = %q, %q, exit %d; want %s, exit 0", out, errOut, code, name)
	}
	MustSh(t, sb, "echo two > /marker")
	if out, errOut, code := pack(); code == 0 || !strings.Contains(errOut, "--force") {
		t.Errorf("dsec pack (other content, no --force) = %q, %q, exit %d; want a failure naming --force", out, errOut, code)
	}
	if got := runMarker(t, c, name); got != "one" {
		t.Errorf("run after the refused pack = %q, want one", got)
	}
	if out, errOut, code := pack("--force"); code != 0 {
		t.Errorf("dsec pack --force = %q, %q, exit %d", out, errOut, code)
	}
	if got := runMarker(t, c, name); got != "two" {
		t.Errorf("run after pack --force = %q, want two", got)
	}
}

// TestImagePrivateNotRunnable: another project cannot run, see or inspect
// a private image; once its owner makes it public it can run it.
func TestImagePrivateNotRunnable(t *testing.T) {
	p := Env(t)
	t.Parallel()
	const name = "advprivate/app:latest"
	_, owner := victimImage(t, p, "advprivate", name, "private-marker")
	intruder := p.Client(t, p.ProjectKey(t, IntruderProject+"-private"))
	ctx := Ctx(t, time.Minute)
	if sb, err := intruder.Create(ctx, dsec.CreateOptions{Image: name, Memory: 64 << 20}); !errors.Is(err, dsec.ErrNotFound) {
		if err == nil {
			_ = sb.Delete(ctx)
		}
		t.Errorf("Create(another project's private image) = %v, want %v", err, dsec.ErrNotFound)
	}
	if _, err := intruder.InspectImage(ctx, name); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("InspectImage(another project's private image) = %v, want %v", err, dsec.ErrNotFound)
	}
	imgs, err := intruder.ListImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range imgs {
		if img.Name == name {
			t.Errorf("ListImages with another project's key lists the private %s", name)
		}
	}
	if _, err := owner.SetImagePublic(ctx, name, true); err != nil {
		t.Fatalf("SetImagePublic = %v", err)
	}
	if got := runMarker(t, intruder, name); got != "private-marker" {
		t.Errorf("another project's run of the public image = %q, want private-marker", got)
	}
}
