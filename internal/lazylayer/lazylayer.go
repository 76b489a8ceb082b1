// Package lazylayer makes the lazy form of a stored layer (dsec up
// --lazy-layers): a metadata-only EROFS image and a block-aligned data
// blob, both stored by digest beside the layer, plus the digests of the
// data blob's chunks that the node chunk cache verifies. A node that has a
// blob source then fetches only the metadata image and mounts EROFS with
// its data device served by internal/lazyfs.
package lazylayer

import (
	"context"
	"fmt"
	"os"

	"github.com/dsecproject/dsec/internal/blobstore"
	"github.com/dsecproject/dsec/internal/chunkcache"
	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/layer"
)

// DefaultChunkSize is the chunk size of the digests recorded for a data
// blob; the node chunk cache must use the same.
const DefaultChunkSize = 1 << 20

// Make splits the stored layer digest into its lazy form, stores the two
// blobs in blobs and returns what to record on the layer. chunkSize 0
// means DefaultChunkSize.
func Make(ctx context.Context, blobs *blobstore.Dir, digest string, chunkSize int64) (*cluster.LazyForm, error) {
	if chunkSize <= 0 {
		chunkSize = DefaultChunkSize
	}
	img, err := blobs.Open(digest)
	if err != nil {
		return nil, fmt.Errorf("lazy form of %s: %w", digest, err)
	}
	defer img.Close()
	tmp, err := os.MkdirTemp("", "dsec-lazy-")
	if err != nil {
		return nil, fmt.Errorf("lazy form of %s: %w", digest, err)
	}
	defer os.RemoveAll(tmp)
	meta, err := os.CreateTemp(tmp, "meta-")
	if err != nil {
		return nil, fmt.Errorf("lazy form of %s: %w", digest, err)
	}
	defer meta.Close()
	data, err := os.CreateTemp(tmp, "data-")
	if err != nil {
		return nil, fmt.Errorf("lazy form of %s: %w", digest, err)
	}
	defer data.Close()
	if err := layer.SplitLazy(img, meta, data); err != nil {
		return nil, fmt.Errorf("lazy form of %s: %w", digest, err)
	}
	st, err := data.Stat()
	if err != nil {
		return nil, fmt.Errorf("lazy form of %s: %w", digest, err)
	}
	f := &cluster.LazyForm{DataSize: st.Size(), ChunkSize: chunkSize}
	if f.ChunkDigests, err = chunkcache.ChunkDigests(data, f.DataSize, chunkSize); err != nil {
		return nil, fmt.Errorf("lazy form of %s: chunk digests: %w", digest, err)
	}
	for _, b := range []struct {
		f   *os.File
		out *string
	}{{meta, &f.Meta}, {data, &f.Data}} {
		if _, err := b.f.Seek(0, 0); err != nil {
			return nil, fmt.Errorf("lazy form of %s: %w", digest, err)
		}
		desc, err := blobs.Put(ctx, b.f, "")
		if err != nil {
			return nil, fmt.Errorf("lazy form of %s: %w", digest, err)
		}
		*b.out = desc.Digest
	}
	return f, nil
}
