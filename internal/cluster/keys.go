package cluster

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dsecproject/dsec/internal/atomicfile"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/lazyregexp"
	"github.com/dsecproject/dsec/internal/project"
)

// API key secrets are KeySecretPrefix followed by 40 characters of lowercase
// base32 (200 random bits). The first 8 of those are the key's public ID.
const (
	KeySecretPrefix = "dsk_"
	keySecretChars  = 40
	keyIDChars      = 8
	// DefaultProject is the project of a key created without one.
	DefaultProject = "default"
	// AdminKeyName is the name of the key EnsureAdminKey creates.
	AdminKeyName = "admin"
)

var keyEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// KeySpec describes an API key to create.
type KeySpec struct {
	// Name helps people recognise the key; at most 128 printable characters.
	Name string
	// Project the key acts in; DefaultProject when empty.
	Project string
	// Admin keys may manage keys, nodes and every project.
	Admin bool
	// ExpiresIn is how long the key works from its creation; 0: forever.
	ExpiresIn time.Duration
}

// Key is an API key as the platform sees it; its secret is never stored.
type Key struct {
	// ID is the first 8 characters of the secret after its prefix; it is
	// safe to show and log.
	ID        string
	Name      string
	Project   string
	Admin     bool
	CreatedAt time.Time
	// ExpiresAt is when the key stops working; zero: never.
	ExpiresAt time.Time
	// Sandbox, when set, makes this a sandbox's own key (dsec-api): the
	// API for sandboxes makes it for each call of that sandbox's
	// connections; it is never stored.
	Sandbox string
	// Rollout, set with Sandbox, is the rollout that sandbox is a member
	// of: the key then acts on that rollout's members and status only.
	Rollout string
}

// Principal is who the key acts as.
func (k Key) Principal() Principal { return Principal{Project: k.Project, Admin: k.Admin} }

type keyRecord struct {
	Version   int       `json:"version"`
	ID        string    `json:"id"`
	Name      string    `json:"name,omitempty"`
	Project   string    `json:"project"`
	Admin     bool      `json:"admin,omitempty"`
	SHA256    string    `json:"sha256"` // hex SHA-256 of the whole secret
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
}

func (r keyRecord) key() Key {
	return Key{ID: r.ID, Name: r.Name, Project: r.Project, Admin: r.Admin, CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt}
}

// MaxKeyLifetime bounds KeySpec.ExpiresIn.
const MaxKeyLifetime = 100 * 365 * 24 * time.Hour

var projectRE = lazyregexp.New(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

func validateKeySpec(spec KeySpec) error {
	if spec.ExpiresIn < 0 || spec.ExpiresIn > MaxKeyLifetime {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "key lifetime %s: give a positive duration of at most 100 years, or none for a key that never expires", spec.ExpiresIn)
	}
	if len(spec.Name) > 128 || strings.ContainsFunc(spec.Name, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "invalid key name %.80q: use at most 128 printable characters", spec.Name)
	}
	if !projectRE.MatchString(spec.Project) {
		return errdefs.Newf(errdefs.ErrInvalidArgument,
			"invalid project %q: use lowercase letters, digits and '-', at most 63 characters", spec.Project)
	}
	if project.Reserved(spec.Project) {
		return errdefs.Newf(errdefs.ErrInvalidArgument,
			"project %q is reserved for the platform's own services (names starting with %q): choose another name", spec.Project, project.ReservedPrefix)
	}
	return nil
}

// parseSecret checks a secret's form and returns its ID.
func parseSecret(secret string) (id string, ok bool) {
	rest, ok := strings.CutPrefix(secret, KeySecretPrefix)
	if !ok || len(rest) != keySecretChars || !isKeyChars(rest) {
		return "", false
	}
	return rest[:keyIDChars], true
}

func validKeyID(id string) bool { return len(id) == keyIDChars && isKeyChars(id) }

// isKeyChars reports whether s is all lowercase base32.
func isKeyChars(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || '2' <= c && c <= '7') {
			return false
		}
	}
	return true
}

func newSecret() string {
	b := make([]byte, keySecretChars*5/8)
	rand.Read(b) // never fails (crypto/rand panics instead)
	return KeySecretPrefix + keyEncoding.EncodeToString(b)
}

func secretHash(secret string) [sha256.Size]byte { return sha256.Sum256([]byte(secret)) }

// CreateKey creates an API key and returns its secret, which is shown only
// now: only its SHA-256 is stored.
func (s *Store) CreateKey(ctx context.Context, spec KeySpec) (secret string, _ Key, _ error) {
	if spec.Project == "" {
		spec.Project = DefaultProject
	}
	if err := validateKeySpec(spec); err != nil {
		return "", Key{}, err
	}
	for range 5 { // an ID collision (1 in 2^40 per existing key) takes another secret
		secret := newSecret()
		k, created, err := s.putKey(ctx, secret, spec)
		if err != nil {
			return "", Key{}, err
		}
		if created {
			return secret, k, nil
		}
	}
	return "", Key{}, errdefs.Newf(errdefs.ErrInternal, "create key: no free key ID after 5 tries")
}

// putKey stores secret's key unless its ID is taken.
func (s *Store) putKey(ctx context.Context, secret string, spec KeySpec) (Key, bool, error) {
	id, _ := parseSecret(secret)
	sum := secretHash(secret)
	now := s.now().UTC()
	rec := keyRecord{
		Version: schemaVersion, ID: id, Name: spec.Name, Project: spec.Project, Admin: spec.Admin,
		SHA256: hex.EncodeToString(sum[:]), CreatedAt: now,
	}
	if spec.ExpiresIn > 0 {
		rec.ExpiresAt = now.Add(spec.ExpiresIn)
	}
	key := s.apiKeyKey(id)
	txn, err := s.c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, encode(rec))).
		Commit()
	if err != nil {
		return Key{}, false, storeErr("create key", err)
	}
	if txn.Succeeded {
		s.keys.forget(id)
	}
	return rec.key(), txn.Succeeded, nil
}

// errBadKey is what every failed authentication returns, whatever the
// reason, so a caller learns nothing about which keys exist.
var errBadKey = errdefs.Newf(errdefs.ErrUnauthenticated,
	"invalid API key: get one with `dsec key create`, or use the admin key in the state directory (admin.key)")

// Authenticate returns the key whose secret this is, or Unauthenticated
// (saying so when the key expired). What it reads from etcd is cached (see
// cache.go): a key revoked through any Store is refused within
// RevocationWindow.
func (s *Store) Authenticate(ctx context.Context, secret string) (Key, error) {
	id, ok := parseSecret(secret)
	if !ok {
		return Key{}, errBadKey
	}
	sum := secretHash(secret)
	e, ok := s.keys.get(id, s.now())
	if !ok {
		if err := ctx.Err(); err != nil {
			return Key{}, fmt.Errorf("authenticate: %w", err)
		}
		// Concurrent misses on one ID share a read, which therefore does not
		// run under any one caller's context; each caller still stops
		// waiting when its own context is done.
		ch := s.keyLookup.DoChan(id, func() (any, error) {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keyLookupTimeout)
			defer cancel()
			return s.lookupKey(ctx, id)
		})
		select {
		case r := <-ch:
			if r.Err != nil {
				return Key{}, r.Err
			}
			e = r.Val.(keyCacheEntry)
		case <-ctx.Done():
			return Key{}, fmt.Errorf("authenticate: %w", ctx.Err())
		}
	}
	if !e.found || subtle.ConstantTimeCompare(e.sum[:], sum[:]) != 1 {
		return Key{}, errBadKey
	}
	// Only the holder of the secret learns that it expired.
	if exp := e.key.ExpiresAt; !exp.IsZero() && !s.now().Before(exp) {
		return Key{}, errdefs.Newf(errdefs.ErrUnauthenticated,
			"API key %s expired at %s: ask an administrator for a new one (`dsec key create --expires DURATION`)", id, exp.UTC().Format(time.RFC3339))
	}
	return e.key, nil
}

// keyLookupTimeout bounds one etcd read of an API key.
const keyLookupTimeout = 10 * time.Second

// lookupKey reads key id from etcd into the cache. Unknown IDs are not
// cached, so a key created elsewhere works at once.
func (s *Store) lookupKey(ctx context.Context, id string) (keyCacheEntry, error) {
	gen := s.keys.generation()
	readAt := s.now()
	key := s.apiKeyKey(id)
	resp, err := s.c.Get(ctx, key)
	if err != nil {
		return keyCacheEntry{}, storeErr("authenticate", err)
	}
	if len(resp.Kvs) == 0 {
		return keyCacheEntry{}, nil
	}
	var rec keyRecord
	if err := decode(key, resp.Kvs[0].Value, &rec); err != nil {
		return keyCacheEntry{}, fmt.Errorf("authenticate: %w", err)
	}
	e := keyCacheEntry{key: rec.key(), found: true}
	if b, err := hex.DecodeString(rec.SHA256); err != nil || copy(e.sum[:], b) != sha256.Size {
		return keyCacheEntry{}, errdefs.Newf(errdefs.ErrInternal, "authenticate: key %s has a malformed hash", id)
	}
	s.keys.put(id, e, readAt, gen)
	return e, nil
}

// ListKeys returns every API key, by ID.
func (s *Store) ListKeys(ctx context.Context) ([]Key, error) {
	return list(ctx, s, "list keys", s.keysPrefix(), func(key string, val []byte) (Key, error) {
		var rec keyRecord
		err := decode(key, val, &rec)
		return rec.key(), err
	})
}

// DeleteKey deletes the API key with id, or returns NotFound.
func (s *Store) DeleteKey(ctx context.Context, id string) error {
	_, err := s.RevokeKey(ctx, id)
	return err
}

// RevokeKey deletes the API key with id and returns it as it was, or
// returns NotFound. This Store refuses the key at once; other Stores within
// RevocationWindow (cache.go).
func (s *Store) RevokeKey(ctx context.Context, id string) (Key, error) {
	if !validKeyID(id) {
		return Key{}, errdefs.Newf(errdefs.ErrInvalidArgument, "invalid key ID %.80q: want 8 characters a-z, 2-7 (the ID column of `dsec key ls`)", id)
	}
	defer s.keys.forget(id)
	key := s.apiKeyKey(id)
	resp, err := s.c.Delete(ctx, key, clientv3.WithPrevKV())
	if err != nil {
		return Key{}, storeErr("revoke key "+id, err)
	}
	if resp.Deleted == 0 || len(resp.PrevKvs) == 0 {
		return Key{}, errdefs.Newf(errdefs.ErrNotFound, "key %s not found: list keys with `dsec key ls`", id)
	}
	var rec keyRecord
	if err := decode(key, resp.PrevKvs[0].Value, &rec); err != nil {
		return Key{ID: id}, nil // deleted all the same
	}
	return rec.key(), nil
}

// EnsureAdminKey makes sure an admin key exists and its secret is in the file
// at path, and returns the secret. If the file exists, its secret is
// registered as an admin key (again: the etcd data may have been lost). If
// not, a new admin key is created and written there atomically with mode
// 0600, its directory created 0700 if missing.
func (s *Store) EnsureAdminKey(ctx context.Context, path string) (string, error) {
	for range 3 {
		secret, err := s.readAdminKey(ctx, path)
		if !errors.Is(err, fs.ErrNotExist) {
			return secret, err
		}
		secret, err = s.createAdminKey(ctx, path)
		if !errors.Is(err, fs.ErrExist) {
			return secret, err
		}
		// Another process wrote the file first; register its secret.
	}
	return "", errdefs.Newf(errdefs.ErrUnavailable, "admin key %s: the file keeps appearing and disappearing; retry", path)
}

// readAdminKey registers the secret in the file at path; fs.ErrNotExist when
// there is no file.
func (s *Store) readAdminKey(ctx context.Context, path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		return "", fmt.Errorf("admin key: %w", err)
	}
	secret := strings.TrimSpace(string(data))
	if _, ok := parseSecret(secret); !ok {
		return "", errdefs.Newf(errdefs.ErrFailedPrecondition,
			"admin key file %s does not hold a dsec key: remove it to have a new admin key created", path)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		s.lg.Warn("admin key file readable by others; restricting it to its owner", "path", path, "mode", fi.Mode().Perm().String())
		if err := os.Chmod(path, 0o600); err != nil {
			return "", fmt.Errorf("admin key: %w", err)
		}
	}
	if err := s.registerAdminKey(ctx, secret); err != nil {
		return "", fmt.Errorf("admin key %s: %w", path, err)
	}
	return secret, nil
}

// registerAdminKey makes secret an admin key; idempotent.
func (s *Store) registerAdminKey(ctx context.Context, secret string) error {
	id, _ := parseSecret(secret)
	sum := secretHash(secret)
	key := s.apiKeyKey(id)
	defer s.keys.forget(id)
	for range 10 {
		resp, err := s.c.Get(ctx, key)
		if err != nil {
			return storeErr("register admin key", err)
		}
		var modRev int64
		rec := keyRecord{
			Version: schemaVersion, ID: id, Name: AdminKeyName, Project: DefaultProject,
			SHA256: hex.EncodeToString(sum[:]), CreatedAt: s.now().UTC(),
		}
		if len(resp.Kvs) > 0 {
			kv := resp.Kvs[0]
			if err := decode(key, kv.Value, &rec); err != nil {
				return fmt.Errorf("register admin key: %w", err)
			}
			stored, err := hex.DecodeString(rec.SHA256)
			if err != nil || subtle.ConstantTimeCompare(stored, sum[:]) != 1 {
				return errdefs.Newf(errdefs.ErrFailedPrecondition,
					"key ID %s belongs to another key: remove the admin key file to have a new admin key created", id)
			}
			if rec.Admin && rec.Version == schemaVersion {
				return nil
			}
			modRev = kv.ModRevision
		}
		rec.Admin, rec.Version = true, schemaVersion
		txn, err := s.c.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", modRev)).
			Then(clientv3.OpPut(key, encode(rec))).
			Commit()
		if err != nil {
			return storeErr("register admin key", err)
		}
		if txn.Succeeded {
			return nil
		}
	}
	return errdefs.Newf(errdefs.ErrUnavailable, "register admin key: the key changes too fast; retry")
}

// createAdminKey creates an admin key and writes it to path; fs.ErrExist
// (and no new key) when the file appeared meanwhile.
func (s *Store) createAdminKey(ctx context.Context, path string) (string, error) {
	dir := filepath.Dir(path)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return "", fmt.Errorf("admin key: %w", err)
		}
	}
	secret, k, err := s.CreateKey(ctx, KeySpec{Name: AdminKeyName, Admin: true})
	if err != nil {
		return "", fmt.Errorf("admin key: %w", err)
	}
	if err := atomicfile.Create(path, []byte(secret+"\n"), 0o600); err != nil {
		if derr := s.DeleteKey(context.WithoutCancel(ctx), k.ID); derr != nil {
			s.lg.Warn("delete unused admin key", "id", k.ID, "err", derr)
		}
		if errors.Is(err, fs.ErrExist) {
			return "", fs.ErrExist
		}
		return "", fmt.Errorf("admin key: %w", err)
	}
	return secret, nil
}

// keyCacheEntry is what Authenticate caches of a key ID.
type keyCacheEntry struct {
	key   Key
	sum   [sha256.Size]byte
	found bool
}
