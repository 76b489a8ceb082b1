package cluster

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/errdefs"
)

func TestLayerLazyForm(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{})
	form := &LazyForm{Meta: digestOf("meta"), Data: digestOf("data"), DataSize: 3 << 20, ChunkSize: 1 << 20,
		ChunkDigests: []string{digestOf("c0"), digestOf("c1"), digestOf("c2")}}

	// A layer recorded eagerly gets its lazy form added later; a record
	// without one reads back without one (older records have none).
	l := Layer{Digest: digestOf("layer"), Size: 10, CreatedAt: created}
	if err := s.PutLayer(ctx, l); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetLayer(ctx, l.Digest); err != nil || got.Lazy != nil {
		t.Fatalf("GetLayer = %+v, %v; want no lazy form", got, err)
	}
	l.Lazy = form
	if err := s.PutLayer(ctx, l); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetLayer(ctx, l.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(form, got.Lazy); diff != "" {
		t.Errorf("GetLayer lazy form (-want +got):\n%s", diff)
	}

	bad := *form
	bad.ChunkDigests = bad.ChunkDigests[:2]
	l2 := Layer{Digest: digestOf("layer2"), Size: 10, Lazy: &bad}
	if err := s.PutLayer(ctx, l2); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("PutLayer with 2 chunk digests for 3 chunks = %v, want InvalidArgument", err)
	}
}
