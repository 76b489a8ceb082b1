package edge

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/dsecproject/dsec/internal/edge/sandbox"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// formatVersion is the layout of the edge's bbolt file. A file of a newer
// format is refused; older ones are migrated on open.
const formatVersion = 1

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
	State     string            `json:"state"`
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
}

// The states the edge records (backends report running and exited).
const (
	StateCreating = "creating"
	StateRunning  = "running"
	StateExited   = "exited"
	StateFailed   = "failed"
	StateDeleting = "deleting"
)

type store struct{ db *bolt.DB }

func openStore(path string) (*store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, errdefs.Newf(errdefs.ErrAlreadyExists, "%s is locked: another dsec edge runs on this state directory", path)
		}
		return nil, fmt.Errorf("open node state %s: %w", path, err)
	}
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
	if err != nil {
		db.Close()
		return nil, err
	}
	return &store{db: db}, nil
}

func (s *store) close() error { return s.db.Close() }

// insert adds a record that must not exist yet.
func (s *store) insert(r *Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
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

func (s *store) remove(id string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).Delete([]byte(id))
	})
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
	err := s.db.Update(func(tx *bolt.Tx) error {
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
