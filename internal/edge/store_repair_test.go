package edge

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// fakeBoot points the store's boot id and boot time at files of the test's.
func fakeBoot(t *testing.T, id string, btime time.Time) {
	t.Helper()
	dir := t.TempDir()
	oldID, oldTime := bootIDPath, btimePath
	t.Cleanup(func() { bootIDPath, btimePath = oldID, oldTime })
	bootIDPath, btimePath = filepath.Join(dir, "boot_id"), filepath.Join(dir, "stat")
	if err := os.WriteFile(bootIDPath, []byte(id+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(btimePath, fmt.Appendf(nil, "cpu  1 2 3\nbtime %d\nprocesses 9\n", btime.Unix()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// fillStore writes n sandbox records (padded, so they span many pages).
func fillStore(t *testing.T, path string, n int) {
	t.Helper()
	s, err := openStore(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if s.repaired != "" {
		t.Fatalf("a new file was repaired: %s", s.repaired)
	}
	for i := range n {
		r := &Record{ID: fmt.Sprintf("n-%012d", i), Image: "busybox:latest", Project: "default", State: StateRunning,
			Labels: map[string]string{"pad": strings.Repeat("x", 300)}, CreatedAt: time.Now().UTC()}
		if err := s.insert(r); err != nil {
			t.Fatal(err)
		}
	}
}

func listIDs(t *testing.T, s *store) int {
	t.Helper()
	rs, err := s.list()
	if err != nil {
		t.Fatalf("list after open = %v", err)
	}
	for _, r := range rs {
		if !strings.HasPrefix(r.ID, "n-") || r.Image != "busybox:latest" {
			t.Fatalf("a record read back is not one written: %+v", r)
		}
	}
	return len(rs)
}

func damagedFiles(t *testing.T, path string) []string {
	m, err := filepath.Glob(path + ".damaged-*")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestStoreRebuiltAfterReboot: an intact file from an earlier boot is
// rebuilt with every record; in the same boot it is opened as is.
func TestStoreRebuiltAfterReboot(t *testing.T) {
	fakeBoot(t, "boot-a", time.Now().Add(-time.Hour))
	path := filepath.Join(t.TempDir(), "edge.db")
	fillStore(t, path, 50)
	if b, _ := os.ReadFile(path + ".boot"); strings.TrimSpace(string(b)) != "boot-a" {
		t.Fatalf("boot marker = %q, want boot-a", b)
	}

	s, err := openStore(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	if s.repaired != "" {
		t.Errorf("same boot: repaired = %q, want nothing", s.repaired)
	}
	s.close()

	fakeBoot(t, "boot-b", time.Now().Add(-time.Minute))
	s, err = openStore(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if !strings.Contains(s.repaired, "rebuilt it from its 50 sandbox records") {
		t.Errorf("after a reboot: repaired = %q, want a rebuild of 50 records", s.repaired)
	}
	if n := listIDs(t, s); n != 50 {
		t.Errorf("records after the rebuild = %d, want 50", n)
	}
	if d := damagedFiles(t, path); len(d) != 0 {
		t.Errorf("an intact file was kept as damaged: %v", d)
	}
	if b, _ := os.ReadFile(path + ".boot"); strings.TrimSpace(string(b)) != "boot-b" {
		t.Errorf("boot marker = %q, want boot-b", b)
	}
}

// TestStoreDamagedAfterReboot damages a file the way a power loss can (the
// pages a meta page points to never written, or the meta pages torn): the
// edge still starts, on what could be read, the damaged file is kept, and
// the store works.
func TestStoreDamagedAfterReboot(t *testing.T) {
	page := int64(os.Getpagesize())
	for _, tc := range []struct {
		name     string
		from, to int64 // pages overwritten with garbage (to 0: the end)
		someKept bool  // only one leaf of the records: some survive
	}{
		{"data pages", 2, 0, false},
		{"meta pages", 0, 2, false},
		{"one leaf", 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fakeBoot(t, "boot-a", time.Now().Add(-time.Hour))
			path := filepath.Join(t.TempDir(), "edge.db")
			fillStore(t, path, 200)
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			from, to := tc.from, tc.to
			if to == 0 {
				to = fi.Size() / page
			}
			if tc.someKept {
				leaves := leafPages(t, path)
				from, to = leaves[len(leaves)-2], leaves[len(leaves)-2]+1
			}
			garbage := []byte(strings.Repeat("\xa5\x5a\xff\x00", int(page)/4))
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			for p := from; p < to; p++ {
				if _, err := f.WriteAt(garbage, p*page); err != nil {
					t.Fatal(err)
				}
			}
			f.Close()

			// In the boot that wrote it, a damaged file is refused, never
			// dropped: its records may describe running sandboxes.
			// (On a copy: bbolt's mapping of a file it panicked on stays,
			// and with it the file's lock, until the process exits, as a
			// dsec up that fails here does.)
			same := filepath.Join(t.TempDir(), "edge.db")
			copyFile(t, path, same)
			copyFile(t, path+".boot", same+".boot")
			s, err := openStore(same, 0)
			if err == nil {
				listErr := func() (err error) {
					defer func() {
						if p := recover(); p != nil {
							err = fmt.Errorf("panic: %v", p)
						}
					}()
					_, err = s.list()
					return err
				}()
				s.close()
				if listErr == nil {
					t.Fatal("the damage did not damage the file: the test proves nothing")
				}
			} else if !strings.Contains(err.Error(), "move it aside") {
				t.Errorf("same boot: open = %v, want it to say what to do", err)
			}
			if d := damagedFiles(t, same); len(d) != 0 {
				t.Fatalf("same boot: the file was moved aside: %v", d)
			}
			if d := damagedFiles(t, path); len(d) != 0 {
				t.Fatalf("same boot: the file was moved aside: %v", d)
			}

			fakeBoot(t, "boot-b", time.Now().Add(-time.Minute))
			s, err = openStore(path, 0)
			if err != nil {
				t.Fatalf("open after a reboot = %v, want a rebuilt file", err)
			}
			defer s.close()
			if !strings.Contains(s.repaired, "damaged") {
				t.Errorf("repaired = %q, want it to say the file was damaged", s.repaired)
			}
			t.Log(s.repaired)
			if d := damagedFiles(t, path); len(d) != 1 {
				t.Errorf("damaged files kept = %v, want one", d)
			}
			if n := listIDs(t, s); n > 200 || tc.someKept && n == 0 {
				t.Errorf("records = %d of 200 written", n)
			}
			if err := s.insert(&Record{ID: "n-new000000000", Image: "busybox:latest", State: StateCreating}); err != nil {
				t.Errorf("insert into the rebuilt file = %v", err)
			}
		})
	}
}

// TestStoreWithoutBootMarker: a file of a dsec before the marker counts as
// older than this boot when it was modified before the host booted.
func TestStoreWithoutBootMarker(t *testing.T) {
	fakeBoot(t, "boot-a", time.Now().Add(-time.Hour))
	path := filepath.Join(t.TempDir(), "edge.db")
	fillStore(t, path, 3)
	if err := os.Remove(path + ".boot"); err != nil {
		t.Fatal(err)
	}
	s, err := openStore(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	if s.repaired != "" {
		t.Errorf("modified after boot: repaired = %q, want nothing", s.repaired)
	}
	s.close()

	os.Remove(path + ".boot")
	fakeBoot(t, "boot-b", time.Now().Add(time.Minute)) // booted after the file's last change
	s, err = openStore(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if !strings.Contains(s.repaired, "3 sandbox records") {
		t.Errorf("modified before boot: repaired = %q, want a rebuild of 3 records", s.repaired)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// leafPages lists the leaf pages of a store's file.
func leafPages(t *testing.T, path string) []int64 {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, PreLoadFreelist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var leaves []int64
	if err := db.View(func(tx *bolt.Tx) error {
		for id := 2; ; id++ {
			info, err := tx.Page(id)
			if err != nil {
				return err
			}
			if info == nil {
				return nil
			}
			if info.Type == "leaf" {
				leaves = append(leaves, int64(id))
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	if len(leaves) < 4 {
		t.Fatalf("leaf pages = %v, want several", leaves)
	}
	return leaves
}
