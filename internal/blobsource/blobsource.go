// Package blobsource reads byte ranges of content-addressed blobs from
// where a node can reach them: a local directory in internal/blobstore's
// layout (also any mounted shared file system: 3FS, CephFS, NFS), or an
// HTTP server answering Range requests (dsec blobserver, an S3-compatible
// bucket, an OCI registry's blob endpoint).
//
// Sources only read; they never cache. The node-local chunk cache
// (internal/chunkcache) sits in front of a Source and verifies what it
// returns, so a Source does not check digests.
package blobsource

import (
	"context"
	"strings"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// Source reads byte ranges of stored blobs. Implementations are safe for
// concurrent use.
type Source interface {
	// ReadAt reads len(p) bytes of blob digest at off (short only at the
	// blob's end, with io.EOF).
	ReadAt(ctx context.Context, digest string, p []byte, off int64) (int, error)
	// Size returns the blob's size (NotFound when the store has no such
	// blob).
	Size(ctx context.Context, digest string) (int64, error)
}

// Open returns the Source a spec names: "dir:/path" for a directory in
// internal/blobstore's layout, "http://…" or "https://…" for an HTTP
// server (see NewHTTP), with default HTTPOptions.
func Open(spec string) (Source, error) {
	switch {
	case strings.HasPrefix(spec, "dir:"):
		return NewDir(strings.TrimPrefix(spec, "dir:"))
	case strings.HasPrefix(spec, "http://"), strings.HasPrefix(spec, "https://"):
		return NewHTTP(spec, HTTPOptions{})
	}
	return nil, errdefs.Newf(errdefs.ErrInvalidArgument,
		"blob source %q: want dir:/path, http://… or https://…", spec)
}

// check that a digest is one we can name in a path or URL.
func checkDigest(digest string) (hexPart string, err error) {
	algo, h, ok := strings.Cut(digest, ":")
	if !ok || algo != "sha256" || len(h) != 64 {
		return "", errdefs.Newf(errdefs.ErrInvalidArgument,
			"digest %.80q: want sha256: followed by 64 lowercase hex digits", digest)
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return "", errdefs.Newf(errdefs.ErrInvalidArgument,
				"digest %.80q: want sha256: followed by 64 lowercase hex digits", digest)
		}
	}
	return h, nil
}
