// Package blobstore keeps content-addressed blobs (layer images, mostly)
// in a local directory: the embedded default of dsec's shared store, and
// what a node mounts layers from.
//
// Layout: <root>/sha256/<64 lowercase hex>, each blob a read-only file
// named by the SHA-256 of its bytes. Blobs being written are temporary
// files in the same directory whose names start with ".put-"; List never
// shows them.
//
// Invariants:
//   - A blob's file appears only complete and verified: Put writes a
//     temporary file, checks its digest, then links it into place
//     atomically. A blob is never rewritten once there.
//   - Any number of Puts, also of the same blob and from several processes
//     sharing the directory, may run at once.
//   - A Put holds a lock (flock) on its temporary file; New removes the
//     temporary files whose lock is free and that are older than a minute:
//     those a crash left behind.
//   - Only the store's owner (root, for dsec up) reads it: directories are
//     0700 and blobs 0400, since layers hold other tenants' files. New
//     takes group and other bits off what an older version made.
package blobstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dsecproject/dsec/internal/atomicfile"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// Desc describes a blob.
type Desc struct {
	// Digest is "sha256:<hex>" of the blob's bytes.
	Digest string
	// Size is the blob's length in bytes.
	Size int64
}

// Dir is a blob store in a local directory. Its methods are safe for
// concurrent use.
type Dir struct {
	dir string // <root>/sha256, absolute
}

const (
	algoSHA256 = "sha256"
	tempPrefix = ".put-"
)

// New opens the store at root, creating it when missing, and removes the
// temporary files of Puts that crashed.
func New(root string) (*Dir, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("blob store %s: %w", root, err)
	}
	d := &Dir{dir: filepath.Join(abs, algoSHA256)}
	if err := os.MkdirAll(d.dir, dirMode); err != nil {
		return nil, fmt.Errorf("create blob store: %w", err)
	}
	for _, dir := range []string{abs, d.dir} {
		if err := restrict(dir, dirMode); err != nil {
			return nil, fmt.Errorf("blob store: %w", err)
		}
	}
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return nil, fmt.Errorf("read blob store: %w", err)
	}
	for _, e := range entries {
		p := filepath.Join(d.dir, e.Name())
		if strings.HasPrefix(e.Name(), tempPrefix) {
			if err := removeIfAbandoned(p); err != nil {
				return nil, fmt.Errorf("remove abandoned upload: %w", err)
			}
			continue
		}
		if e.Type().IsRegular() {
			if err := restrict(p, blobMode); err != nil {
				return nil, fmt.Errorf("blob store: %w", err)
			}
		}
	}
	return d, nil
}

// Modes of the store's directories and blobs: the owner's only.
const (
	dirMode  fs.FileMode = 0o700
	blobMode fs.FileMode = 0o400
)

// restrict takes the group and other bits off the file at p, leaving it
// mode at most; a file already without them is not touched.
func restrict(p string, mode fs.FileMode) error {
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // deleted meanwhile
	}
	if err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSymlink != 0 || fi.Mode().Perm()&0o077 == 0 {
		return nil
	}
	return os.Chmod(p, fi.Mode().Perm()&mode)
}

// ParseDigest splits a digest into its algorithm and hex parts. It
// accepts only "sha256:" followed by 64 lowercase hex digits.
func ParseDigest(s string) (algo, hexPart string, err error) {
	algo, hexPart, ok := strings.Cut(s, ":")
	if !ok || algo != algoSHA256 || len(hexPart) != 2*sha256.Size {
		return "", "", errdefs.Newf(errdefs.ErrInvalidArgument,
			"digest %q: want sha256: followed by 64 lowercase hex digits", short(s))
	}
	for i := 0; i < len(hexPart); i++ {
		if c := hexPart[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return "", "", errdefs.Newf(errdefs.ErrInvalidArgument,
				"digest %q: want sha256: followed by 64 lowercase hex digits", short(s))
		}
	}
	return algo, hexPart, nil
}

func short(s string) string {
	if len(s) > 100 {
		return s[:80] + "…"
	}
	return s
}

// path returns the file of a blob.
func (d *Dir) path(digest string) (string, error) {
	_, h, err := ParseDigest(digest)
	if err != nil {
		return "", err
	}
	return filepath.Join(d.dir, h), nil
}

func notFound(digest string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blob %s: %w", digest, errdefs.ErrNotFound)
	}
	return fmt.Errorf("blob %s: %w", digest, err)
}

// Stat describes the blob digest; ErrNotFound when the store lacks it.
func (d *Dir) Stat(digest string) (Desc, error) {
	p, err := d.path(digest)
	if err != nil {
		return Desc{}, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return Desc{}, notFound(digest, err)
	}
	return Desc{Digest: digest, Size: fi.Size()}, nil
}

// Open opens the blob digest for reading.
func (d *Dir) Open(digest string) (*os.File, error) {
	p, err := d.path(digest)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, notFound(digest, err)
	}
	return f, nil
}

// Path returns the absolute path of the blob digest's file, which the
// kernel can mount; ErrNotFound when the store lacks it.
func (d *Dir) Path(digest string) (string, error) {
	p, err := d.path(digest)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(p); err != nil {
		return "", notFound(digest, err)
	}
	return p, nil
}

// Delete removes the blob digest. Deleting a blob the store lacks returns
// nil. Files already open (or mounted) keep their data.
func (d *Dir) Delete(digest string) error {
	p, err := d.path(digest)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete blob %s: %w", digest, err)
	}
	return nil
}

// List describes every blob of the store, sorted by digest.
func (d *Dir) List() ([]Desc, error) {
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return nil, fmt.Errorf("list blobs: %w", err)
	}
	var out []Desc
	for _, e := range entries {
		digest := algoSHA256 + ":" + e.Name()
		if _, _, err := ParseDigest(digest); err != nil || !e.Type().IsRegular() {
			continue // an upload in progress, or not ours
		}
		fi, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("list blobs: %w", err)
		}
		out = append(out, Desc{Digest: digest, Size: fi.Size()})
	}
	slices.SortFunc(out, func(a, b Desc) int { return strings.Compare(a.Digest, b.Digest) })
	return out, nil
}

// Put stores the bytes of r and returns their Desc. When want is not
// empty the bytes must have that digest: otherwise Put fails with
// ErrInvalidArgument and keeps nothing; and when the store already has
// want, Put returns at once without reading r. A blob the store already
// has is not rewritten.
func (d *Dir) Put(ctx context.Context, r io.Reader, want string) (Desc, error) {
	if want != "" {
		if _, _, err := ParseDigest(want); err != nil {
			return Desc{}, err
		}
		if desc, err := d.Stat(want); err == nil {
			return desc, nil
		}
	}

	tmp, err := os.CreateTemp(d.dir, tempPrefix+"*")
	if err != nil {
		return Desc{}, fmt.Errorf("put blob: %w", err)
	}
	// The lock tells New that this upload is alive; closing drops it.
	defer func() {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
	}()
	if err := lockFile(tmp); err != nil {
		return Desc{}, fmt.Errorf("put blob: lock %s: %w", tmp.Name(), err)
	}

	h := sha256.New()
	size, err := io.Copy(io.MultiWriter(tmp, h), &ctxReader{ctx: ctx, r: r})
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return Desc{}, ctxErr
		}
		return Desc{}, fmt.Errorf("put blob: %w", err)
	}
	desc := Desc{Digest: algoSHA256 + ":" + hex.EncodeToString(h.Sum(nil)), Size: size}
	if want != "" && desc.Digest != want {
		return Desc{}, errdefs.Newf(errdefs.ErrInvalidArgument,
			"blob content has digest %s, not the expected %s: the data was corrupted or the digest is wrong", desc.Digest, want)
	}
	if err := tmp.Chmod(blobMode); err != nil {
		return Desc{}, fmt.Errorf("put blob: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return Desc{}, fmt.Errorf("put blob: %w", err)
	}

	final := filepath.Join(d.dir, desc.Digest[len(algoSHA256)+1:])
	if err := publish(tmp.Name(), final); err != nil {
		return Desc{}, fmt.Errorf("put blob %s: %w", desc.Digest, err)
	}
	if err := atomicfile.SyncDir(d.dir); err != nil {
		return Desc{}, fmt.Errorf("put blob %s: %w", desc.Digest, err)
	}
	return desc, nil
}

// publish puts the finished file tmp at final unless final exists. A hard
// link never replaces an existing file; where the file system has no hard
// links, a rename does (of the same bytes).
func publish(tmp, final string) error {
	err := os.Link(tmp, final)
	if err == nil || errors.Is(err, fs.ErrExist) {
		return nil
	}
	if _, serr := os.Stat(final); serr == nil {
		return nil
	}
	return os.Rename(tmp, final)
}

// ctxReader stops a copy when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
