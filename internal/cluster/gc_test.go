package cluster

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/errdefs"
)

func digestsOf(ls []StoredLayer) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.Digest)
	}
	slices.Sort(out)
	return out
}

func sorted(ds ...string) []string {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds
}

func TestLayerCollection(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{})
	clock := &fakeClock{t: created}
	s.now = clock.now
	const grace = 10 * time.Minute

	// base is shared by two images, ws by one; orphan by none; fresh was
	// just uploaded and no image names it yet.
	ls := putLayers(t, s, "base", "ws", "orphan")
	base, ws, orphan := ls[0], ls[1], ls[2]
	for _, img := range []Image{
		{Name: "base/py310", Tag: "3", Layers: []string{base}},
		{Name: "ws/sphinx-9658", Tag: "1", Layers: []string{base, ws}},
	} {
		if err := s.PutImage(ctx, img); err != nil {
			t.Fatalf("PutImage(%s) = %v", img.Ref(), err)
		}
	}
	clock.advance(time.Hour)
	fresh := Layer{Digest: digestOf("fresh"), Size: 5}
	if err := s.PutLayer(ctx, fresh); err != nil {
		t.Fatalf("PutLayer(fresh) = %v", err)
	}

	st, err := s.LayerState(ctx)
	if err != nil {
		t.Fatalf("LayerState() = %v", err)
	}
	refs := st.References()
	if want := []string{"base/py310:3", "ws/sphinx-9658:1"}; !cmp.Equal(sorted(refs[base]...), want) {
		t.Errorf("References()[base] = %v, want %v", refs[base], want)
	}
	remove, kept := st.Collectable(clock.now(), grace)
	if got, want := digestsOf(remove), []string{orphan}; !cmp.Equal(got, want) {
		t.Errorf("Collectable() removes %v, want only the orphan %v", got, want)
	}
	if _, ok := kept[fresh.Digest]; !ok || len(kept) != 1 {
		t.Errorf("Collectable() kept %v, want the fresh layer within its grace period", kept)
	}

	// Removing an image releases its layers: ws is unreferenced now but
	// kept for the grace period, base is still referenced.
	if _, err := s.DeleteImage(ctx, Ref{"ws/sphinx-9658", "1"}, adminP); err != nil {
		t.Fatalf("DeleteImage = %v", err)
	}
	st, err = s.LayerState(ctx)
	if err != nil {
		t.Fatalf("LayerState() = %v", err)
	}
	remove, kept = st.Collectable(clock.now(), grace)
	if got, want := digestsOf(remove), []string{orphan}; !cmp.Equal(got, want) {
		t.Errorf("Collectable() after DeleteImage removes %v, want %v", got, want)
	}
	if _, ok := kept[ws]; !ok {
		t.Errorf("Collectable() kept %v, want the released layer ws among them", kept)
	}
	clock.advance(grace)
	remove, _ = st.Collectable(clock.now(), grace)
	if got, want := digestsOf(remove), sorted(orphan, ws, fresh.Digest); !cmp.Equal(got, want) {
		t.Errorf("Collectable() after the grace period removes %v, want %v", got, want)
	}

	// An image written after the state was read may name a candidate:
	// DeleteLayer refuses, and the layer stays.
	if err := s.PutImage(ctx, Image{Name: "tk/harness", Tag: "12", Layers: []string{ws}}); err != nil {
		t.Fatalf("PutImage(tk/harness:12) = %v", err)
	}
	for _, l := range remove {
		if err := s.DeleteLayer(ctx, st, l); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("DeleteLayer(%s) after an image write = %v, want FailedPrecondition", l.Digest, err)
		}
	}
	if _, err := s.GetLayer(ctx, ws); err != nil {
		t.Errorf("GetLayer(ws) = %v, want it kept", err)
	}

	// With a fresh state, the orphan and the fresh layer go; ws and base,
	// referenced, stay.
	st, err = s.LayerState(ctx)
	if err != nil {
		t.Fatalf("LayerState() = %v", err)
	}
	remove, _ = st.Collectable(clock.now(), grace)
	if got, want := digestsOf(remove), sorted(orphan, fresh.Digest); !cmp.Equal(got, want) {
		t.Fatalf("Collectable() = %v, want %v", got, want)
	}
	for _, l := range remove {
		if err := s.DeleteLayer(ctx, st, l); err != nil {
			t.Errorf("DeleteLayer(%s) = %v", l.Digest, err)
		}
		if _, err := s.GetLayer(ctx, l.Digest); !errdefs.Is(err, errdefs.ErrNotFound) {
			t.Errorf("GetLayer(%s) after DeleteLayer = %v, want NotFound", l.Digest, err)
		}
	}
	all, err := s.ListLayers(ctx)
	if err != nil || len(all) != 2 {
		t.Errorf("ListLayers() = %d layers, %v, want base and ws", len(all), err)
	}
	// An image naming a collected layer cannot be written.
	if err := s.PutImage(ctx, Image{Name: "late", Tag: "1", Layers: []string{orphan}}); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("PutImage(collected layer) = %v, want FailedPrecondition", err)
	}
}

func TestReplacingAnImageReleasesItsLayers(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{})
	clock := &fakeClock{t: created}
	s.now = clock.now
	ls := putLayers(t, s, "v1", "v2")
	clock.advance(time.Hour)
	for _, d := range ls {
		if err := s.PutImage(ctx, Image{Name: "app", Tag: "latest", Layers: []string{d}}); err != nil {
			t.Fatalf("PutImage = %v", err)
		}
	}
	st, err := s.LayerState(ctx)
	if err != nil {
		t.Fatalf("LayerState() = %v", err)
	}
	if remove, kept := st.Collectable(clock.now(), time.Minute); len(remove) != 0 || kept[ls[0]] == "" {
		t.Errorf("Collectable() = %v, %v, want v1 kept as just released", digestsOf(remove), kept)
	}
}
