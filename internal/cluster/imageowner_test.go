package cluster

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/errdefs"
)

var (
	adminP  = Principal{Project: DefaultProject, Admin: true}
	victimP = Principal{Project: "victim"}
	hostile = Principal{Project: "mallory"}
)

func ptr[T any](v T) *T { return &v }

// TestImageOwnership runs the rules of WriteImage, DeleteImage and
// SetImagePublic as the owner, another project and an admin.
func TestImageOwnership(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{})
	layers := putLayers(t, s, "victim-base", "victim-marker", "attacker-marker")
	base, marker, evil := layers[0], layers[1], layers[2]
	app := Image{Name: "victim/app", Tag: "latest", Layers: []string{base, marker}, CreatedAt: created}

	got, err := s.WriteImage(ctx, app, ImageWrite{By: victimP})
	if err != nil {
		t.Fatalf("WriteImage(new, as victim) = %v", err)
	}
	if got.Project != "victim" || got.Public {
		t.Errorf("WriteImage(new) = project %q public %v, want victim, private", got.Project, got.Public)
	}

	check := func(what string) {
		t.Helper()
		img, err := s.GetImage(ctx, app.Ref())
		if err != nil || !cmp.Equal(img.Layers, app.Layers) || img.Project != "victim" {
			t.Errorf("after %s: GetImage = %v %q, %v, want the victim's layers %v", what, img.Layers, img.Project, err, app.Layers)
		}
	}

	// Another project may neither rewrite the tag (with or without force,
	// other layers or the same) nor delete it nor publish it.
	evilImg := app
	evilImg.Layers = []string{base, evil}
	for _, tt := range []struct {
		name string
		img  Image
		w    ImageWrite
	}{
		{"other layers", evilImg, ImageWrite{By: hostile}},
		{"other layers, force", evilImg, ImageWrite{By: hostile, Force: true}},
		{"same layers", app, ImageWrite{By: hostile}},
		{"same layers, make public", app, ImageWrite{By: hostile, Public: ptr(true)}},
	} {
		if _, err := s.WriteImage(ctx, tt.img, tt.w); !errdefs.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("WriteImage(%s, as another project) = %v, want PermissionDenied", tt.name, err)
		}
	}
	// A private image does not exist for another project.
	if _, err := s.DeleteImage(ctx, app.Ref(), hostile); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("DeleteImage(private, as another project) = %v, want NotFound", err)
	}
	if _, err := s.SetImagePublic(ctx, app.Ref(), true, hostile); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("SetImagePublic(private, as another project) = %v, want NotFound", err)
	}
	check("another project's writes")

	// The owner: the same content again is a no-op without force; other
	// layers need force.
	again := app
	again.CreatedAt = created.Add(1)
	if img, err := s.WriteImage(ctx, again, ImageWrite{By: victimP}); err != nil || !img.CreatedAt.Equal(created) {
		t.Errorf("WriteImage(same content, as owner) = %v, %v, want the unchanged image", img.CreatedAt, err)
	}
	moved := app
	moved.Layers = []string{base}
	if _, err := s.WriteImage(ctx, moved, ImageWrite{By: victimP}); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("WriteImage(other layers, as owner, no force) = %v, want FailedPrecondition", err)
	}
	cfgOnly := app
	cfgOnly.Config.Env = []string{"A=1"}
	if _, err := s.WriteImage(ctx, cfgOnly, ImageWrite{By: victimP}); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("WriteImage(other config, as owner, no force) = %v, want FailedPrecondition", err)
	}
	check("the owner's writes without force")

	// Public: the owner publishes it; then another project sees it
	// (PermissionDenied instead of NotFound) but still cannot touch it.
	if img, err := s.WriteImage(ctx, app, ImageWrite{By: victimP, Public: ptr(true)}); err != nil || !img.Public {
		t.Errorf("WriteImage(same content, public, as owner) = public %v, %v, want public", img.Public, err)
	}
	if img, err := s.WriteImage(ctx, app, ImageWrite{By: victimP}); err != nil || !img.Public {
		t.Errorf("WriteImage(same content, public unset) = public %v, %v, want it kept public", img.Public, err)
	}
	if _, err := s.DeleteImage(ctx, app.Ref(), hostile); !errdefs.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("DeleteImage(public, as another project) = %v, want PermissionDenied", err)
	}
	if _, err := s.SetImagePublic(ctx, app.Ref(), false, hostile); !errdefs.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("SetImagePublic(public, as another project) = %v, want PermissionDenied", err)
	}
	check("another project's writes to the public image")

	// With force, the owner replaces it; it stays the owner's and public.
	img, err := s.WriteImage(ctx, moved, ImageWrite{By: victimP, Force: true})
	if err != nil || !cmp.Equal(img.Layers, moved.Layers) || img.Project != "victim" || !img.Public {
		t.Errorf("WriteImage(other layers, force, as owner) = %+v, %v, want the new layers, victim's, public", img, err)
	}
	// An admin may rewrite and delete anything; the image keeps its owner.
	if img, err := s.WriteImage(ctx, app, ImageWrite{By: adminP, Force: true}); err != nil || img.Project != "victim" {
		t.Errorf("WriteImage(force, as admin) = project %q, %v, want victim's", img.Project, err)
	}
	if img, err := s.SetImagePublic(ctx, app.Ref(), false, victimP); err != nil || img.Public {
		t.Errorf("SetImagePublic(private, as owner) = %v, %v, want private", img.Public, err)
	}
	if _, err := s.DeleteImage(ctx, app.Ref(), adminP); err != nil {
		t.Errorf("DeleteImage(as admin) = %v", err)
	}
	// Once deleted, the name is free for anyone.
	if img, err := s.WriteImage(ctx, evilImg, ImageWrite{By: hostile}); err != nil || img.Project != "mallory" {
		t.Errorf("WriteImage(deleted name, as another project) = %q, %v, want it mallory's", img.Project, err)
	}
}

// TestImageLegacyOwner checks that images recorded before owners existed
// belong to the default project and are public.
func TestImageLegacyOwner(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{})
	layers := putLayers(t, s, "old")
	old := `{"version":1,"name":"busybox","tag":"latest","layers":["` + layers[0] + `"],"created_at":"2026-03-04T05:06:07Z"}`
	if _, err := shared.Client().Put(ctx, s.imageKey(Ref{"busybox", "latest"}), old); err != nil {
		t.Fatal(err)
	}
	img, err := s.GetImage(ctx, Ref{"busybox", "latest"})
	if err != nil || img.Project != DefaultProject || !img.Public {
		t.Fatalf("GetImage(legacy) = project %q public %v, %v, want default, public", img.Project, img.Public, err)
	}
	if !img.RunnableBy(hostile) || img.WritableBy(hostile) || !img.WritableBy(Principal{Project: DefaultProject}) {
		t.Errorf("legacy image: runnable by others %v, writable by others %v, by default %v; want true, false, true",
			img.RunnableBy(hostile), img.WritableBy(hostile), img.WritableBy(Principal{Project: DefaultProject}))
	}
	if _, err := s.DeleteImage(ctx, img.Ref(), hostile); !errdefs.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("DeleteImage(legacy, as another project) = %v, want PermissionDenied", err)
	}
}

// TestWriteImageRace has two projects create the same new tag at once:
// exactly one owns it, and the other is refused.
func TestWriteImageRace(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{})
	layers := putLayers(t, s, "a", "b")
	for i := range 20 {
		ref := Ref{Name: "race", Tag: "t" + itoa(i)}
		errs := make(chan error, 2)
		for j, p := range []Principal{victimP, hostile} {
			go func() {
				_, err := s.WriteImage(ctx, Image{Name: ref.Name, Tag: ref.Tag, Layers: layers[j : j+1]}, ImageWrite{By: p})
				errs <- err
			}()
		}
		e1, e2 := <-errs, <-errs
		if (e1 == nil) == (e2 == nil) {
			t.Fatalf("two projects writing %s at once: %v and %v, want exactly one refused", ref, e1, e2)
		}
		img, err := s.GetImage(ctx, ref)
		if err != nil || img.Project != map[string]string{layers[0]: "victim", layers[1]: "mallory"}[img.Layers[0]] {
			t.Errorf("GetImage(%s) = %+v, %v: owner does not match its layers", ref, img, err)
		}
	}
}

func itoa(i int) string { return string(rune('a'+i/10)) + string(rune('0'+i%10)) }
