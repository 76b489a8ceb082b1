//go:build !linux

package layer

import (
	"context"
	"errors"
	"io"
)

// BuildDiff builds a layer from an overlayfs upper directory; it needs
// Linux.
func BuildDiff(ctx context.Context, upper string, out io.WriteSeeker, d Diff, opts Options) (Info, error) {
	return Info{}, errors.ErrUnsupported
}
