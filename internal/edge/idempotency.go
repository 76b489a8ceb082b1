package edge

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"hash/fnv"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/dsecproject/dsec/internal/errdefs"
)

var bucketIdempotency = []byte("idempotency")

// idempotencyTTL is how long a key is remembered (CONTRACT.md: 24 h).
const idempotencyTTL = 24 * time.Hour

// idemEntry remembers what a key created.
type idemEntry struct {
	Hash      string    `json:"hash"`
	SandboxID string    `json:"sandbox_id"`
	Created   time.Time `json:"created"`
	// Snapshot is the sandbox as created, returned once it is deleted.
	Snapshot Record `json:"snapshot"`
}

// idemLocks serialises creates that share a key (striped, so unrelated
// keys rarely wait for each other).
type idemLocks [256]sync.Mutex

func (l *idemLocks) lock(key string) func() {
	h := fnv.New32a()
	h.Write([]byte(key))
	m := &l[h.Sum32()%uint32(len(l))]
	m.Lock()
	return m.Unlock
}

// requestHash identifies a create request (labels and env maps are
// encoded with sorted keys, so equal requests hash equal).
func requestHash(p CreateParams) string {
	b, _ := json.Marshal(p)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func idemKey(caller Caller, key string) []byte {
	return []byte(caller.KeyID + "\x00" + key)
}

func (s *store) getIdem(k []byte) (*idemEntry, error) {
	var e *idemEntry
	err := s.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketIdempotency)
		if bk == nil {
			return nil
		}
		v := bk.Get(k)
		if v == nil {
			return nil
		}
		e = new(idemEntry)
		return json.Unmarshal(v, e)
	})
	return e, err
}

func (s *store) putIdem(k []byte, e *idemEntry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return s.updateTx(func(tx *bolt.Tx) error {
		bk, err := tx.CreateBucketIfNotExists(bucketIdempotency)
		if err != nil {
			return err
		}
		return bk.Put(k, b)
	})
}

// expireIdem drops keys older than the TTL.
func (s *store) expireIdem(now time.Time) error {
	return s.updateTx(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketIdempotency)
		if bk == nil {
			return nil
		}
		var old [][]byte
		err := bk.ForEach(func(k, v []byte) error {
			var e idemEntry
			if json.Unmarshal(v, &e) != nil || now.Sub(e.Created) > idempotencyTTL {
				old = append(old, append([]byte(nil), k...))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range old {
			if err := bk.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
}

// replay answers a retried create from its entry.
func (e *Edge) replay(ent *idemEntry, hash, key string) (*Record, error) {
	if ent.Hash != hash {
		return nil, errdefs.Newf(errdefs.ErrFailedPrecondition,
			"idempotency key %q was used for a different create request: use a new key for a new request", key)
	}
	if r, err := e.store.get(ent.SandboxID); err == nil {
		return r, nil
	}
	snap := ent.Snapshot
	snap.State = StateDeleting
	snap.Reason = "deleted since it was created"
	return &snap, nil
}

var errWatchBehind = errdefs.Newf(errdefs.ErrUnavailable, "the watch fell behind and was cut: list the sandboxes and watch again")
