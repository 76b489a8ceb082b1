package swap

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/atomicfile"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// swapMagic ends the first page of a swap area of version 1 (mkswap's
// "SWAPSPACE2").
const swapMagic = "SWAPSPACE2"

// Enable provisions spec as the swap file of stateDir and turns it on.
// A swap file the record names is taken as it is when it is spec's and
// on; any other (of an earlier --swap, or left off by a crash) is turned
// off and removed first. It fails with AlreadyExists when a file that is
// not dsec's is at spec.Path, and FailedPrecondition when the file
// system cannot hold a swap file.
func Enable(stateDir string, spec Spec, log *slog.Logger) (Status, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := spec.Validate(); err != nil {
		return Status{}, err
	}
	page := int64(os.Getpagesize())
	spec.Size -= spec.Size % page
	if st, err := Current(stateDir); err != nil {
		return Status{}, err
	} else if st.Record.Path != "" {
		if st.Active && st.Record.Path == spec.Path && st.Record.Size == spec.Size && ours(st.Record) {
			log.Info("swap file already on", "path", spec.Path, "size", spec.Size, "used", st.Used)
			return st, nil
		}
		if _, err := Disable(stateDir, log); err != nil {
			return Status{}, fmt.Errorf("turn off the earlier swap file %s: %w", st.Record.Path, err)
		}
	}
	rec := Record{Path: spec.Path, Size: spec.Size, Created: time.Now().UTC()}
	if err := writeRecord(stateDir, rec); err != nil {
		return Status{}, err
	}
	f, err := os.OpenFile(spec.Path, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		_ = os.Remove(RecordPath(stateDir))
		if errors.Is(err, fs.ErrExist) {
			return Status{}, errdefs.Newf(errdefs.ErrAlreadyExists,
				"swap file %s exists and is not dsec's: remove it or give --swap another path", spec.Path)
		}
		return Status{}, fmt.Errorf("make swap file: %w", err)
	}
	made := func() error {
		defer f.Close()
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			return err
		}
		rec.Dev, rec.Ino = st.Dev, st.Ino
		if err := writeRecord(stateDir, rec); err != nil {
			return err
		}
		return fill(f, spec.Size, page, false)
	}()
	if made == nil {
		made = swapon(spec.Path)
		if errors.Is(made, unix.EINVAL) {
			// Some file systems refuse preallocated (unwritten) extents
			// for swap: write the zeros.
			made = refill(spec.Path, spec.Size, page)
			if made == nil {
				made = swapon(spec.Path)
			}
		}
	}
	if made != nil {
		_ = os.Remove(spec.Path)
		_ = os.Remove(RecordPath(stateDir))
		if errors.Is(made, unix.EINVAL) {
			return Status{}, errdefs.Newf(errdefs.ErrFailedPrecondition,
				"swap file %s: its file system cannot hold a swap file (tmpfs and btrfs without nodatacow cannot): give --swap a path on ext4 or xfs", spec.Path)
		}
		if errors.Is(made, unix.EPERM) {
			return Status{}, errdefs.Newf(errdefs.ErrPermissionDenied,
				"swap file %s: swapon refused (%v): run dsec up as root, on a host with fewer than the kernel's maximum of swap areas", spec.Path, made)
		}
		return Status{}, fmt.Errorf("swap file %s: %w", spec.Path, made)
	}
	log.Info("swap file on", "path", spec.Path, "size", spec.Size)
	return Current(stateDir)
}

// Disable turns off the swap file the record of stateDir names, removes
// it and the record, and reports what it found (none: ok false). swapoff
// brings what is in the file back into memory first, which takes as long
// as reading it; it fails with ResourceExhausted when the memory is not
// there, leaving the file on and recorded.
func Disable(stateDir string, log *slog.Logger) (Record, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	st, err := Current(stateDir)
	if err != nil || st.Record.Path == "" {
		return st.Record, err
	}
	rec := st.Record
	mine := ours(rec)
	switch {
	case st.Active && mine:
		t0 := time.Now()
		if err := swapoff(rec.Path); err != nil {
			if errors.Is(err, unix.ENOMEM) {
				return rec, errdefs.Newf(errdefs.ErrResourceExhausted,
					"turn off swap file %s: the %d MiB in it do not fit in memory: delete paused sandboxes (or free memory) and try again", rec.Path, st.Used>>20)
			}
			return rec, fmt.Errorf("turn off swap file %s: %w", rec.Path, err)
		}
		log.Info("swap file off", "path", rec.Path, "used", st.Used, "ms", time.Since(t0).Milliseconds())
	case st.Active:
		// Something else is on at the path now: not dsec's to turn off.
		log.Warn("the swap file at the recorded path is not the one dsec made; leaving it on", "path", rec.Path)
	}
	if mine {
		if err := os.Remove(rec.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return rec, fmt.Errorf("remove swap file: %w", err)
		}
	}
	if err := os.Remove(RecordPath(stateDir)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return rec, fmt.Errorf("remove swap record: %w", err)
	}
	return rec, nil
}

// Current reports the swap file of stateDir: its record (Path empty when
// there is none) and whether the host swaps to it.
func Current(stateDir string) (Status, error) {
	rec, ok, err := ReadRecord(stateDir)
	if err != nil || !ok {
		return Status{}, err
	}
	st := Status{Record: rec}
	b, err := os.ReadFile("/proc/swaps")
	if err != nil {
		return st, fmt.Errorf("read /proc/swaps: %w", err)
	}
	entries, err := ParseSwaps(string(b))
	if err != nil {
		return st, err
	}
	for _, e := range entries {
		if e.Path == rec.Path {
			st.Active, st.Used = true, e.Used
		}
	}
	return st, nil
}

// ours reports whether the file at rec.Path is the one rec names: its
// device and inode, its size and its swap header (a file made at the name
// after the swap file's removal may get its inode number again), or
// (recorded before the file was made) a regular file changed since the
// record was written.
func ours(rec Record) bool {
	var st unix.Stat_t
	if err := unix.Lstat(rec.Path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false
	}
	if rec.Ino != 0 {
		return st.Dev == rec.Dev && st.Ino == rec.Ino && st.Size == rec.Size && hasSwapMagic(rec.Path)
	}
	return !time.Unix(st.Ctim.Unix()).Before(rec.Created.Truncate(time.Second))
}

// hasSwapMagic reports whether the file at path ends its first page with
// a swap header's signature.
func hasSwapMagic(path string) bool {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, len(swapMagic))
	_, err = f.ReadAt(b, int64(os.Getpagesize()-len(swapMagic)))
	return err == nil && string(b) == swapMagic
}

func writeRecord(stateDir string, rec Record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(RecordPath(stateDir), append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("write swap record: %w", err)
	}
	return nil
}

// fill gives f size bytes without holes (preallocated, or zeros when
// zeros or the file system says so) and writes the swap header.
func fill(f *os.File, size, page int64, zeros bool) error {
	if !zeros {
		err := unix.Fallocate(int(f.Fd()), 0, 0, size)
		if errors.Is(err, unix.EOPNOTSUPP) {
			zeros = true
		} else if err != nil {
			if errors.Is(err, unix.ENOSPC) {
				return errdefs.Newf(errdefs.ErrResourceExhausted, "swap file of %d MiB: no space left on its file system: give --swap a smaller size or another path", size>>20)
			}
			return fmt.Errorf("allocate swap file: %w", err)
		}
	}
	if zeros {
		buf := make([]byte, 1<<20)
		for off := int64(0); off < size; off += int64(len(buf)) {
			n := min(int64(len(buf)), size-off)
			if _, err := f.WriteAt(buf[:n], off); err != nil {
				return fmt.Errorf("write swap file: %w", err)
			}
		}
	}
	if _, err := f.WriteAt(header(size, page), 0); err != nil {
		return fmt.Errorf("write swap header: %w", err)
	}
	return f.Sync()
}

// refill writes the whole file at path again, with zeros.
func refill(path string, size, page int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return fill(f, size, page, true)
}

// header is the first page of a swap area of version 1 (the kernel's
// union swap_header): 1024 bytes for a boot block, then version,
// last_page, nr_badpages, a UUID and a label, and the magic at the
// page's end.
func header(size, page int64) []byte {
	h := make([]byte, page)
	binary.NativeEndian.PutUint32(h[1024:], 1)                   // version
	binary.NativeEndian.PutUint32(h[1028:], uint32(size/page-1)) // last_page
	binary.NativeEndian.PutUint32(h[1032:], 0)                   // nr_badpages
	copy(h[1036:1052], []byte("dsec-swap-file\x00\x00"))         // sws_uuid: any 16 bytes
	copy(h[1052:1068], []byte("dsec"))                           // sws_volume
	copy(h[page-int64(len(swapMagic)):], swapMagic)              // magic
	return h
}
