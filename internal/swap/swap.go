// Package swap provisions the node's swap file: the swap that paused
// sandboxes' memory goes to (docs/pause.md). dsec makes it, enables it and
// removes it itself, because a swap file is the whole host's: every
// process may be swapped to it while it is on.
//
// Enable makes the file without holes (fallocate, or zeros where the file
// system refuses preallocated space for swap), writes the swap header
// itself (no mkswap needed) and enables it with swapon(2). Before it makes
// anything it writes a record, <state-dir>/swap.json, so that whatever
// comes next finds a swap file a crash left enabled: Disable (dsec down,
// dsec purge, the next dsec up) turns it off with swapoff(2) and removes
// the file and the record. The host's vm.swappiness and other global
// settings are never touched.
//
// Invariants: a file is removed only when the record names it and its
// device and inode are those recorded (or, for a crash between making it
// and recording its inode, it was made after the record was written), so
// a file of the host's own at the path is never taken; a swap file that is
// on always has a record.
package swap

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// MinSize is the smallest swap file Enable makes.
const MinSize = 16 << 20

// Spec is a swap file to provision: dsec up's --swap FILE:SIZE.
type Spec struct {
	// Path is the file's absolute path; it must not exist (or be the one
	// the record names).
	Path string
	// Size is its size in bytes, rounded down to whole pages.
	Size int64
}

// Validate checks s: an absolute, clean path and a size of at least
// MinSize.
func (s Spec) Validate() error {
	switch {
	case s.Path == "" || !filepath.IsAbs(s.Path) || filepath.Clean(s.Path) != s.Path:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "swap file %q: give an absolute path", s.Path)
	case strings.ContainsAny(s.Path, " \t\n\\"):
		// /proc/swaps escapes them; a plain name keeps it readable.
		return errdefs.Newf(errdefs.ErrInvalidArgument, "swap file %q: use a path without spaces or backslashes", s.Path)
	case s.Size < MinSize:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "swap file size %d: give at least %d MiB", s.Size, MinSize>>20)
	}
	return nil
}

// Record is what the state directory keeps of the swap file dsec made
// (<state-dir>/swap.json).
type Record struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
	// Dev and Ino name the file once made (zero before: a crash between
	// the record and the file).
	Dev uint64 `json:"dev,omitempty"`
	Ino uint64 `json:"ino,omitempty"`
	// Created is when the record was first written.
	Created time.Time `json:"created"`
}

// Status is the swap file of a state directory as the host has it.
type Status struct {
	// Record is the record; its Path is empty when there is none.
	Record Record
	// Active: the host swaps to the file now; Used is how much of it.
	Active bool
	Used   int64
}

// RecordPath is where a state directory's record is kept.
func RecordPath(stateDir string) string { return filepath.Join(stateDir, "swap.json") }

// ReadRecord reads the record of stateDir; ok is false when there is none.
func ReadRecord(stateDir string) (rec Record, ok bool, err error) {
	b, err := os.ReadFile(RecordPath(stateDir))
	if errors.Is(err, fs.ErrNotExist) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("read swap record: %w", err)
	}
	err = json.Unmarshal(b, &rec)
	if err == nil && rec.Path == "" {
		err = errors.New("it names no swap file")
	}
	if err != nil {
		return Record{}, false, errdefs.Newf(errdefs.ErrFailedPrecondition,
			"swap record %s is damaged (%v): turn off the swap file it names by hand (swapoff), then remove the record", RecordPath(stateDir), err)
	}
	return rec, true, nil
}

// SwapEntry is one line of /proc/swaps.
type SwapEntry struct {
	Path       string
	Type       string
	Size, Used int64 // bytes
	Priority   int
}

// ParseSwaps parses the text of /proc/swaps (octal escapes in names are
// decoded).
func ParseSwaps(text string) ([]SwapEntry, error) {
	var out []SwapEntry
	for i, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) == 0 {
			continue // the header
		}
		if len(f) < 5 {
			return nil, fmt.Errorf("/proc/swaps line %d: %q: too few fields", i+1, line)
		}
		var e SwapEntry
		e.Path, e.Type = unescape(f[0]), f[1]
		var size, used int64
		if _, err := fmt.Sscan(f[2], &size); err != nil {
			return nil, fmt.Errorf("/proc/swaps line %d: size %q", i+1, f[2])
		}
		if _, err := fmt.Sscan(f[3], &used); err != nil {
			return nil, fmt.Errorf("/proc/swaps line %d: used %q", i+1, f[3])
		}
		if _, err := fmt.Sscan(f[4], &e.Priority); err != nil {
			return nil, fmt.Errorf("/proc/swaps line %d: priority %q", i+1, f[4])
		}
		e.Size, e.Used = size<<10, used<<10
		out = append(out, e)
	}
	return out, nil
}

// unescape decodes the \ooo escapes the kernel writes for space, tab,
// newline and backslash in /proc/swaps names.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) && isOctal(s[i+1:i+4]) {
			v := (s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0')
			b.WriteByte(v)
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(s string) bool {
	if len(s) != 3 {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '7' {
			return false
		}
	}
	return true
}
