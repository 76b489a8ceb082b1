package sandboxfs

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// fileState is what a test compares of a file.
type fileState struct {
	Mode      fs.FileMode
	UID, GID  uint32
	Size      int64
	Data      string // sha256 of a regular file's data
	Link      string // a symlink's target
	MTime     int64  // nanoseconds
	Ino       uint64
	LinkGroup string // for an inode with more than one name: its first name
}

// snapshot describes every file under dir, by path relative to dir
// (dir itself is "."). It does not descend into other mounts (their
// mount points are described) nor into skip.
func snapshot(t *testing.T, dir string, skip ...string) map[string]fileState {
	t.Helper()
	var rootSt unix.Stat_t
	if err := unix.Lstat(dir, &rootSt); err != nil {
		t.Fatal(err)
	}
	out := map[string]fileState{}
	byIno := map[uint64][]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if slices.Contains(skip, rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		s := fileState{
			Mode: fileMode(st.Mode), UID: st.Uid, GID: st.Gid, Size: st.Size,
			MTime: st.Mtim.Nano(), Ino: st.Ino,
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			s.Data = hex.EncodeToString(sum[:])
		case unix.S_IFLNK:
			if s.Link, err = os.Readlink(p); err != nil {
				return err
			}
		case unix.S_IFDIR:
			s.Size = 0
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Nlink > 1 {
			byIno[st.Ino] = append(byIno[st.Ino], rel)
		}
		out[rel] = s
		if d.IsDir() && st.Dev != rootSt.Dev {
			return filepath.SkipDir // another mount
		}
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", dir, err)
	}
	for _, names := range byIno {
		if len(names) < 2 {
			continue
		}
		slices.Sort(names)
		for _, n := range names {
			s := out[n]
			s.LinkGroup = names[0]
			out[n] = s
		}
	}
	return out
}
