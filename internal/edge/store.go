package edge

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// formatVersion is the layout of the edge's bbolt file. A file of a newer
// format is refused; older ones are migrated on open.
//
//	1: records, idempotency keys.
//	2: the pause states (pausing, paused, resuming) and the records'
//	   pause fields. Format 1 files need no change (their records never
//	   paused); a dsec of format 1, which would not know a paused
//	   sandbox (it would hide it, frozen, and never end it), refuses a
//	   file of format 2.
const formatVersion = 2

var (
	bucketMeta      = []byte("meta")
	bucketSandboxes = []byte("sandboxes")
)

// Record is what the edge keeps of one sandbox; it is the node's durable
// truth about sandboxes (the keeper holds processes, not records).
type Record struct {
	ID        string            `json:"id"`
	Image     string            `json:"image"`
	Layers    []sandbox.Layer   `json:"layers"`
	Labels    map[string]string `json:"labels,omitempty"`
	Project   string            `json:"project"`
	Backend   string            `json:"backend"`
	State     State             `json:"state"`
	Reason    string            `json:"reason,omitempty"`
	Resources sandbox.Resources `json:"resources"`
	// ImageEnv is the image's environment; Env the sandbox's own on top.
	ImageEnv  []string          `json:"image_env,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Workdir   string            `json:"workdir,omitempty"`
	User      string            `json:"user,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	ExpiresAt time.Time         `json:"expires_at"`
	IdleTTL   time.Duration     `json:"idle_ttl"`
	// TTLStopped is when the hard TTL clock stopped (state.go); zero
	// while it runs.
	TTLStopped time.Time `json:"ttl_stopped,omitzero"`
	// EndEvent is the event published when a deleting record is removed
	// (deleted, ttl_expired, or none for a create that failed).
	EndEvent string `json:"end_event,omitempty"`
	// Grader marks a GradeFrom's grading sandbox, which lives only as long
	// as the call: one found when the edge starts is deleted.
	Grader bool `json:"grader,omitempty"`
	// Network is the sandbox's network policy, netpolicy's JSON document
	// as validated; empty is none (loopback only).
	Network json.RawMessage `json:"network,omitempty"`

	// Pause (format 2; pause.go). PausedTTL bounds the time it may stay
	// paused, from PausedAt (zero: DefaultPausedTTL). IdleAction is what
	// an expired idle TTL does: IdleDelete (also when empty) or
	// IdlePause.
	PausedTTL  time.Duration `json:"paused_ttl,omitempty"`
	IdleAction string        `json:"idle_action,omitempty"`
	// PausedAt is when its last pause ended (it is paused since); zero
	// once it runs again.
	PausedAt time.Time `json:"paused_at,omitzero"`
	// Resident and Swapped are where its memory was when its last pause
	// or resume returned: in RAM, and out of it in the node's swap. While
	// it is paused admission holds only Resident (state.go, memHeld).
	Resident int64 `json:"resident,omitempty"`
	Swapped  int64 `json:"swapped,omitempty"`
	// Rollout is the rollout the sandbox is a member of (rollout.go), set
	// when the rollout makes it and never changed.
	Rollout string `json:"rollout,omitempty"`
}

type store struct {
	db *bolt.DB

	// syncEvery is the store's durability (openStore). With syncEvery > 0
	// writes are flushed every syncEvery by a goroutine the store owns.
	syncEvery time.Duration
	dirty     atomic.Bool
	stop      chan struct{}
	done      chan struct{}
	// repaired says what openStore did to a file written before the host
	// last booted (empty: nothing); the edge logs it.
	repaired string
}

// defaultFlushEvery is how often the default mode flushes the node state.
const defaultFlushEvery = 100 * time.Millisecond

// openStore opens the node state. syncEvery chooses how commits reach the
// disk (docs/architecture.md, Node state, has the measurements and the
// reasoning):
//
//   - 0, the default: no fsync per commit, a flush every 100 ms. A commit
//     is in the page cache when its call returns, so a crash of dsec up
//     (or kill -9) loses nothing. A power loss or kernel crash can lose
//     the last changes and, as bbolt's meta pages may reach the disk
//     before the pages they point to, damage the file; but it also ends
//     every sandbox the records describe. So a file last written before
//     this boot is rebuilt on open from what it still holds (repair).
//   - > 0: the same, flushed every syncEvery.
//   - < 0: fsync'd group commit. Concurrent writes are joined into one
//     transaction and one fsync (bbolt's Batch, at most batchDelay
//     apart); each write is on disk when its call returns.
func openStore(path string, syncEvery time.Duration) (*store, error) {
	if syncEvery == 0 {
		syncEvery = defaultFlushEvery
	}
	unlock, err := lockState(path)
	if err != nil {
		return nil, err
	}
	repaired, err := repairAfterBoot(path)
	if err != nil {
		unlock()
		return nil, err
	}
	db, err := openBolt(path, false)
	unlock()
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, errdefs.Newf(errdefs.ErrAlreadyExists, "%s is locked: another dsec edge runs on this state directory", path)
		}
		return nil, fmt.Errorf("open node state %s: %w (if it is damaged, move it aside: the edge then starts afresh and removes the sandboxes it no longer knows)", path, err)
	}
	db.MaxBatchDelay = batchDelay
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if v := meta.Get([]byte("format")); v != nil {
			var n int
			if err := json.Unmarshal(v, &n); err != nil {
				return fmt.Errorf("node state format: %w", err)
			}
			if n > formatVersion {
				return errdefs.Newf(errdefs.ErrFailedPrecondition, "node state %s has format %d, newer than this dsec (%d): upgrade dsec", path, n, formatVersion)
			}
		}
		if err := meta.Put([]byte("format"), []byte(fmt.Sprint(formatVersion))); err != nil {
			return err
		}
		_, err = tx.CreateBucketIfNotExists(bucketSandboxes)
		return err
	})
	if err == nil {
		// The file is now known good in this boot.
		err = markBoot(path)
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	st := &store{db: db, syncEvery: syncEvery, repaired: repaired}
	if syncEvery > 0 {
		db.NoSync = true
		st.stop, st.done = make(chan struct{}), make(chan struct{})
		go st.syncLoop()
	}
	return st, nil
}

// openBolt opens path; a file bbolt panics (or faults) on is an error,
// and the descriptor it had opened is closed, so its lock goes with it.
func openBolt(path string, readOnly bool) (db *bolt.DB, err error) {
	var f *os.File
	opts := &bolt.Options{Timeout: 2 * time.Second, ReadOnly: readOnly,
		OpenFile: func(name string, flag int, mode os.FileMode) (*os.File, error) {
			var err error
			f, err = os.OpenFile(name, flag, mode)
			return f, err
		}}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			if f != nil {
				f.Close()
			}
			db, err = nil, fmt.Errorf("%w: %v", errDamaged, p)
		}
	}()
	return bolt.Open(path, 0o600, opts)
}

// errDamaged is a file bbolt could not read.
var errDamaged = errors.New("the file is damaged")

func (s *store) syncLoop() {
	defer close(s.done)
	t := time.NewTicker(s.syncEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		if s.dirty.Swap(false) {
			_ = s.db.Sync()
		}
	}
}

// batchDelay is how long a write waits for others to join its group
// commit (bbolt's default is 10 ms; a write waits for an fsync in flight
// anyway, and the writes that arrive meanwhile join the next one).
var batchDelay = 500 * time.Microsecond

// updateTx runs fn in a read-write transaction and returns once it is as
// durable as the store's mode makes it. fn may run more than once (a
// group commit reruns it alone when another write of its group fails), so
// it must only read and write the transaction and variables it sets anew.
func (s *store) updateTx(fn func(*bolt.Tx) error) error {
	if s.syncEvery < 0 {
		return s.db.Batch(fn)
	}
	err := s.db.Update(fn)
	if err == nil {
		s.dirty.Store(true)
	}
	return err
}

func (s *store) close() error {
	if s.stop != nil {
		close(s.stop)
		<-s.done
		_ = s.db.Sync()
	}
	return s.db.Close()
}

// insert adds a record that must not exist yet.
func (s *store) insert(r *Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return s.updateTx(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketSandboxes)
		if bk.Get([]byte(r.ID)) != nil {
			return errdefs.Newf(errdefs.ErrAlreadyExists, "sandbox %s exists", r.ID)
		}
		return bk.Put([]byte(r.ID), b)
	})
}

func (s *store) get(id string) (*Record, error) {
	var r *Record
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketSandboxes).Get([]byte(id))
		if v == nil {
			return errdefs.Newf(errdefs.ErrNotFound, "sandbox %s not found: it was deleted or never existed (list sandboxes with `dsec ps`)", id)
		}
		r = new(Record)
		return json.Unmarshal(v, r)
	})
	return r, err
}

func (s *store) list() ([]*Record, error) {
	var out []*Record
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).ForEach(func(_, v []byte) error {
			r := new(Record)
			if err := json.Unmarshal(v, r); err != nil {
				return err
			}
			out = append(out, r)
			return nil
		})
	})
	return out, err
}

// update applies fn to a record atomically.
func (s *store) update(id string, fn func(*Record) error) (*Record, error) {
	var r *Record
	err := s.updateTx(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketSandboxes)
		v := bk.Get([]byte(id))
		if v == nil {
			return errdefs.Newf(errdefs.ErrNotFound, "sandbox %s not found", id)
		}
		r = new(Record)
		if err := json.Unmarshal(v, r); err != nil {
			return err
		}
		if err := fn(r); err != nil {
			return err
		}
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		return bk.Put([]byte(id), b)
	})
	return r, err
}
