//go:build !linux

package layer

import (
	"context"
	"errors"
	"io"
)

// BuildFromDir builds a layer from a directory; it needs Linux.
func BuildFromDir(ctx context.Context, dir string, out io.WriteSeeker, opts Options) (Info, error) {
	return Info{}, errors.ErrUnsupported
}
