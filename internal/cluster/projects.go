package cluster

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// DefaultMaxTTL is the longest hard or idle TTL of a project whose limits
// do not say (CONTRACT.md: 7 days).
const DefaultMaxTTL = 7 * 24 * time.Hour

// MaxMaxTTL is the longest maximum TTL an admin may give a project.
const MaxMaxTTL = 3650 * 24 * time.Hour

// ProjectLimits bound a project's sandboxes on all nodes together.
type ProjectLimits struct {
	// MemoryBytes bounds the sum of their memory limits; 0: no limit.
	MemoryBytes int64
	// Sandboxes bounds how many live at once; 0: no limit.
	Sandboxes int64
	// MaxTTL is the longest hard or idle TTL a create or a TTL change may
	// ask for (DefaultMaxTTL unless set).
	MaxTTL time.Duration
}

// Project is a project's settings. Every project exists: one nobody set
// limits for has the default ones.
type Project struct {
	Name   string
	Limits ProjectLimits
	// UpdatedAt is when its limits were last set; zero for the defaults.
	UpdatedAt time.Time
}

// LimitsUpdate changes some of a project's limits; nil fields keep theirs.
type LimitsUpdate struct {
	MemoryBytes *int64
	Sandboxes   *int64
	MaxTTL      *time.Duration
}

type projectRecord struct {
	Version     int       `json:"version"`
	Name        string    `json:"name"`
	MemoryBytes int64     `json:"memory_bytes,omitempty"`
	Sandboxes   int64     `json:"sandboxes,omitempty"`
	MaxTTL      string    `json:"max_ttl,omitempty"` // a Go duration
	UpdatedAt   time.Time `json:"updated_at"`
}

func (r projectRecord) project() Project {
	p := Project{Name: r.Name, UpdatedAt: r.UpdatedAt, Limits: ProjectLimits{MemoryBytes: r.MemoryBytes, Sandboxes: r.Sandboxes}}
	if d, err := time.ParseDuration(r.MaxTTL); err == nil && d > 0 {
		p.Limits.MaxTTL = d
	} else {
		p.Limits.MaxTTL = DefaultMaxTTL
	}
	return p
}

func defaultProject(name string) Project {
	return Project{Name: name, Limits: ProjectLimits{MaxTTL: DefaultMaxTTL}}
}

func validateProjectName(name string) error {
	if !projectRE.MatchString(name) {
		return errdefs.Newf(errdefs.ErrInvalidArgument,
			"invalid project %.80q: use lowercase letters, digits and '-', at most 63 characters", name)
	}
	return nil
}

// GetProject returns the project called name, with the default limits when
// none were set. What it reads is cached like API keys (cache.go): a change
// through any Store is seen within RevocationWindow.
func (s *Store) GetProject(ctx context.Context, name string) (Project, error) {
	if err := validateProjectName(name); err != nil {
		return Project{}, err
	}
	if p, ok := s.projects.get(name, s.now()); ok {
		return p, nil
	}
	ch := s.lookup.DoChan("project/"+name, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keyLookupTimeout)
		defer cancel()
		gen := s.projects.generation()
		readAt := s.now()
		p, err := s.readProject(ctx, name)
		if err != nil {
			return nil, err
		}
		s.projects.put(name, p, readAt, gen)
		return p, nil
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return Project{}, r.Err
		}
		return r.Val.(Project), nil
	case <-ctx.Done():
		return Project{}, fmt.Errorf("get project %s: %w", name, ctx.Err())
	}
}

func (s *Store) readProject(ctx context.Context, name string) (Project, error) {
	key := s.projectKey(name)
	resp, err := s.c.Get(ctx, key)
	if err != nil {
		return Project{}, storeErr("get project "+name, err)
	}
	if len(resp.Kvs) == 0 {
		return defaultProject(name), nil
	}
	var rec projectRecord
	if err := decode(key, resp.Kvs[0].Value, &rec); err != nil {
		return Project{}, fmt.Errorf("get project %s: %w", name, err)
	}
	return rec.project(), nil
}

// SetProjectLimits changes the limits of the project called name and
// returns it. Memory and sandbox limits of 0 remove the limit; MaxTTL must
// be between a second and MaxMaxTTL.
func (s *Store) SetProjectLimits(ctx context.Context, name string, u LimitsUpdate) (Project, error) {
	if err := validateProjectName(name); err != nil {
		return Project{}, err
	}
	switch {
	case u.MemoryBytes != nil && *u.MemoryBytes < 0:
		return Project{}, errdefs.Newf(errdefs.ErrInvalidArgument, "memory limit %d: give 0 (no limit) or more bytes", *u.MemoryBytes)
	case u.Sandboxes != nil && *u.Sandboxes < 0:
		return Project{}, errdefs.Newf(errdefs.ErrInvalidArgument, "sandbox limit %d: give 0 (no limit) or more", *u.Sandboxes)
	case u.MaxTTL != nil && (*u.MaxTTL < time.Second || *u.MaxTTL > MaxMaxTTL):
		return Project{}, errdefs.Newf(errdefs.ErrInvalidArgument, "maximum TTL %s: give between 1s and %s (3650 days)", *u.MaxTTL, MaxMaxTTL)
	}
	op := "set project limits " + name
	key := s.projectKey(name)
	defer s.projects.forget(name)
	for range 5 {
		resp, err := s.c.Get(ctx, key)
		if err != nil {
			return Project{}, storeErr(op, err)
		}
		p, modRev := defaultProject(name), int64(0)
		if len(resp.Kvs) > 0 {
			var rec projectRecord
			if err := decode(key, resp.Kvs[0].Value, &rec); err != nil {
				return Project{}, fmt.Errorf("%s: %w", op, err)
			}
			p, modRev = rec.project(), resp.Kvs[0].ModRevision
		}
		if u.MemoryBytes != nil {
			p.Limits.MemoryBytes = *u.MemoryBytes
		}
		if u.Sandboxes != nil {
			p.Limits.Sandboxes = *u.Sandboxes
		}
		if u.MaxTTL != nil {
			p.Limits.MaxTTL = *u.MaxTTL
		}
		p.UpdatedAt = s.now().UTC()
		rec := projectRecord{
			Version: schemaVersion, Name: name, MemoryBytes: p.Limits.MemoryBytes, Sandboxes: p.Limits.Sandboxes,
			MaxTTL: p.Limits.MaxTTL.String(), UpdatedAt: p.UpdatedAt,
		}
		txn, err := s.c.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", modRev)).
			Then(clientv3.OpPut(key, encode(rec))).
			Commit()
		if err != nil {
			return Project{}, storeErr(op, err)
		}
		if txn.Succeeded {
			return p, nil
		}
	}
	return Project{}, errdefs.Newf(errdefs.ErrUnavailable, "%s: the project keeps changing; retry", op)
}

// ListProjects returns the projects whose limits were set, by name.
func (s *Store) ListProjects(ctx context.Context) ([]Project, error) {
	return list(ctx, s, "list projects", s.projectsPrefix(), func(key string, val []byte) (Project, error) {
		var rec projectRecord
		err := decode(key, val, &rec)
		return rec.project(), err
	})
}

// imageCacheEntry is what GetImageCached caches of a NAME:TAG.
type imageCacheEntry struct {
	img   Image
	found bool
}

// GetImageCached is GetImage through a cache like API keys' (cache.go): a
// change through any Store is seen within RevocationWindow. For checks on
// every create (may this project run this image?), not for writes.
func (s *Store) GetImageCached(ctx context.Context, ref Ref) (Image, error) {
	if err := ref.validate(); err != nil {
		return Image{}, errdefs.Newf(errdefs.ErrInvalidArgument, "invalid image reference %q: %v", ref, err)
	}
	name := ref.String()
	e, ok := s.images.get(name, s.now())
	if !ok {
		ch := s.lookup.DoChan("image/"+name, func() (any, error) {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keyLookupTimeout)
			defer cancel()
			gen := s.images.generation()
			readAt := s.now()
			img, err := s.GetImage(ctx, ref)
			var e imageCacheEntry
			switch {
			case err == nil:
				e = imageCacheEntry{img: img, found: true}
			case !errdefs.Is(err, errdefs.ErrNotFound):
				return nil, err
			}
			s.images.put(name, e, readAt, gen)
			return e, nil
		})
		select {
		case r := <-ch:
			if r.Err != nil {
				return Image{}, r.Err
			}
			e = r.Val.(imageCacheEntry)
		case <-ctx.Done():
			return Image{}, fmt.Errorf("get image %s: %w", ref, ctx.Err())
		}
	}
	if !e.found {
		return Image{}, imageNotFound(ref)
	}
	return e.img, nil
}
