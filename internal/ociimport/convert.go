package ociimport

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/layer"
)

// layerTypes are the media types of the layers Import converts: tar,
// plain or compressed. Foreign and non-distributable layers (Windows base
// layers) and anything else are refused.
var layerTypes = []types.MediaType{
	types.OCILayer, types.OCIUncompressedLayer, types.OCILayerZStd,
	types.DockerLayer, types.DockerUncompressedLayer,
}

func supported(mt types.MediaType) bool {
	for _, t := range layerTypes {
		if mt == t {
			return true
		}
	}
	return false
}

func supportedList() string {
	s := make([]string, len(layerTypes))
	for i, t := range layerTypes {
		s[i] = string(t)
	}
	return strings.Join(s, ", ")
}

// maxTrailer bounds what may follow a tar's end marker in a layer (GNU tar
// pads to 10 KiB records); more is refused, not read forever.
const maxTrailer = 1 << 20

// convert builds the EROFS layer of the manifest's layer d into out,
// checking the blob's digest and size against d and the uncompressed tar's
// against diffID (when not zero).
func convert(ctx context.Context, img v1.Image, d v1.Descriptor, diffID v1.Hash, out *os.File, i, n int, opts Options) (LayerResult, error) {
	lr := LayerResult{Source: d.Digest.String(), MediaType: string(d.MediaType)}
	l, err := img.LayerByDigest(d.Digest)
	if err != nil {
		return lr, fmt.Errorf("find blob: %w", err)
	}
	rc, err := l.Compressed()
	if err != nil {
		return lr, blobErr(err)
	}
	defer rc.Close()

	blob := &hashReader{r: rc, h: sha256.New()}
	counted := &countReader{r: blob, report: func(done int64) {
		opts.progress(Event{Phase: PhaseConvert, Index: i, Count: n, Done: done, Total: d.Size, Layer: lr})
	}}
	br := bufio.NewReaderSize(counted, 64<<10)
	magic, _ := br.Peek(4)
	var tarStream io.Reader = br
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return lr, corrupt(blob, d, "bad gzip header: %v", err)
		}
		defer zr.Close()
		tarStream = zr
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true))
		if err != nil {
			return lr, corrupt(blob, d, "bad zstd header: %v", err)
		}
		defer zr.Close()
		tarStream = zr
	}
	unc := &hashReader{r: tarStream, h: sha256.New()}

	info, err := layer.BuildFromTar(ctx, unc, out, layer.Options{
		OCIWhiteouts: true,
		TempDir:      opts.TempDir,
		MaxSize:      opts.MaxLayerSize,
	})
	if err != nil {
		if ctx.Err() != nil {
			return lr, ctx.Err()
		}
		if blob.err != nil {
			return lr, blob.failure(d)
		}
		if unc.err != nil {
			return lr, corrupt(blob, d, "decompress: %v", unc.err)
		}
		return lr, err
	}
	// Read what follows the tar's end marker, so that both digests cover
	// the whole blob.
	if m, err := io.Copy(io.Discard, io.LimitReader(unc, maxTrailer+1)); err != nil {
		if blob.err != nil {
			return lr, blob.failure(d)
		}
		return lr, corrupt(blob, d, "decompress: %v", err)
	} else if m > maxTrailer {
		return lr, errdefs.Newf(errdefs.ErrInvalidArgument, "more than %d bytes follow the tar stream's end: the layer is not a tar archive", maxTrailer)
	}
	if _, err := io.Copy(io.Discard, io.LimitReader(br, maxTrailer+1)); err != nil {
		return lr, blob.failure(d)
	}
	if err := blob.check(d); err != nil {
		return lr, err
	}
	lr.DiffID = unc.digest()
	if diffID != (v1.Hash{}) && lr.DiffID != diffID.String() {
		return lr, errdefs.Newf(errdefs.ErrInvalidArgument, "uncompressed layer has digest %s, the image config's diff_id is %s: the image is corrupt or was tampered with; nothing was imported",
			lr.DiffID, diffID)
	}
	lr.Digest, lr.Size, lr.Files, lr.Skipped = info.Digest, info.Size, info.Files, info.Skipped
	return lr, nil
}

// corrupt is the error of a blob whose content cannot be decoded. A blob
// that is also shorter than the manifest says is called truncated.
func corrupt(blob *hashReader, d v1.Descriptor, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if _, err := io.Copy(io.Discard, io.LimitReader(blob, d.Size+1)); err == nil && d.Size > 0 && blob.n < d.Size {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "blob is truncated: %d of %d bytes (%s)", blob.n, d.Size, msg)
	}
	return errdefs.Newf(errdefs.ErrInvalidArgument, "blob is corrupt: %s", msg)
}

// blobErr classifies a failure to read a blob from its source.
func blobErr(err error) error {
	if errdefs.Kind(err) != errdefs.ErrInternal || errors.Is(err, context.Canceled) {
		return err
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "blob is truncated: %v", err)
	}
	return errdefs.Newf(errdefs.ErrUnavailable, "read blob: %v", err)
}

// hashReader hashes and counts what is read through it and keeps the
// first error that is not io.EOF.
type hashReader struct {
	r   io.Reader
	h   hash.Hash
	n   int64
	err error
}

func (r *hashReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.h.Write(p[:n])
	r.n += int64(n)
	if err != nil && err != io.EOF && r.err == nil {
		r.err = err
	}
	return n, err
}

// check compares what was read with the manifest's descriptor.
func (r *hashReader) check(d v1.Descriptor) error {
	if got := r.digest(); got != d.Digest.String() || d.Size > 0 && r.n != d.Size {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "blob has digest %s and %d bytes, the manifest says %s and %d bytes: the blob is corrupt or was tampered with; nothing was imported",
			got, r.n, d.Digest, d.Size)
	}
	return nil
}

// failure is the error of a blob whose reading failed: a digest mismatch
// when the source checks digests itself (a registry) and the whole blob
// was read, else the read error.
func (r *hashReader) failure(d v1.Descriptor) error {
	if d.Size > 0 && r.n == d.Size {
		if err := r.check(d); err != nil {
			return err
		}
	}
	return blobErr(r.err)
}

func (r *hashReader) digest() string { return "sha256:" + hex.EncodeToString(r.h.Sum(nil)) }
