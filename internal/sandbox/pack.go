package sandbox

import (
	"context"
	"io"
	"time"
)

// Packer is the optional capability of turning a sandbox's writable layer
// into a read-only layer (pack_diff). PackDiff freezes the sandbox while
// it reads the writable layer and lets it run on afterwards; a second
// PackDiff of a sandbox while one runs, or a PackDiff of a sandbox being
// deleted, is ErrFailedPrecondition.
type Packer interface {
	PackDiff(ctx context.Context, id string, scrub []string) (*PackedLayer, error)
}

// PackedLayer is a layer PackDiff made: an EROFS image that overlayfs
// stacks above the sandbox's layers to give what the sandbox had.
type PackedLayer struct {
	// Digest is "sha256:<hex>" of the image; Size its length.
	Digest string
	Size   int64
	// Files counts the names in the layer.
	Files int
	// Frozen is how long the sandbox was frozen.
	Frozen time.Duration
	// Body is the image. The caller reads it and closes it.
	Body io.ReadCloser
}
