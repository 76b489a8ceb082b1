package layer

import (
	"fmt"
	"io"
	"os"

	"github.com/erofs/go-erofs"
)

// SplitLazy writes the lazy form of the EROFS layer image: a metadata-only
// image to meta and the file data, block aligned, to data (the image's
// device 1; mount it with device=<data>). Both files must be empty and
// open for writing; the image is not changed.
func SplitLazy(image io.ReaderAt, meta, data *os.File) error {
	src, err := erofs.Open(image)
	if err != nil {
		return fmt.Errorf("split layer: open image: %w", err)
	}
	w := erofs.Create(meta, erofs.WithDataFile(data))
	if err := w.CopyFrom(src); err != nil {
		return fmt.Errorf("split layer: %w", err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("split layer: %w", err)
	}
	return nil
}
