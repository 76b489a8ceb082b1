package edge

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/atomicfile"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// The node state is written without an fsync per commit (openStore), so a
// power loss or kernel crash may leave edge.db damaged. The same event ends
// every sandbox its records describe, so what the file holds after it is
// history; what must not happen is an edge that cannot start, or that
// starts on pages bbolt half wrote. So a file last written before this
// boot is rebuilt into a fresh one from every record it still yields (a
// clean restart rebuilds an intact file, which costs a few milliseconds
// once per boot), and a damaged file is kept beside it for a post-mortem.
//
// The boot a file was last opened in is in <file>.boot; a file without one
// (written before it existed) counts as older than this boot when it was
// last modified before the host booted.

// bootIDPath is this boot's random id; btimePath has the boot time.
var (
	bootIDPath = "/proc/sys/kernel/random/boot_id"
	btimePath  = "/proc/stat"
)

func currentBoot() (string, error) {
	b, err := os.ReadFile(bootIDPath)
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(string(b))
	if id == "" {
		return "", fmt.Errorf("%s is empty", bootIDPath)
	}
	return id, nil
}

func bootTime() (time.Time, error) {
	b, err := os.ReadFile(btimePath)
	if err != nil {
		return time.Time{}, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return time.Time{}, err
			}
			return time.Unix(n, 0), nil
		}
	}
	return time.Time{}, fmt.Errorf("no btime in %s", btimePath)
}

// lockState takes <path>.lock for the repair and the open that follows, so
// two edges started at once on one state dir do not both rebuild it; the
// returned function releases it (bbolt's own lock then guards the file).
func lockState(path string) (func(), error) {
	f, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { _ = f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, errdefs.Newf(errdefs.ErrAlreadyExists, "%s is locked: another dsec edge is starting on this state directory", path)
			}
			return nil, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// repairAfterBoot rebuilds path if it was last written before this boot,
// and says what it did (empty: nothing).
func repairAfterBoot(path string) (string, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	cur, err := currentBoot()
	if err != nil {
		return "", fmt.Errorf("node state: this boot's id: %w", err)
	}
	prev, err := os.ReadFile(path + ".boot")
	switch {
	case err == nil:
		if strings.TrimSpace(string(prev)) == cur {
			return "", nil
		}
	case errors.Is(err, fs.ErrNotExist):
		bt, err := bootTime()
		if err != nil || !fi.ModTime().Before(bt) {
			return "", nil
		}
	default:
		return "", err
	}
	return rebuild(path)
}

// markBoot records that path is good in this boot.
func markBoot(path string) error {
	cur, err := currentBoot()
	if err != nil {
		return fmt.Errorf("node state: this boot's id: %w", err)
	}
	if b, err := os.ReadFile(path + ".boot"); err == nil && strings.TrimSpace(string(b)) == cur {
		return nil
	}
	return atomicfile.WriteFile(path+".boot", []byte(cur+"\n"), 0o600)
}

// entry is one key and value of a bucket of the node state.
type entry struct{ k, v []byte }

// salvage reads every bucket's keys and values from a file that may be
// damaged: bbolt panics (or faults) on some damage, which ends the read
// with what it gave so far. Values that are not what their bucket holds
// are counted as lost. damage is nil when the whole file read cleanly.
func salvage(path string) (data map[string][]entry, lost int, damage, err error) {
	data = map[string][]entry{}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	var db *bolt.DB
	defer func() {
		if p := recover(); p != nil {
			damage = fmt.Errorf("reading it failed: %v", p)
		}
		if db != nil {
			func() {
				defer func() { _ = recover() }()
				db.Close()
			}()
		}
	}()
	db, err = openBolt(path, true)
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, 0, nil, errdefs.Newf(errdefs.ErrAlreadyExists, "%s is locked: another dsec edge runs on this state directory", path)
	}
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) && !errors.Is(err, errDamaged) {
			return nil, 0, nil, err
		}
		// bbolt found no valid meta page, the file is no bbolt file, or
		// reading it panicked.
		return data, 0, err, nil
	}
	damage = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			bucket := string(name)
			return b.ForEach(func(k, v []byte) error {
				if v == nil {
					return nil // a nested bucket: the node state has none
				}
				if !validEntry(bucket, k, v) {
					lost++
					return nil
				}
				data[bucket] = append(data[bucket], entry{bytes.Clone(k), bytes.Clone(v)})
				return nil
			})
		})
	})
	return data, lost, damage, nil
}

// validEntry says whether a salvaged value is what its bucket holds.
func validEntry(bucket string, k, v []byte) bool {
	switch bucket {
	case string(bucketSandboxes):
		var r Record
		return json.Unmarshal(v, &r) == nil && r.ID == string(k)
	case string(bucketIdempotency):
		return json.Valid(v)
	}
	return true
}

// rebuild writes what path still holds into a fresh file that replaces it.
func rebuild(path string) (string, error) {
	data, lost, damage, err := salvage(path)
	if err != nil {
		return "", err
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".rebuild-*")
	if err != nil {
		return "", err
	}
	tmp := f.Name()
	f.Close()
	os.Remove(tmp) // bbolt makes the file itself
	fail := func(err error) (string, error) {
		os.Remove(tmp)
		return "", fmt.Errorf("rebuild node state %s: %w", path, err)
	}
	dst, err := bolt.Open(tmp, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return fail(err)
	}
	records := 0
	err = dst.Update(func(tx *bolt.Tx) error {
		for name, entries := range data {
			b, err := tx.CreateBucketIfNotExists([]byte(name))
			if err != nil {
				return err
			}
			for _, e := range entries {
				if err := b.Put(e.k, e.v); err != nil {
					return err
				}
			}
			if name == string(bucketSandboxes) {
				records = len(entries)
			}
		}
		return nil
	})
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fail(err)
	}
	kept := ""
	if damage != nil || lost > 0 {
		kept = fmt.Sprintf("%s.damaged-%d", path, time.Now().Unix())
		if err := os.Rename(path, kept); err != nil {
			return fail(err)
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	if err := atomicfile.SyncDir(dir); err != nil {
		return "", err
	}
	if kept == "" {
		return fmt.Sprintf("the host restarted since the node state was last written: rebuilt it from its %d sandbox records (of sandboxes that ended with the restart)", records), nil
	}
	why := "some records did not decode"
	if damage != nil {
		why = damage.Error()
	}
	return fmt.Sprintf("the host restarted since the node state was last written, and the file was damaged (%s): rebuilt it from the %d sandbox records still readable (%d unreadable, all of sandboxes that ended with the restart); the damaged file is kept as %s", why, records, lost, kept), nil
}
