package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/singleflight"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// KeyPrefix is the etcd key prefix of everything Store writes.
const KeyPrefix = "/dsec/v1/"

// schemaVersion is the "version" field of every value Store writes. A reader
// refuses values of a newer version.
const schemaVersion = 1

// Defaults of StoreConfig.
const (
	DefaultNodeTTL     = 10 * time.Second
	DefaultKeyCacheTTL = 30 * time.Second
)

// StoreConfig configures a Store. The zero value works.
type StoreConfig struct {
	// NodeTTL is how long a node stays listed after its edge stops renewing
	// its registration. Default DefaultNodeTTL. etcd rounds it up to whole
	// seconds and to its minimum lease TTL (2 s with default etcd settings).
	NodeTTL time.Duration
	// KeyCacheTTL is the longest Authenticate, GetProject and
	// GetImageCached trust what they read about an API key, a project or an
	// image while a CacheWatch runs; without one, RevocationWindow. Either
	// way a change through another Store (another apiserver) is seen within
	// RevocationWindow (cache.go). Default DefaultKeyCacheTTL.
	KeyCacheTTL time.Duration
	// Logger receives what registrations do in the background (a lost lease
	// renewed). Nil discards it.
	Logger *slog.Logger
}

// Store reads and writes dsec's cluster state in etcd. It works over the
// client of an Embedded or over a client of an external etcd cluster. Its
// methods are safe for concurrent use. Store starts no goroutines; a
// Registration and a CacheWatch do.
type Store struct {
	c       *clientv3.Client
	prefix  string // KeyPrefix; tests use their own
	nodeTTL time.Duration
	lg      *slog.Logger
	now     func() time.Time

	fresh     freshness // what the CacheWatch confirmed
	keys      cache[keyCacheEntry]
	keyLookup singleflight.Group // one etcd read per key ID at a time
	projects  cache[Project]
	images    cache[imageCacheEntry]
	lookup    singleflight.Group // one etcd read per project or image at a time
}

// NewStore returns a Store over c. The caller keeps ownership of c.
func NewStore(c *clientv3.Client, cfg StoreConfig) *Store {
	s := &Store{
		c:       c,
		prefix:  KeyPrefix,
		nodeTTL: cfg.NodeTTL,
		lg:      cfg.Logger,
		now:     time.Now,
	}
	if s.nodeTTL <= 0 {
		s.nodeTTL = DefaultNodeTTL
	}
	if s.lg == nil {
		s.lg = slog.New(slog.DiscardHandler)
	}
	ttl := cfg.KeyCacheTTL
	if ttl <= 0 {
		ttl = DefaultKeyCacheTTL
	}
	s.keys.ttl, s.keys.fresh = ttl, &s.fresh
	s.projects.ttl, s.projects.fresh = ttl, &s.fresh
	s.images.ttl, s.images.fresh = ttl, &s.fresh
	return s
}

// Key layout, below s.prefix.
func (s *Store) nodesPrefix() string           { return s.prefix + "nodes/" }
func (s *Store) nodeKey(name string) string    { return s.nodesPrefix() + name }
func (s *Store) layersPrefix() string          { return s.prefix + "layers/" }
func (s *Store) layerKey(digest string) string { return s.layersPrefix() + digest }
func (s *Store) imagesPrefix() string          { return s.prefix + "images/" }
func (s *Store) imageKey(r Ref) string         { return s.imagesPrefix() + r.String() }
func (s *Store) keysPrefix() string            { return s.prefix + "keys/" }
func (s *Store) apiKeyKey(id string) string    { return s.keysPrefix() + id }
func (s *Store) projectsPrefix() string        { return s.prefix + "projects/" }
func (s *Store) projectKey(name string) string { return s.projectsPrefix() + name }

// etcdError is an etcd failure classified with an errdefs kind. It unwraps
// to both, so errors.Is finds the kind and the etcd error.
type etcdError struct {
	op   string
	kind error
	err  error
}

func (e *etcdError) Error() string   { return e.op + ": cluster state (etcd): " + e.err.Error() }
func (e *etcdError) Unwrap() []error { return []error{e.kind, e.err} }

// storeErr wraps an error returned by the etcd client with op and a kind.
func storeErr(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", op, err)
	}
	code := status.Code(err)
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		code = ee.Code()
	}
	var kind error
	switch code {
	case codes.DeadlineExceeded:
		kind = errdefs.ErrDeadlineExceeded
	case codes.Canceled:
		return fmt.Errorf("%s: %w", op, context.Canceled)
	case codes.ResourceExhausted:
		kind = errdefs.ErrResourceExhausted // the etcd space quota: compact and defragment
	case codes.Unavailable, codes.Unknown, codes.Aborted:
		kind = errdefs.ErrUnavailable
	default:
		kind = errdefs.ErrInternal
	}
	return &etcdError{op: op, kind: kind, err: err}
}

// encode marshals a record; records carry their own version field.
func encode(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		// Records are plain structs of strings, numbers, slices and maps.
		panic(fmt.Sprintf("cluster: encode %T: %v", v, err))
	}
	return string(b)
}

// decode unmarshals the value stored at key into v after checking its
// schema version.
func decode(key string, data []byte, v any) error {
	var hdr struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal(data, &hdr); err != nil {
		return errdefs.Newf(errdefs.ErrInternal, "cluster state: value at %s is not valid JSON: %v", key, err)
	}
	switch {
	case hdr.Version == 0:
		return errdefs.Newf(errdefs.ErrInternal, "cluster state: value at %s has no version", key)
	case hdr.Version > schemaVersion:
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"cluster state: %s was written by a newer dsec (schema version %d, this dsec reads %d): upgrade this dsec",
			key, hdr.Version, schemaVersion)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return errdefs.Newf(errdefs.ErrInternal, "cluster state: value at %s: %v", key, err)
	}
	return nil
}

// list decodes every value under prefix with dec, in key order.
func list[T any](ctx context.Context, s *Store, op, prefix string, dec func(key string, val []byte) (T, error)) ([]T, error) {
	resp, err := s.c.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, storeErr(op, err)
	}
	out := make([]T, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		v, err := dec(string(kv.Key), kv.Value)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		out = append(out, v)
	}
	return out, nil
}
