package apiserver

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"sync"
	"time"

	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/project"
)

// ServiceKeys are the API keys of the platform's own services that run in
// the same process as the API server (the SandboxFusion API), each acting
// in a reserved project (internal/project). They live only in this
// process's memory: never stored, listed or revocable, gone when it ends.
// They are the only keys that authenticate in a reserved project: a stored
// key of one is refused, whatever made it.
type ServiceKeys struct {
	mu   sync.Mutex
	keys map[[sha256.Size]byte]cluster.Key // by SHA-256 of the secret; guarded by mu
}

// New makes a key of the service name acting in proj, which must be
// reserved, and returns its secret.
func (s *ServiceKeys) New(name, proj string) (string, error) {
	if !project.Reserved(proj) {
		return "", errdefs.Newf(errdefs.ErrInvalidArgument, "service key %s: project %q is not reserved", name, proj)
	}
	secret := cluster.KeySecretPrefix + rand.Text() + rand.Text()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil {
		s.keys = make(map[[sha256.Size]byte]cluster.Key)
	}
	s.keys[sha256.Sum256([]byte(secret))] = cluster.Key{
		ID: "service-" + name, Name: name, Project: proj, CreatedAt: time.Now().UTC(),
	}
	return secret, nil
}

func (s *ServiceKeys) lookup(secret string) (cluster.Key, bool) {
	if s == nil {
		return cluster.Key{}, false
	}
	sum := sha256.Sum256([]byte(secret))
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.keys[sum]
	return k, ok
}

// Authenticate returns the key whose secret this is: a service key, or a
// stored key of a project that is not reserved; anything else is
// Unauthenticated. It is what every API call is checked with, and what the
// platform's other listeners (the SandboxFusion API) check keys with.
func (s *Server) Authenticate(ctx context.Context, secret string) (cluster.Key, error) {
	if k, ok := s.cfg.ServiceKeys.lookup(secret); ok {
		return k, nil
	}
	k, err := s.cfg.Cluster.Authenticate(ctx, secret)
	if err != nil {
		return cluster.Key{}, err
	}
	if project.Reserved(k.Project) {
		// No stored key can be of a reserved project (CreateKey refuses
		// them); one that is anyway was not made by this platform.
		s.log.Warn("refused a stored API key of a reserved project", "key", k.ID, "project", k.Project)
		return cluster.Key{}, errdefs.Newf(errdefs.ErrUnauthenticated,
			"invalid API key: get one with `dsec key create`, or use the admin key in the state directory (admin.key)")
	}
	return k, nil
}
